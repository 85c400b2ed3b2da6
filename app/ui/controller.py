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

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from PySide6.QtCore import QObject, Signal

from app.services.attachments import Attachment, NewAttachment
from app.services.chat_ports import ChatListener
from app.services.chat_reply import ActiveReply
from app.services.chat_session import ChatSession
from app.services.chat_settings import ChatSettings, EngineBinding
from app.services.chat_store import ChatStore
from app.services.connections import ConnectionStore
from app.services.retrieval import Retriever
from app.ui.background import Background
from app.ui.chat_engine import (
    ChatEngines,
    Choice,
    LibrarySelection,
    ModelName,
    RemoteChoice,
)
from app.ui.chat_media import SentMedia
from app.ui.chat_model import ChatModel
from app.ui.tool_runner import ToolRunner
from app.ui.tool_turns import ToolTurns
from app.ui.worker import EngineHost, LoadedModel, RemoteTarget
from engine.settings import LoadParams, SamplingParams


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
        self.engines = ChatEngines(
            engine, library=library, connections=connections, model_name=model_name, parent=self
        )
        self.session = ChatSession(
            self.engines, chat, self.media, sampling=sampling, store=store, listener=_Relay(self)
        )
        self.turns: ToolTurns | None = None  # MCP tools in the chat (`use_tools`)
        self.retriever: Retriever | None = None  # the chat's documents (`use_documents`)
        self._searches: Background | None = None
        self._send_state: tuple[bool, str | None] = (False, None)  # as last told
        self.engines.attach(self.session)  # the engine thread's signals go to it
        chat.summary_edited.connect(self.session.edit_summary)

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
        """The engine the chat on screen wants (`ChatEngines.choice`)."""
        return self.engines.choice(self.session.settings)

    def load(self, path: Path, params: LoadParams) -> bool:
        """Start loading; False (with a message) while a reply is still streaming."""
        return self.session.switch(self.engines.wrap((Path(path), params)))

    def use(self, choice: Choice) -> bool:
        """Switch to the chosen engine: load a local model, or connect a remote one."""
        return self.session.switch(self.engines.wrap(choice))

    def connections_changed(self) -> None:
        self.session.connections_changed()

    def cancel_load(self) -> None:
        self.session.cancel_load()

    def eject(self) -> None:
        self.session.eject()

    def model_renamed(self) -> None:
        """The user renamed a model in the library: the loaded one shows its new name."""
        if self.loaded is not None and (named := self.engines.named(self.loaded)) != self.loaded:
            self.session.loaded = named
            self.engine_changed.emit(named)

    # -- requests from the window ----------------------------------------------------------

    def send(self, text: str, attachments: Sequence[NewAttachment] = ()) -> bool:
        return self.session.send(text, attachments, self.attachment_refusal)

    def reads(self) -> frozenset[str] | None:
        """What the engine that would answer reads besides text (`ChatEngines.reads`)."""
        return self.engines.reads(self.session.settings, self.loaded)

    def attachment_refusal(self, kind: str) -> str | None:
        """Why an attachment of `kind` cannot be sent to the engine that would answer."""
        return self.engines.refusal(kind, self.session.settings, self.loaded)

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


class _Relay(ChatListener):
    """The session's events as the controller's signals of the same names."""

    def __init__(self, c: ChatController) -> None:
        self.c = c
        for name in (
            "loading_started",
            "error",
            "notice",
            "conversations_changed",
            "context_changed",
            "context_note",
            "engine_changed",
            "streaming_reply",
        ):
            setattr(self, name, getattr(c, name).emit)
        # The chat's model tells the chat view, as it does of the messages.
        self.context_meter, self.summary_changed = c.chat.set_meter, c.chat.set_summary  # type: ignore[method-assign]

    def state_changed(self) -> None:
        self.c.busy_changed.emit(self.c.busy)
        self.c._tell_send_state()


__all__ = ["ChatController", "Choice", "LibrarySelection", "ModelName", "RemoteChoice"]
