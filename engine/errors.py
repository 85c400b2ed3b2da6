"""The engine's error types: every message is one line a user can read."""

from __future__ import annotations


class EngineError(RuntimeError):
    """Something went wrong in the engine; `str()` is a one-line message for the user."""


class LoadCancelled(EngineError):
    pass


__all__ = ["EngineError", "LoadCancelled"]
