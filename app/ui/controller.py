"""The chat's Qt adapter: a `ChatSession` (app/services/chat_session.py, the chat's behaviour,
Qt-free) wired to the engine thread and the window.

The engine thread's queued signals are forwarded to the session on the GUI thread (each
carries its reply's request id; the session drops those of an abandoned reply), and what the
session tells its listener becomes this object's signals. The session changes the chat's
messages through the `ChatModel` it is given (a `Transcript`), so the views follow. The
engine a chat wants is chosen here: its saved remote binding (built from the connections),
else the model selected in the library.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from PySide6.QtCore import QObject, Signal

from app.services.attachments import Attachment, NewAttachment
from app.services.chat_ports import ChatListener, EngineChoice, EngineInfo, Turn
from app.services.chat_reply import ActiveReply
from app.services.chat_session import ChatSession
from app.services.chat_settings import ChatSettings, EngineBinding
from app.services.chat_store import ChatStore
from app.services.connections import ConnectionStore
from app.services.retrieval import Retriever
from app.ui.background import Background
from app.ui.chat_media import SentMedia, projector_reads, refusal
from app.ui.chat_model import ChatModel
from app.ui.tool_runner import ToolRunner
from app.ui.tool_turns import ToolTurns
from app.ui.worker import EngineHost, EngineMaker, LoadedModel, RemoteTarget
from engine.errors import EngineError
from engine.host.stats import GenerationStats
from engine.rag.grounding import CountTokens, approx_tokens
from engine.settings import LoadParams, SamplingParams


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


class ChatController(QObject):
    # Every step of a reply's life (loading, listing tools, streaming, done) says whether
    # the chat is busy: a reply is on its way or a tool loop runs.
    busy_changed = Signal(bool)
    # (busy, why sending is paused or None) whenever either changes: Send is on when the
    # chat is neither (`can_send`), Stop while it is busy.
    send_state_changed = Signal(bool, object)
    loading_started = Signal(object)  # the engine being switched to: Path | RemoteTarget
    error = Signal(str)  # a message for the window's error banner
    notice = Signal(str)  # status text ("Loading SmolLM2…")
    conversations_changed = Signal()  # a conversation was created, renamed, grew...
    context_changed = Signal(int, int)  # tokens in use by this conversation, context size
    context_note = Signal(str)  # e.g. "2 old messages were left out to fit the context"
    engine_changed = Signal(object)  # the LoadedModel now in use, or None
    # The request id of the reply that streams now, before any engine signal about it; None
    # when the chat let it go unfinished. The performance panel follows it.
    streaming_reply = Signal(object)

    def __init__(
        self,
        engine: EngineHost,
        chat: ChatModel,
        *,
        library: LibrarySelection | None = None,
        connections: ConnectionStore | None = None,
        sampling: SamplingParams | None = None,
        store: ChatStore | None = None,
        model_name: ModelName | None = None,
        parent: QObject | None = None,
    ) -> None:
        """`library`: the library's selected model with its load settings, the engine of
        a chat bound to no remote one; `connections`: the saved remote engines a chat may be
        bound to; `model_name`: the library's name for a file, which a loaded model is shown
        and stored under (one name everywhere)."""
        super().__init__(parent)
        self.engine, self.chat = engine, chat
        self.library, self.connections, self.model_name = library, connections, model_name
        self.media = SentMedia()  # the bytes of sent attachments
        self.session = ChatSession(
            _Engine(self), chat, self.media, sampling=sampling, store=store, listener=_Relay(self)
        )
        self.turns: ToolTurns | None = None  # MCP tools in the chat (`use_tools`)
        self.retriever: Retriever | None = None  # the chat's documents (`use_documents`)
        self._searches: Background | None = None
        self._send_state: tuple[bool, str | None] = (False, None)  # as last told
        w = engine.worker
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
        ):
            signal.connect(slot)

    def use_tools(self, runner: ToolRunner) -> ToolTurns:
        """Offer the chat's MCP tools to the model (a model loaded on this computer)."""
        self.turns = ToolTurns(runner, self.chat)
        self.session.use_tools(self.turns)
        return self.turns

    def use_documents(self, retriever: Retriever) -> None:
        """Ground the answers of chats that name collections in their passages."""
        self.retriever, self._searches = retriever, Background(self)
        self.session.use_documents(retriever, self._searches)

    def close_documents(self) -> None:
        """At shutdown, before the retriever's models are freed: wait for a search."""
        if self._searches is not None:
            self._searches.wait()

    # -- the session's state, as the window reads it ------------------------------------------

    @property
    def store(self) -> ChatStore | None:
        return self.session.store

    @store.setter
    def store(self, store: ChatStore | None) -> None:
        self.session.store = store

    @property
    def sampling(self) -> SamplingParams:
        return self.session.sampling

    @sampling.setter
    def sampling(self, sampling: SamplingParams) -> None:
        self.session.sampling = sampling

    @property
    def chat_settings(self) -> dict[str, Any]:
        """The chat on screen's settings, as the store keeps them."""
        return self.session.settings.to_stored()

    @property
    def loaded(self) -> LoadedModel | None:
        return cast(LoadedModel | None, self.session.loaded)

    @property
    def loading(self) -> Path | RemoteTarget | None:
        return cast(Path | RemoteTarget | None, self.session.loading)

    @property
    def reply(self) -> ActiveReply | None:
        """The reply on its way, if any."""
        return self.session.reply

    @property
    def reply_row(self) -> int | None:
        return self.session.reply_row

    @property
    def busy(self) -> bool:
        return self.session.busy

    @property
    def can_send(self) -> bool:
        return self.session.can_send

    @property
    def paused(self) -> str | None:
        return self.session.paused

    @property
    def conversation_id(self) -> int | None:
        return self.session.conversation_id

    @property
    def structured_schema(self) -> dict[str, Any] | None:
        """The JSON schema this chat's answers follow, None for free text."""
        return self.session.settings.schema

    def sampling_for_chat(self) -> SamplingParams:
        """The chat's sampling with its structured output's grammar (GrammarError)."""
        return self.session.prompt.sampling(self.session.sampling, self.session.settings)

    def _messages_for_model(self) -> list[dict[str, Any]]:
        return self.session.prompt.messages(self.session.settings, self.session.loaded)

    def set_paused(self, reason: str | None) -> None:
        """Pause the chat while a benchmark runs: Send is off with `reason`."""
        self.session.paused = reason
        self._tell_send_state()

    def _tell_send_state(self) -> None:
        state = (self.busy, self.paused)
        if state != self._send_state:
            self._send_state = state
            self.send_state_changed.emit(*state)

    # -- the chat's engine -----------------------------------------------------------------

    def chosen_engine(self) -> Choice | None:
        """The engine the chat on screen wants: its remote binding (saved with the
        conversation), else the library's selected model with its load settings."""
        binding, conns = self.session.settings.engine, self.connections
        if binding is not None and conns is not None:
            name, model = binding.connection, binding.model
            # Built in the engine thread: reading the key may wait on the keyring.
            return RemoteChoice(
                RemoteTarget(name, model), make=lambda: conns.engine(name, model or None)
            )
        return self.library() if self.library is not None else None

    def _choice(self, choice: Choice) -> EngineChoice:
        if isinstance(choice, RemoteChoice):
            label = f"Connecting to {choice.target}…"
            return EngineChoice(choice.target, label, remote=True, target=choice)
        path = Path(choice[0])
        name = self.model_name(path) if self.model_name is not None else None
        return EngineChoice(path, f"Loading {name or path.name}…", target=choice)

    def load(self, path: Path, params: LoadParams) -> bool:
        """Start loading; False (with a message) while a reply is still streaming."""
        return self.session.switch(self._choice((Path(path), params)))

    def use(self, choice: Choice) -> bool:
        """Switch to the chosen engine: load a local model, or connect a remote one."""
        return self.session.switch(self._choice(choice))

    def connections_changed(self) -> None:
        self.session.connections_changed()

    def cancel_load(self) -> None:
        self.session.cancel_load()

    def eject(self) -> None:
        self.session.eject()

    def model_renamed(self) -> None:
        """The user renamed a model in the library: the loaded one shows its new name."""
        if self.loaded is not None and (named := self._named(self.loaded)) != self.loaded:
            self.session.loaded = named
            self.engine_changed.emit(named)

    def _named(self, info: LoadedModel) -> LoadedModel:
        """The loaded model under the library's name for its file."""
        if info.remote is not None or self.model_name is None:
            return info
        name = self.model_name(info.path)
        return dataclasses.replace(info, name=name) if name and name != info.name else info

    # -- requests from the window ----------------------------------------------------------

    def send(self, text: str, attachments: Sequence[NewAttachment] = ()) -> bool:
        return self.session.send(text, attachments, self.attachment_refusal)

    def reads(self) -> frozenset[str] | None:
        """What the engine that would answer reads besides text ("image", "audio"); None
        when no engine would (no model selected nor loaded)."""
        choice = self.chosen_engine()
        if isinstance(choice, RemoteChoice):
            return frozenset()
        if choice is not None and self.session.needs_switch(self._choice(choice)):
            return projector_reads(choice[1].mmproj)
        if self.loaded is None:
            return None
        return self.loaded.media if self.loaded.remote is None else frozenset()

    def attachment_refusal(self, kind: str) -> str | None:
        """Why an attachment of `kind` cannot be sent to the engine that would answer, in
        one line (None: it can)."""
        reads = self.reads()
        if reads is None:
            return "Select a model in the library first"
        if not reads and isinstance(self.chosen_engine(), RemoteChoice):
            return (
                "Attachments go to a model on this computer: choose This computer above the "
                "chat to send images or audio"
            )
        return refusal(kind, reads)

    def attachment_data(self, a: Attachment) -> bytes | None:
        """A sent attachment's bytes, for its thumbnail (None: the file is gone)."""
        return self.session.attachment_data(a)

    def set_chat_settings(self, settings: ChatSettings | dict[str, Any]) -> None:
        if not isinstance(settings, ChatSettings):
            settings = ChatSettings.from_stored(settings)
        self.session.set_settings(settings)

    def set_engine(self, binding: dict[str, str] | None) -> None:
        self.session.set_engine(EngineBinding.from_stored(binding))

    # The rest of the chat's requests are the session's own.
    def stop(self) -> None:
        self.session.stop()

    def new_chat(self) -> None:
        self.session.new_chat()

    def open_conversation(self, conversation_id: int) -> None:
        self.session.open_conversation(conversation_id)

    def regenerate(self, row: int) -> bool:
        return self.session.regenerate(row)

    def edit(self, row: int, text: str) -> bool:
        return self.session.edit(row, text)

    def continue_reply(self, row: int) -> bool:
        return self.session.continue_reply(row)

    def switch_branch(self, row: int, step: int) -> bool:
        return self.session.switch_branch(row, step)

    def delete_message(self, row: int) -> bool:
        return self.session.delete_message(row)

    def detach_store(self) -> None:
        self.session.detach_store()

    # -- the engine thread's signals, on the GUI thread ------------------------------------------

    def _on_loaded(self, info: LoadedModel) -> None:
        self.session.engine_loaded(self._named(info))

    def _on_load_cancelled(self) -> None:
        self.session.load_cancelled()

    def _on_unloaded(self) -> None:
        self.session.unloaded()

    def _on_started(self, rid: int, prompt_tokens: int) -> None:
        self.session.started(rid, prompt_tokens)

    def _on_trimmed(self, dropped: int) -> None:
        self.session.trimmed(dropped)

    def _on_tokens(self, rid: int, text: str, n: int) -> None:
        self.session.tokens(rid, text, n)

    def _on_reasoning(self, rid: int, text: str, n: int) -> None:
        self.session.tokens(rid, text, n, thinking=True)

    def _on_thought(self, rid: int, tokens: int, seconds: float) -> None:
        self.session.thought(rid, tokens, seconds)

    def _on_tool_calls(self, rid: int, calls: list[dict[str, Any]]) -> None:
        self.session.tool_calls(rid, calls)

    def _on_finished(self, rid: int, stats: GenerationStats) -> None:
        self.session.finished(rid, stats)

    def _on_failed(self, rid: int, message: str) -> None:
        self.session.failed(rid, message)


class _Engine:
    """The session's engine: the engine thread's host, and the window's choice of engine."""

    def __init__(self, c: ChatController) -> None:
        self.c, self.host = c, c.engine

    def chosen(self, settings: ChatSettings) -> EngineChoice | None:
        choice = self.c.chosen_engine()
        return self.c._choice(choice) if choice is not None else None

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


class _Relay(ChatListener):
    """The session's events as the controller's signals."""

    def __init__(self, c: ChatController) -> None:
        self.c = c

    def state_changed(self) -> None:
        self.c.busy_changed.emit(self.c.busy)
        self.c._tell_send_state()

    def loading_started(self, key: Hashable) -> None:
        self.c.loading_started.emit(key)

    def error(self, message: str) -> None:
        self.c.error.emit(message)

    def notice(self, text: str) -> None:
        self.c.notice.emit(text)

    def conversations_changed(self) -> None:
        self.c.conversations_changed.emit()

    def context_changed(self, used: int, n_ctx: int) -> None:
        self.c.context_changed.emit(used, n_ctx)

    def context_note(self, text: str) -> None:
        self.c.context_note.emit(text)

    def engine_changed(self, info: EngineInfo | None) -> None:
        self.c.engine_changed.emit(info)

    def streaming_reply(self, rid: int | None) -> None:
        self.c.streaming_reply.emit(rid)


__all__ = ["ChatController", "Choice", "LibrarySelection", "ModelName", "RemoteChoice"]
