"""The port through which the server manages its models, as Ollama's `/api/pull`,
`/api/delete`, `/api/copy` and `/api/create` ask: the app implements it over its library,
Hub client and download manager (`app/services/server_models.py`) and hands it to
`ServerState`; `engine/` never sees those.

A *named model* is a name the store keeps beside the library's own ids: a pulled Hub name
(`hf.co/owner/repo:Q4_K_M`), a copy (a second name for the same file, no second copy of the
weights) or a created model (a base with its system prompt, parameters and first messages).
The host loads the file; the routes apply a created model's recipe to each request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

NamedKind = Literal["pull", "copy", "create"]
LATEST = "latest"


def full_name(name: str) -> str:
    """A name with its tag, as Ollama writes names: `mine` is `mine:latest`."""
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else f"{name}:{LATEST}"


@dataclass(frozen=True)
class NamedModel:
    name: str  # with its tag (`full_name`)
    path: Path  # the model file it names
    base: str  # the name it was made from
    kind: NamedKind
    system: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)  # Ollama's options
    messages: Sequence[Mapping[str, str]] = ()  # {role, content}, before a request's own
    license: Sequence[str] = ()
    created_at: float = 0.0

    @property
    def has_recipe(self) -> bool:
        """Whether requests must be changed to answer as this model (not a plain name)."""
        return bool(self.system or self.parameters or self.messages)


@dataclass(frozen=True)
class PullFile:
    """A file a pull downloads: its digest as Ollama writes it (`sha256:<hex>`) and size."""

    digest: str
    size: int


@dataclass(frozen=True)
class PullPlan:
    """What pulling `name` takes, found on the Hub before anything is downloaded."""

    name: str  # the name it will be listed as
    files: tuple[PullFile, ...]
    token: Any = None  # the store's own record of what to fetch


@dataclass(frozen=True)
class PullProgress:
    digest: str
    total: int
    completed: int


class StoreError(Exception):
    """A refusal, one line for the user, with the HTTP status it answers."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


# Called with the file a delete is about to remove (the server unloads the model first, or
# raises StoreError when a client of the app holds it).
BeforeRemove = Callable[[Path], None]


class ModelStore(Protocol):
    def named(self, name: str) -> NamedModel | None:
        """The named model `name` (its tag optional), or None."""
        ...

    def named_models(self) -> list[NamedModel]: ...

    def plan_pull(self, name: str) -> PullPlan:
        """Look `name` up on the Hub (blocking). StoreError: 400 for a name that is not a
        Hub name, 404 for one the Hub does not have, 403 for a gated one, 503 offline."""
        ...

    def pull(
        self, plan: PullPlan, progress: Callable[[PullProgress], None], stop: threading.Event
    ) -> NamedModel:
        """Download and verify the plan's files (blocking), calling `progress` as bytes
        arrive; `stop` set pauses the downloads (their bytes kept, resumed by the next
        pull). Returns the name it recorded; StoreError when a download failed."""
        ...

    def delete(self, name: str, before_remove: BeforeRemove) -> None:
        """Remove a name; the file too when Candlewick owns it and no other name uses it."""
        ...

    def copy(self, source: str, destination: str) -> NamedModel: ...

    def create(
        self,
        name: str,
        base: str,
        *,
        system: str | None,
        parameters: Mapping[str, Any],
        messages: Sequence[Mapping[str, str]],
        license: Sequence[str],
    ) -> NamedModel:
        """A named model over `base` (a library id or a named model, whose recipe the new
        one extends)."""
        ...


__all__ = [
    "LATEST",
    "BeforeRemove",
    "ModelStore",
    "NamedKind",
    "NamedModel",
    "PullFile",
    "PullPlan",
    "PullProgress",
    "StoreError",
    "full_name",
]
