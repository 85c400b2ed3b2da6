"""The chat's engine, for its session (app/services/chat_session.py): which engine a chat
wants (a local model with its load settings, or a remote one), and the engine thread's host
as the session's `EnginePort`. The engine's answers come back as the worker's queued
signals, forwarded here to the session on the GUI thread.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from PySide6.QtCore import QObject

from app.services.chat_ports import EngineChoice, EngineInfo, Turn
from app.services.chat_replies import ChatReplies
from app.services.chat_settings import ChatSettings
from app.services.connections import ConnectionStore
from app.ui.chat_media import projector_reads, refusal
from app.ui.worker import EngineHost, EngineMaker, LoadedModel, RemoteTarget
from engine.errors import EngineError
from engine.host.context_meter import ContextMeter
from engine.host.context_summary import Summary
from engine.host.stats import GenerationStats
from engine.rag.grounding import CountTokens, approx_tokens
from engine.settings import LoadParams


@dataclass(frozen=True)
class RemoteChoice:
    """A remote engine chosen for the chat: which one, and how to build it (in the engine
    thread; the key stays out of this object's repr)."""

    target: RemoteTarget
    make: EngineMaker = field(repr=False, compare=False)


# A local model file with its load settings (the library's selection).
LocalChoice = tuple[Path, LoadParams]
# The engine the chat on screen wants: a local model, or a remote one.
Choice = LocalChoice | RemoteChoice
# The library's current selection, if any.
LibrarySelection = Callable[[], LocalChoice | None]
# The name the library shows for a model file (None: not in the library).
ModelName = Callable[[Path], str | None]


def choice_key(choice: Choice) -> Path | RemoteTarget:
    return choice.target if isinstance(choice, RemoteChoice) else Path(choice[0])


class ChatEngines(QObject):
    """The chat session's `EnginePort`: the engine thread's host, and which engine a chat
    wants (its remote binding, built from the saved connections, else the library's
    selected model). The engine thread's queued signals reach the session through its
    slots, on the GUI thread (a plain callable connected to them would run on the engine's
    thread)."""

    def __init__(
        self,
        host: EngineHost,
        *,
        library: LibrarySelection | None = None,
        connections: ConnectionStore | None = None,
        model_name: ModelName | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.host = host
        self.library, self.connections, self.model_name = library, connections, model_name
        self.session: ChatReplies | None = None

    def attach(self, session: ChatReplies) -> None:
        """Send the engine thread's signals to `session`."""
        self.session = session
        w = self.host.worker
        for signal, slot in (
            (w.loaded, self._on_loaded),
            (w.load_cancelled, self._on_load_cancelled),
            (w.tokens, self._on_tokens),
            (w.reasoning, self._on_reasoning),
            (w.thought, self._on_thought),
            (w.finished, self._on_finished),
            (w.failed, self._on_failed),
            (w.unloaded, self._on_unloaded),
            (w.started, self._on_started),
            (w.trimmed, self._on_trimmed),
            (w.tool_calls, self._on_tool_calls),
            (w.meter, self._on_meter),
            (w.summarised, self._on_summarised),
        ):
            signal.connect(slot)

    def _s(self) -> ChatReplies:
        assert self.session is not None
        return self.session

    def _on_loaded(self, info: LoadedModel) -> None:
        self._s().engine_loaded(self.named(info))

    def _on_load_cancelled(self) -> None:
        self._s().load_cancelled()

    def _on_unloaded(self) -> None:
        self._s().unloaded()

    def _on_started(self, rid: int, prompt_tokens: int) -> None:
        self._s().started(rid, prompt_tokens)

    def _on_trimmed(self, dropped: int) -> None:
        self._s().trimmed(dropped)

    def _on_meter(self, rid: int, meter: ContextMeter) -> None:
        self._s().context_meter(rid, meter)

    def _on_summarised(self, rid: int, summary: Summary) -> None:
        self._s().summarised(rid, summary)

    def _on_tokens(self, rid: int, text: str, n: int) -> None:
        self._s().tokens(rid, text, n)

    def _on_reasoning(self, rid: int, text: str, n: int) -> None:
        self._s().tokens(rid, text, n, thinking=True)

    def _on_thought(self, rid: int, tokens: int, seconds: float) -> None:
        self._s().thought(rid, tokens, seconds)

    def _on_tool_calls(self, rid: int, calls: list[dict[str, Any]]) -> None:
        self._s().tool_calls(rid, calls)

    def _on_finished(self, rid: int, stats: GenerationStats) -> None:
        self._s().finished(rid, stats)

    def _on_failed(self, rid: int, message: str) -> None:
        self._s().failed(rid, message)

    # -- which engine ----------------------------------------------------------------------------

    def choice(self, settings: ChatSettings) -> Choice | None:
        """The engine a chat with `settings` wants: its remote binding (saved with the
        conversation), else the library's selected model with its load settings."""
        binding, conns = settings.engine, self.connections
        if binding is not None and conns is not None:
            name, model = binding.connection, binding.model
            # Built in the engine thread: reading the key may wait on the keyring.
            return RemoteChoice(
                RemoteTarget(name, model), make=lambda: conns.engine(name, model or None)
            )
        return self.library() if self.library is not None else None

    def wrap(self, choice: Choice) -> EngineChoice:
        """`choice` as the session knows it (the key a loaded engine has when it is this)."""
        if isinstance(choice, RemoteChoice):
            label = f"Connecting to {choice.target}…"
            return EngineChoice(choice.target, label, remote=True, target=choice)
        path = Path(choice[0])
        name = self.model_name(path) if self.model_name is not None else None
        return EngineChoice(path, f"Loading {name or path.name}…", target=choice)

    def chosen(self, settings: ChatSettings) -> EngineChoice | None:
        choice = self.choice(settings)
        return self.wrap(choice) if choice is not None else None

    def named(self, info: LoadedModel) -> LoadedModel:
        """A loaded model under the library's name for its file."""
        if info.remote is not None or self.model_name is None:
            return info
        name = self.model_name(info.path)
        return dataclasses.replace(info, name=name) if name and name != info.name else info

    # -- attachments ---------------------------------------------------------------------------

    def reads(self, settings: ChatSettings, loaded: LoadedModel | None) -> frozenset[str] | None:
        """What the engine that would answer reads besides text ("image", "audio"); None
        when no engine would (no model selected nor loaded)."""
        choice = self.choice(settings)
        if isinstance(choice, RemoteChoice):
            return frozenset()
        if choice is not None and (loaded is None or loaded.key != Path(choice[0])):
            return projector_reads(choice[1].mmproj)  # the model it is about to load
        if loaded is None:
            return None
        return loaded.media if loaded.remote is None else frozenset()

    def refusal(self, kind: str, settings: ChatSettings, loaded: LoadedModel | None) -> str | None:
        """Why an attachment of `kind` cannot be sent to the engine that would answer, in
        one line (None: it can)."""
        reads = self.reads(settings, loaded)
        if reads is None:
            return "Select a model in the library first"
        if not reads and isinstance(self.choice(settings), RemoteChoice):
            return (
                "Attachments go to a model on this computer: choose This computer above the "
                "chat to send images or audio"
            )
        return refusal(kind, reads)

    def start(self, choice: EngineChoice) -> None:
        target = cast(Choice, choice.target)
        if isinstance(target, RemoteChoice):
            self.host.connect_remote(target.target, target.make)
        else:
            self.host.load(*target)

    def generate(self, turn: Turn) -> int:
        return self.host.generate(
            turn.messages,
            turn.sampling,
            policy=turn.policy,
            continue_text=turn.continue_text,
            continue_thinking=turn.continue_thinking,
            thinking=turn.thinking,
            tools=turn.tools,
            tool_choice=turn.tool_choice,
            media=turn.media,
            summary=turn.summary,
            kinds=turn.kinds,
            tails=turn.tails,
        )

    def stop(self) -> None:
        self.host.stop()

    def cancel_load(self) -> None:
        self.host.cancel_load()

    def unload(self) -> None:
        self.host.unload()

    def token_counter(self, loaded: EngineInfo) -> CountTokens:
        """Counts in the chat model's tokens (a model on this computer), else an estimate."""
        info = cast(LoadedModel, loaded)
        if info.remote is not None:
            return approx_tokens
        host, key = self.host.worker.host, info.host_key

        def count(text: str) -> int:
            try:
                return len(host.get(key).tokenize(text, add_special=False, parse_special=False))
            except EngineError:  # unloaded meanwhile: its answer fails anyway
                return approx_tokens(text)

        return count

    def media_marker(self) -> str:
        from engine.native.projector import marker  # libmtmd is loaded with the projector

        return marker()


__all__ = [
    "ChatEngines",
    "Choice",
    "LibrarySelection",
    "LocalChoice",
    "ModelName",
    "RemoteChoice",
    "choice_key",
]
