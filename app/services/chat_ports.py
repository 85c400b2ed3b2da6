"""What the chat's session (app/services/chat_session.py) talks to, as small protocols: the
engine (load, answer, stop), the documents search, background work, the sent attachments'
bytes, and whoever listens to it (the window's adapter, or a test). No Qt here: the window's
implementations turn these calls into queued signals and widgets.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from app.services.attachments import Attachment, NewAttachment
from app.services.chat_settings import ChatSettings
from app.services.chat_store import ChatStore
from engine.host.context_meter import ContextMeter, Kind
from engine.host.context_policy import ContextPolicy
from engine.host.context_summary import Summary
from engine.rag.grounding import CountTokens
from engine.rag.search import Hit
from engine.settings import SamplingParams

# An attachment sent with a request: (kind "image" | "audio", its file's bytes, its name).
MediaFile = tuple[str, bytes, str]


class EngineInfo(Protocol):
    """The engine in use, as the session reads it (the engine thread's `LoadedModel`)."""

    @property
    def name(self) -> str: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def media(self) -> frozenset[str]: ...
    @property
    def remote(self) -> object | None: ...
    @property
    def key(self) -> Hashable: ...


@dataclass(frozen=True)
class EngineChoice:
    """The engine a chat wants: `key` is what a loaded engine's `key` is when it is this one
    (a model file, a remote target); `label` the status while it is being switched to;
    `target` the adapter's own description of it (the session never reads it)."""

    key: Hashable
    label: str
    remote: bool = False
    target: object = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Turn:
    """One request to the engine: the history, how to sample, and what else goes with it."""

    messages: list[dict[str, Any]]
    sampling: SamplingParams
    policy: ContextPolicy
    continue_text: str = ""
    continue_thinking: str = ""
    thinking: bool = True  # False: a reasoning model is asked not to think
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | Mapping[str, Any] = "auto"
    media: list[MediaFile] = field(default_factory=list)
    # Policy "summarise": the stored summary, sent in place of the turns it covers.
    summary: Summary | None = None
    # What the context meter calls the messages (engine.host.context_meter.measure).
    kinds: dict[int, Kind] = field(default_factory=dict)
    tails: dict[int, tuple[Kind, str]] = field(default_factory=dict)


class EnginePort(Protocol):
    """The engine, as the session drives it. Its events come back as the session's
    `engine_loaded`, `started`, `tokens`, ..., `failed`, each with the request's id."""

    def chosen(self, settings: ChatSettings) -> EngineChoice | None:
        """The engine a chat with `settings` wants: its remote binding, else the library's
        selected model (None: none)."""
        ...

    def start(self, choice: EngineChoice) -> None:
        """Start loading (or connecting to) `choice`; the old engine is freed first."""

    def generate(self, turn: Turn) -> int:
        """Start a reply; its request id."""
        ...

    def stop(self) -> None: ...
    def cancel_load(self) -> None: ...
    def unload(self) -> None: ...

    def token_counter(self, loaded: EngineInfo) -> CountTokens:
        """Counts in the loaded model's tokens (an estimate for a remote one)."""
        ...

    def media_marker(self) -> str:
        """What stands for one attachment in a message's text."""
        ...


class Searcher(Protocol):
    """A chat's documents search (app/services/retrieval.py's `Retriever`)."""

    def search(
        self, collections: Sequence[str], query: str, k: int, *, reranker: Path | None = None
    ) -> list[Hit]: ...


# `done(result, None)` or `done(None, error)`, on the session's thread.
Done = Callable[[Any, BaseException | None], None]


class Jobs(Protocol):
    """Work off the session's thread, its result delivered back on it."""

    def run(self, fn: Callable[[], Any], on_done: Done, name: str = ...) -> None: ...


class MediaKeeper(Protocol):
    """Where the bytes of sent attachments are kept (the store's files, or in memory)."""

    def keep(self, store: ChatStore | None, new: Sequence[NewAttachment]) -> list[Attachment]: ...
    def data(self, store: ChatStore | None, a: Attachment) -> bytes | None: ...


class ChatListener:
    """What the session tells whoever shows it. Every method does nothing here: a listener
    overrides those it wants."""

    def state_changed(self) -> None:
        """Busy (a reply on its way or a tool loop running) or paused may have changed."""

    def loading_started(self, key: Hashable) -> None:
        """The engine being switched to (a model file or a remote target)."""

    def error(self, message: str) -> None: ...
    def notice(self, text: str) -> None: ...

    def conversations_changed(self) -> None:
        """A conversation was created, renamed, grew..."""

    def context_changed(self, used: int, n_ctx: int) -> None: ...
    def context_note(self, text: str) -> None: ...

    def context_meter(self, meter: ContextMeter | None) -> None:
        """Where the last prompt sent went, by kind (None: nothing measured, e.g. a remote
        engine or another chat)."""

    def summary_changed(self, text: str | None) -> None:
        """The chat's summary of earlier turns (None: it has none)."""

    def engine_changed(self, info: EngineInfo | None) -> None:
        """The engine now in use, or None."""

    def streaming_reply(self, rid: int | None) -> None:
        """The request id of the reply that streams now, before any engine event about it;
        None when the chat let it go unfinished."""


__all__ = [
    "ChatListener",
    "EngineChoice",
    "EngineInfo",
    "EnginePort",
    "Jobs",
    "MediaFile",
    "MediaKeeper",
    "Searcher",
    "Turn",
]
