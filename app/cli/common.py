"""Pieces shared by the sub-commands: errors that become one-line messages, model lookup."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from app.services.chat_store import ChatStoreError
from app.services.library import LibraryError, ModelLibrary
from app.services.paths import AppPaths
from engine.errors import EngineError
from engine.model.gguf import GGUFError
from engine.model.templates import ChatTemplateError
from engine.native.load_probe import FirstLoads


class CliError(Exception):
    """A user-facing error; `str()` is the one-line message."""


USER_ERRORS: tuple[type[BaseException], ...] = (
    CliError,
    GGUFError,
    EngineError,
    LibraryError,
    ChatTemplateError,
    ChatStoreError,
    OSError,
)


def library() -> ModelLibrary:
    return ModelLibrary(AppPaths.default().models)


def first_loads() -> FirstLoads:
    """A model file's first load is tried in a child process (engine.native.load_probe)."""
    return FirstLoads(AppPaths.default().cache)


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
