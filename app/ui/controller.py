"""Chat flow between the view, the conversation model and the engine thread.

Sending loads the chosen engine first when it is not the one in use (the newcomer's path:
type, press Enter, watch it load and answer). The controller chooses it: the chat's saved
remote binding, else the model selected in the library. Engine signals are applied to the
item model here, on the GUI thread.

The reply being produced is one `ActiveReply` (app/ui/active_reply.py) with its state:
waiting for the model, for the chat's tools, or streaming. Every signal about a reply
carries its request id; one that is not the active reply's is a late signal of an abandoned
reply, and is dropped. Whether the user may send is one answer here (`can_send`: no reply
running and the chat not paused), told to the view by one signal (`send_state_changed`).

A reasoning model's thinking arrives apart from its answer (`reasoning`, `thought`) and is
stored with the message, apart from its text; it is never sent back with the history. A chat
with a "Structured output" schema (its settings' `structured_output`) is answered under that
schema's grammar, and its answers are shown as JSON.

With MCP tools (`use_tools`), each reply is offered the chat's tools; an answer that calls
some hands over to `ToolTurns` (app/ui/tool_turns.py), which asks the user, runs them and
asks for the next step here, until the model answers without calls.

With documents (`use_documents`), a chat whose settings name collections has its question
searched in them before the model runs (`ReplyState.RETRIEVING`, on a background thread);
the passages that fit the chat's budget go in the system message, numbered, and are stored
with the answer, which shows them as its sources. A failed search fails the answer with the
reason: it is never answered without its documents unnoticed. Continue gives a cut-off answer
the passages it was written from (no new search); Regenerate searches again (the index may
have changed since).

Images and audio (`send` with attachments) go to a model loaded with a projector for them
(app/ui/chat_media.py says why another cannot take them, before sending). Their files are
kept in the store before the message refers to them; every later turn sends the history's
attachments again, one marker each in their message's text (the engine reuses an image's
cache cells, so this is cheap).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from PySide6.QtCore import QObject, Signal

from app.services.attachments import Attachment, NewAttachment
from app.services.chat_store import ChatStore, ChatStoreError, StoredMessage, StreamWriter
from app.services.connections import ConnectionStore
from app.services.retrieval import Retriever
from app.ui.active_reply import ActiveReply, Parent, ReplyState
from app.ui.background import Background
from app.ui.chat_media import SentMedia, projector_reads, refusal
from app.ui.chat_model import ChatModel
from app.ui.chat_settings import (
    DOCS_BUDGET_KEY,
    DOCS_K_KEY,
    STRUCTURED_KEY,
    chat_collections,
    chat_reranker,
)
from app.ui.conversation import (
    Conversation,
    Message,
    MessageState,
    Role,
    ToolCallView,
    ToolDecision,
    ToolStatus,
)
from app.ui.engine_picker import binding_of
from app.ui.tool_runner import OfferedTool, ToolRunner
from app.ui.tool_turns import ToolTurns
from app.ui.worker import EngineHost, EngineMaker, LoadedModel, MediaFile, RemoteTarget
from engine.decoding import constraints
from engine.decoding.constraints import GrammarError
from engine.errors import EngineError
from engine.host.stats import GenerationStats
from engine.rag.grounding import (
    DEFAULT_K,
    DEFAULT_SHARE,
    CountTokens,
    Grounding,
    approx_tokens,
    budget_for,
    ground,
)
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


def _decision(value: object) -> ToolDecision:
    """A stored call's decision. One never answered (the app closed while it waited) shows
    as not answered: its loop is gone, and the model read it as cancelled."""
    return value if value in ("allowed", "always", "denied") else "cancelled"


# The context assumed for retrieval's budget when a remote engine does not tell its own.
REMOTE_CTX_GUESS = 8192


def _grounding(stored: dict[str, Any]) -> Grounding | None:
    """A stored answer's passages (None: it was not grounded)."""
    if not stored:
        return None
    try:
        return Grounding.from_dict(stored)
    except ValueError:  # written by hand into the database: shown without its sources
        return None


def _setting_int(value: object, default: int) -> int:
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default
    )


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def choice_key(choice: Choice) -> Path | RemoteTarget:
    return choice.target if isinstance(choice, RemoteChoice) else Path(choice[0])


APP_CLOSED = "The app closed before the answer ended"


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
    # when the chat let it go unfinished (New chat, another conversation). The performance
    # panel follows it, so a late signal of an abandoned reply moves nothing there either.
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
        and stored under (one name everywhere: the window, the server, the benchmark,
        exports)."""
        super().__init__(parent)
        self.store = store
        self.library = library
        self.connections = connections
        self.model_name = model_name
        # Settings of the chat on screen (system prompt, sampling, context policy, engine);
        # saved with the conversation once it is in the store.
        self.chat_settings: dict[str, Any] = {}
        # Tokens the conversation on screen takes in the context, as of its last request: the
        # context line shows it against the size of whatever model is loaded now.
        self._context_used = 0
        self._compiled: tuple[str, str] | None = None  # (schema as JSON, its grammar)
        self.engine = engine
        self.chat = chat
        self.sampling = sampling or SamplingParams()
        self.loaded: LoadedModel | None = None
        self.loading: Path | RemoteTarget | None = None  # the engine being switched to
        self._reply: ActiveReply | None = None
        # Streaming replies the chat moved away from (New chat, another conversation), by
        # request id: stopped in the engine, stored as Stop stores an answer once it ends.
        self._abandoned: dict[int, ActiveReply] = {}
        self.paused: str | None = None  # why sending is paused (a benchmark runs)
        self._send_state: tuple[bool, str | None] = (False, None)  # as last told
        self.turns: ToolTurns | None = None  # MCP tools in the chat (`use_tools`)
        self.retriever: Retriever | None = None  # the chat's documents (`use_documents`)
        self._searches: Background | None = None
        # The passages of the turn's first step: the steps after a tool's result reuse them.
        self._turn_grounding: Grounding | None = None
        self.media = SentMedia()  # the bytes of sent attachments
        w = engine.worker
        w.loaded.connect(self._on_loaded)
        w.load_cancelled.connect(self._on_load_cancelled)
        w.tokens.connect(self._on_tokens)
        w.reasoning.connect(self._on_reasoning)
        w.thought.connect(self._on_thought)
        w.finished.connect(self._on_finished)
        w.failed.connect(self._on_failed)
        w.unloaded.connect(self._on_unloaded)
        w.started.connect(self._on_started)
        w.trimmed.connect(self._on_trimmed)
        w.tool_calls.connect(self._on_tool_calls)

    def use_tools(self, runner: ToolRunner) -> ToolTurns:
        """Offer the chat's MCP tools to the model (a model loaded on this computer)."""
        turns = self.turns = ToolTurns(runner, self.chat, self)
        turns.store = self.store
        # The loop's next step: a new answer with the results in the history.
        turns.continue_requested.connect(lambda: self._run(ActiveReply()))
        turns.ended.connect(self._on_turns_ended)
        return turns

    def use_documents(self, retriever: Retriever) -> None:
        """Ground the answers of chats that name collections in their passages."""
        self.retriever = retriever
        self._searches = Background(self)

    def close_documents(self) -> None:
        """At shutdown, before the retriever's models are freed: wait for a search."""
        if self._searches is not None:
            self._searches.wait()

    # -- the reply and whether the user may send -------------------------------------------

    @property
    def reply(self) -> ActiveReply | None:
        """The reply on its way, if any."""
        return self._reply

    @property
    def reply_row(self) -> int | None:
        """The assistant message being streamed (None: none is)."""
        reply = self._reply
        return reply.row if reply is not None and reply.streaming else None

    @property
    def busy(self) -> bool:
        return self._reply is not None or (self.turns is not None and self.turns.active)

    @property
    def can_send(self) -> bool:
        return not self.busy and self.paused is None

    def set_paused(self, reason: str | None) -> None:
        """Pause the chat (while a benchmark runs, both would share the processor and skew
        its numbers): Send is off with `reason`; sends, edits, regenerations and continues
        are refused with it. None resumes."""
        self.paused = reason
        self._tell_send_state()

    def _refused(self) -> bool:
        """Sending is paused: say why, and refuse."""
        if self.paused is None:
            return False
        self.notice.emit(self.paused)
        return True

    def _busy_changed(self) -> None:
        self.busy_changed.emit(self.busy)
        self._tell_send_state()

    def _tell_send_state(self) -> None:
        state = (self.busy, self.paused)
        if state != self._send_state:
            self._send_state = state
            self.send_state_changed.emit(*state)

    def _enter(self, reply: ActiveReply, state: ReplyState) -> None:
        reply.state = state
        self._busy_changed()

    def _end(self) -> ActiveReply | None:
        """Let go of the active reply (the one place that does): later signals about it
        are dropped. The caller settles its message and says the chat is idle."""
        reply, self._reply = self._reply, None
        return reply

    def _streaming(self) -> bool:
        return self._reply is not None and self._reply.streaming

    # -- the chat's engine -----------------------------------------------------------------

    def chosen_engine(self) -> Choice | None:
        """The engine the chat on screen wants: its remote binding (saved with the
        conversation), else the library's selected model with its load settings."""
        binding = binding_of(self.chat_settings)
        conns = self.connections
        if binding is not None and conns is not None:
            name, model = binding["connection"], binding["model"]
            # Built in the engine thread: reading the key may wait on the keyring.
            return RemoteChoice(
                RemoteTarget(name, model), make=lambda: conns.engine(name, model or None)
            )
        return self.library() if self.library is not None else None

    def load(self, path: Path, params: LoadParams) -> bool:
        """Start loading; False (with a message) while a reply is still streaming."""
        if self._streaming():
            self.error.emit("Wait for the reply to finish (or press Stop) before loading")
            return False
        self.loading = Path(path)
        name = self.model_name(Path(path)) if self.model_name is not None else None
        self.notice.emit(f"Loading {name or Path(path).name}…")
        self.engine.load(path, params)
        self.loading_started.emit(Path(path))
        return True

    def use(self, choice: Choice) -> bool:
        """Switch to the chosen engine: load a local model, or connect a remote one."""
        if not isinstance(choice, RemoteChoice):
            return self.load(*choice)
        if self._streaming():
            self.error.emit("Wait for the reply to finish (or press Stop) before switching")
            return False
        self.loading = choice.target
        self.notice.emit(f"Connecting to {choice.target}…")
        self.engine.connect_remote(choice.target, choice.make)
        self.loading_started.emit(choice.target)
        return True

    def connections_changed(self) -> None:
        """The saved connections changed (a URL, a key): a remote engine in use is built
        again, from the new settings, before its next reply."""
        if self.loaded is not None and self.loaded.remote is not None:
            self.loaded = None

    def _needs_switch(self, choice: Choice | None) -> bool:
        return choice is not None and (self.loaded is None or self.loaded.key != choice_key(choice))

    def cancel_load(self) -> None:
        if self.loading is not None:
            self.engine.cancel_load()

    def eject(self) -> None:
        if self._streaming():
            self.engine.stop()
        self.engine.unload()

    # -- requests from the window ----------------------------------------------------------

    def send(self, text: str, attachments: Sequence[NewAttachment] = ()) -> bool:
        """Add the user's message (with its images and audio) and start the reply; False
        when one is still running, sending is paused, or the model cannot take an
        attachment (the window keeps what was typed and attached)."""
        if self._refused() or self.busy or not text.strip():
            return False
        choice = self.chosen_engine()
        if choice is None and self.loaded is None:
            self.error.emit("Select a model in the library first")
            return False
        for a in attachments:
            if (why := self.attachment_refusal(a.kind)) is not None:
                self.error.emit(why)
                return False
        try:
            kept = self.media.keep(self.store, attachments)
        except ChatStoreError as e:
            self.error.emit(f"The message was not sent: {e}")
            return False
        row = self.chat.append("user", text, attachments=kept)
        self._store_message(row, parent=True)
        self._new_turn()
        self._switch_then_run(ActiveReply(), choice)
        return True

    def reads(self) -> frozenset[str] | None:
        """What the engine that would answer reads besides text ("image", "audio"); None
        when no engine would (no model selected nor loaded)."""
        choice = self.chosen_engine()
        if isinstance(choice, RemoteChoice):
            return frozenset()
        if choice is not None and self._needs_switch(choice):
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
        return self.media.data(self.store, a)

    def stop(self) -> None:
        if self.turns is not None and self.turns.stop():
            return  # the tool loop ends (a running tool is cancelled first)
        reply = self._reply
        if reply is None:
            return
        if reply.streaming:
            self.engine.stop()  # it ends when the engine says so (`finished`, cancelled)
            return
        self._end()
        if reply.state is ReplyState.WAITING_FOR_MODEL:
            self.engine.cancel_load()
        self._busy_changed()

    def new_chat(self) -> None:
        self._abandon()
        self.chat_settings = {}
        self.chat.clear()
        self._show_context(0)
        self._busy_changed()

    def _abandon(self) -> None:
        if self.turns is not None:
            self.turns.abandon()
        reply = self._end()
        if reply is None:
            return
        if reply.streaming and reply.rid is not None:
            # Stopped as Stop stops it: the engine's `finished` (cancelled, with the figures
            # so far) closes its stored message, off screen (`_on_finished`).
            self.engine.stop()
            self._abandoned[reply.rid] = reply
            self.streaming_reply.emit(None)
        else:
            reply.close()  # nothing streamed: no stored answer to settle

    def _switch_then_run(self, reply: ActiveReply, choice: Choice | None) -> None:
        """Switch to the chosen engine unless it is the one in use, then run `reply`:
        sending, regenerating, editing and continuing all answer this way."""
        self._reply = reply
        if choice is not None and self._needs_switch(choice):
            self._enter(reply, ReplyState.WAITING_FOR_MODEL)
            if self.loading != choice_key(choice):
                self.use(choice)
            return  # `_on_loaded` runs it
        self._run(reply)

    def _run(self, reply: ActiveReply) -> None:
        """Run `reply` with the engine in use: continue its answer, or start a new one."""
        self._reply = reply
        if reply.continue_row is not None:
            self._stream_continuation(reply, reply.continue_row)
        else:
            self._stream_answer(reply)

    # -- conversations in the store --------------------------------------------------------

    def detach_store(self) -> None:
        """At shutdown (engine thread ended): save the answer on screen as it is, then stop
        using the store, so late queued signals cannot touch a closed database."""
        closed = {"error": APP_CLOSED}
        if self._reply is not None:
            if self._reply.streaming:  # cut by the quit: kept, marked so that Continue offers
                self._reply.close("interrupted", closed)
            else:
                self._reply.close()
        for reply in self._abandoned.values():  # the engine ended before they did
            reply.close("interrupted", closed)
        self._abandoned.clear()
        if self.turns is not None:
            self.turns.abandon()
            self.turns.store = None
        self.store = None

    @property
    def conversation_id(self) -> int | None:
        return self.chat.conversation.store_id

    def open_conversation(self, conversation_id: int) -> None:
        """Show a stored conversation (its active branch)."""
        if self.store is None:
            return
        self._abandon()
        conv = self.store.conversation(conversation_id)
        shown = Conversation(
            title=conv.title,
            store_id=conv.id,
            messages=[self._ui_message(m) for m in self.store.active_path(conv.id)],
        )
        self.chat_settings = dict(conv.settings)
        self.chat.set_conversation(shown)
        # Its last reply's prompt and answer are what the chat takes in the context.
        last = next((m.stats for m in reversed(shown.messages) if m.stats is not None), None)
        self._show_context(last.prompt_tokens + last.gen_tokens if last else 0)
        self._busy_changed()

    def _ui_message(self, m: StoredMessage) -> Message:
        states: dict[str, MessageState] = {
            "complete": "done",
            "interrupted": "interrupted",
            "error": "error",
            "streaming": "interrupted",
        }
        known = {f.name for f in dataclasses.fields(GenerationStats)}
        stats = (
            GenerationStats(**{k: v for k, v in m.stats.items() if k in known})
            if m.role == "assistant" and "gen_tokens" in m.stats
            else None
        )
        if stats is not None:  # JSON has no tuples
            stats.server_usage = tuple(stats.server_usage)
        state = states.get(m.status, "done")
        if state == "done" and stats is not None and stats.stop_reason == "cancelled":
            state = "stopped"
        role = m.role if m.role in ("system", "user", "assistant", "tool") else "user"
        calls = [
            ToolCallView(
                str(c.get("id", "")),
                str(c.get("name", "")),
                str(c.get("arguments", "")),
                str(c.get("server") or ""),
                _decision(c.get("decision")),
            )
            for c in m.tool_calls
        ]
        if m.role == "tool":  # a tool's result: its status is the stored one
            status = (
                m.status
                if m.status in ("running", "complete", "error", "denied", "cancelled")
                else "cancelled"
            )
            return Message(
                "tool",
                m.content,
                "done",
                store_id=m.id,
                tool_call_id=m.tool_call_id,
                tool_name=m.tool_name,
                tool_status=cast(ToolStatus, status),
                truncated=m.truncated,
            )
        return Message(
            cast(Role, role),
            m.content,
            state,
            stats=stats,
            tool_calls=calls,
            error=m.stats.get("error") if m.status in ("error", "interrupted") else None,
            store_id=m.id,
            branch=self.store.branch_position(m.id) if self.store else (1, 1),
            thinking=m.thinking,
            thought=(stats.thinking_tokens, stats.thinking_s)
            if stats is not None and stats.thinking_tokens
            else None,
            answer_format="json" if m.sampling.get("json_schema") is not None else "markdown",
            model=m.model if m.role == "assistant" else None,
            grounding=_grounding(m.grounding) if m.role == "assistant" else None,
            attachments=list(m.attachments),
        )

    def _ensure_conversation(self) -> int | None:
        if self.store is None:
            return None
        conv = self.chat.conversation
        if conv.store_id is None:
            conv.store_id = self.store.create_conversation(settings=self.chat_settings).id
        return conv.store_id

    def _store_message(
        self,
        row: int,
        *,
        parent: Parent,
        status: str = "complete",
        model: str | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> None:
        cid = self._ensure_conversation()
        if cid is None or self.store is None:
            return
        m = self.chat.message(row)
        stored = self.store.add_message(
            cid,
            m.role,
            m.text,
            parent_id=parent,
            status=status,
            model=model,
            sampling=sampling,
            grounding=m.grounding.to_dict() if m.grounding is not None else None,
            attachments=m.attachments,
        )
        m.store_id = stored.id
        m.branch = self.store.branch_position(stored.id)
        self.chat.refresh(row)
        self.chat.conversation.title = self.store.conversation(cid).title
        self.conversations_changed.emit()

    def set_chat_settings(self, settings: dict[str, Any]) -> None:
        """Settings for this chat (from the settings drawer); stored with the conversation.
        The chat's engine is not the drawer's business: it stays as it was."""
        engine = self.chat_settings.get("engine")
        self.chat_settings = dict(settings)
        if engine is not None and "engine" not in settings:
            self.chat_settings["engine"] = engine
        cid = self.conversation_id
        if self.store is not None and cid is not None:
            # Replaced, not merged: what the drawer no longer holds (a value back at its
            # default, a cleared schema) must not come back when the chat is opened again.
            self.store.replace_settings(cid, self.chat_settings)

    def set_engine(self, binding: dict[str, str] | None) -> None:
        """The engine this chat uses from its next reply on: None for the local model
        selected in the library, or {"connection": name, "model": id}. Saved with the
        conversation, so opening it again brings its engine back."""
        if binding:
            self.chat_settings["engine"] = dict(binding)
        else:
            self.chat_settings.pop("engine", None)
        cid = self.conversation_id
        if self.store is not None and cid is not None:
            self.store.update_settings(cid, engine=dict(binding) if binding else None)

    def sampling_for_chat(self) -> SamplingParams:
        """The chat's sampling; with a structured-output schema, its grammar (GrammarError
        when the schema cannot be used: one stored before this check, or by an import)."""
        sampling = self._free_sampling()
        schema = self.structured_schema
        if schema is None:
            return sampling
        return dataclasses.replace(sampling, grammar=self._grammar(schema))

    @property
    def structured_schema(self) -> dict[str, Any] | None:
        """The JSON schema this chat's answers follow, None for free text."""
        schema = self.chat_settings.get(STRUCTURED_KEY)
        return schema if isinstance(schema, dict) else None

    def _grammar(self, schema: dict[str, Any]) -> str:
        key = json.dumps(schema, sort_keys=True)
        if self._compiled is None or self._compiled[0] != key:
            self._compiled = (key, constraints.json_schema(schema))
        return self._compiled[1]

    def _stored_sampling(self, sampling: SamplingParams) -> dict[str, Any]:
        """What a stored answer records of its sampling: the schema it followed, not the
        compiled grammar."""
        out = dataclasses.asdict(sampling)
        out.pop("grammar", None)
        if self.structured_schema is not None:
            out["json_schema"] = self.structured_schema
        return out

    def _messages_for_model(
        self, upto: int | None = None, grounding: Grounding | None = None
    ) -> list[dict[str, Any]]:
        """The history for the model; a grounded answer's passages go in the system message,
        after the chat's own system prompt (one system message: many templates take no
        second one)."""
        conv = Conversation(self.chat.conversation.messages[:upto])
        msgs = (
            conv.for_model(self._marker(), self._sends) if self._sends_media() else conv.for_model()
        )
        system = str(self.chat_settings.get("system_prompt") or "").strip()
        if grounding is not None and grounding.text:
            system = f"{system}\n\n{grounding.text}" if system else grounding.text
        return ([{"role": "system", "content": system}] if system else []) + msgs

    def _sends_media(self) -> bool:
        info = self.loaded
        return info is not None and info.remote is None and bool(info.media)

    def _sends(self, a: Attachment) -> bool:
        """An attachment goes to the model: of a kind it reads, its file still there."""
        info = self.loaded
        return info is not None and a.kind in info.media and self.attachment_data(a) is not None

    def _marker(self) -> str:
        from engine.native.projector import marker  # libmtmd is loaded with the projector

        return marker()

    def _media_for_model(self, upto: int | None = None) -> list[MediaFile]:
        """The files the markers of `_messages_for_model(upto)` stand for, in order."""
        if not self._sends_media():
            return []
        conv = Conversation(self.chat.conversation.messages[:upto])
        return [
            (a.kind, self.attachment_data(a) or b"", a.name)
            for a in conv.media_for_model(self._sends)
        ]

    # -- branches, edits, continue ---------------------------------------------------------

    def regenerate(self, row: int) -> bool:
        """A new answer to the same question, as a sibling of the answer at `row`."""
        m = self.chat.message(row)
        if self._refused() or self.busy or m.role != "assistant":
            return False
        parent = self._stored_parent(m)
        self._truncate(row)
        self._new_turn()
        self._switch_then_run(ActiveReply(parent=parent), self.chosen_engine())
        return True

    def edit(self, row: int, text: str) -> bool:
        """Replace the user message at `row` with `text` as a new branch, and answer it."""
        m = self.chat.message(row)
        if self._refused() or self.busy or m.role != "user" or not text.strip():
            return False
        parent = self._stored_parent(m)
        self._truncate(row)
        new_row = self.chat.append("user", text, attachments=m.attachments)  # kept as sent
        self._store_message(new_row, parent=parent)
        self._new_turn()
        self._switch_then_run(ActiveReply(), self.chosen_engine())
        return True

    def continue_reply(self, row: int) -> bool:
        """Generate more of a cut-off answer (interrupted or stopped), after its text."""
        m = self.chat.message(row)
        if self._refused() or self.busy or m.role != "assistant" or row != self.chat.rowCount() - 1:
            return False
        if m.answer_format == "json":
            # The grammar would start over at the top of the schema, not where the text
            # stopped.
            self.error.emit(
                "A structured answer cannot be continued: Regenerate it (or raise Max tokens first)"
            )
            return False
        choice = self.chosen_engine()
        if isinstance(choice, RemoteChoice):
            # Chat APIs have no portable "continue this answer"; leave the answer as it is.
            self.error.emit(
                "Continue works with a local model only: choose This computer "
                "above the chat, or Regenerate to ask the server again"
            )
            return False
        if choice is None and self.loaded is None:
            self.error.emit("Select a model in the library first")
            return False
        # As with sending: load the selected model first when it is not the one loaded.
        self._switch_then_run(ActiveReply(continue_row=row), choice)
        return True

    def _stream_continuation(self, reply: ActiveReply, row: int) -> None:
        m = self.chat.message(row)
        # The passages it was written from, as stored: no new search.
        messages = self._messages_for_model(row, m.grounding)
        # Free text: a structured answer is never continued (continue_reply), so the
        # chat's schema, if it has one now, is not this answer's.
        sampling = dataclasses.replace(self._free_sampling(), grammar=None)
        reply.continued = (
            (m.stats.thinking_tokens, m.stats.thinking_s) if m.stats is not None else None
        )
        reply.row = row
        self.chat.set_state(row, "streaming")
        if self.store is not None and m.store_id is not None:
            self.store.update_message(m.store_id, status="streaming")
            reply.writer = StreamWriter(self.store, m.store_id)
            reply.writer.append(m.text)
            reply.writer.append_thinking(m.thinking)
        self._enter(reply, ReplyState.STREAMING)
        reply.rid = self.engine.generate(
            messages,
            sampling,
            policy=self._policy(),
            continue_text=m.text,
            continue_thinking=m.thinking,
            media=self._media_for_model(row),
        )
        self.streaming_reply.emit(reply.rid)

    def _free_sampling(self) -> SamplingParams:
        """The chat's sampling without its structured-output grammar."""
        known = {f.name for f in dataclasses.fields(SamplingParams)} - {"stop", "grammar"}
        return dataclasses.replace(
            self.sampling, **{k: v for k, v in self.chat_settings.items() if k in known}
        )

    def switch_branch(self, row: int, step: int) -> bool:
        """Show the previous (-1) or next (+1) alternative of the message at `row`."""
        m = self.chat.message(row)
        cid = self.conversation_id
        if self.busy or self.store is None or m.store_id is None or cid is None:
            return False
        sib = self.store.siblings(m.store_id)
        i = [s.id for s in sib].index(m.store_id) + step
        if not 0 <= i < len(sib):
            return False
        self.store.switch_branch(sib[i].id)
        self.open_conversation(cid)
        return True

    def delete_message(self, row: int) -> bool:
        """Delete the message at `row` and what follows it on this branch."""
        if self.busy:
            return False
        m = self.chat.message(row)
        cid = self.conversation_id
        if self.store is not None and m.store_id is not None and cid is not None:
            self.store.delete_message(m.store_id)
            self.open_conversation(cid)
            self.conversations_changed.emit()
        else:
            self._truncate(row)
        return True

    def _stored_parent(self, m: Message) -> int | None:
        if self.store is None or m.store_id is None:
            return None
        return self.store.message(m.store_id).parent_id

    def _truncate(self, row: int) -> None:
        conv = self.chat.conversation
        self.chat.set_conversation(
            Conversation(conv.messages[:row], conv.title, store_id=conv.store_id)
        )

    def _policy(self) -> Any:
        return "stop" if self.chat_settings.get("context_policy") == "stop" else "drop_oldest"

    # -- a new answer ----------------------------------------------------------------------

    def _new_turn(self) -> None:
        self._turn_grounding = None
        if self.turns is not None:
            self.turns.new_turn(self.chat_settings)

    def _chat_tools(self, reply: ActiveReply) -> list[OfferedTool] | None:
        """The tools for `reply` ([] for none); None: being listed (it streams once they
        are). Only a model on this computer calls tools, and not under a schema."""
        turns = self.turns
        if (
            turns is None
            or self.structured_schema is not None
            or self.loaded is None
            or self.loaded.remote is not None
        ):
            return []
        tools = turns.runner.cached(self.chat_settings)
        if tools is not None:
            return tools
        self._enter(reply, ReplyState.WAITING_FOR_TOOLS)
        self.notice.emit("Starting the chat's tool servers…")

        def ready(found: list[OfferedTool]) -> None:
            if self._reply is not reply or reply.state is not ReplyState.WAITING_FOR_TOOLS:
                return  # stopped or abandoned meanwhile
            for problem in turns.runner.problems:
                self.context_note.emit(f"Tools unavailable: {problem}")
            self._stream_answer(reply, tools=found)

        turns.runner.prepare(self.chat_settings, ready)
        return None

    # -- documents ---------------------------------------------------------------------------

    def _retrieve(self, reply: ActiveReply) -> bool:
        """Search the chat's collections for the question of `reply`; True: searching (it
        streams when the passages are in), False: nothing to wait for."""
        reply.retrieved = True
        collections = chat_collections(self.chat_settings)
        if not collections:
            return False
        if self.turns is not None and self.turns.rounds > 0:
            reply.grounding = self._turn_grounding  # a tool loop's next step: same question
            return False
        retriever, searches = self.retriever, self._searches
        if retriever is None or searches is None:
            reply.retrieval_error = "Documents are not available in this window"
            return False
        question = next(
            (m.text for m in reversed(self.chat.conversation.messages) if m.role == "user"), ""
        )
        k = _setting_int(self.chat_settings.get(DOCS_K_KEY), DEFAULT_K)
        reranker = chat_reranker(self.chat_settings)
        share = _setting_int(self.chat_settings.get(DOCS_BUDGET_KEY), round(DEFAULT_SHARE * 100))
        loaded = self.loaded
        n_ctx = (loaded.n_ctx if loaded is not None else 0) or REMOTE_CTX_GUESS
        max_tokens = self._free_sampling().max_tokens
        history = self._messages_for_model()
        count = self._token_counter()
        reply.retrieved = False
        self._enter(reply, ReplyState.RETRIEVING)
        self.notice.emit(f"Searching {', '.join(collections)}…")

        def search() -> Grounding:
            rerank = Path(reranker) if reranker is not None else None
            hits = retriever.search(collections, question, k, reranker=rerank)
            used = count("\n".join(str(m.get("content") or "") for m in history))
            budget = budget_for(n_ctx, max_tokens, used, share / 100)
            return ground(hits, count, budget, collections=collections)

        def found(result: Any, error: BaseException | None) -> None:
            if self._reply is not reply or reply.state is not ReplyState.RETRIEVING:
                return  # stopped or abandoned meanwhile
            reply.retrieved = True
            if error is not None:
                reply.retrieval_error = f"Documents: {_one_line(error)}"
            else:
                reply.grounding = self._turn_grounding = cast(Grounding, result)
                self.notice.emit(reply.grounding.summary)
            self._stream_answer(reply)

        searches.run(search, found, name="candlewick-retrieval")
        return True

    def _token_counter(self) -> CountTokens:
        """Counts in the chat model's tokens (a model on this computer), else an estimate."""
        loaded = self.loaded
        if loaded is None or loaded.remote is not None:
            return approx_tokens
        host, key = self.engine.worker.host, loaded.host_key

        def count(text: str) -> int:
            try:
                return len(host.get(key).tokenize(text, add_special=False, parse_special=False))
            except EngineError:  # unloaded meanwhile: its answer fails anyway
                return approx_tokens(text)

        return count

    def _stream_answer(self, reply: ActiveReply, *, tools: list[OfferedTool] | None = None) -> None:
        if not reply.retrieved and self._retrieve(reply):
            return  # `found` in _retrieve streams it
        if tools is None:
            # An answer that fails for its documents starts no tool servers first.
            tools = [] if reply.retrieval_error else self._chat_tools(reply)
            if tools is None:
                return  # `ready` above streams it
        messages = self._messages_for_model(grounding=reply.grounding)
        structured = self.structured_schema is not None
        problem = reply.retrieval_error
        try:
            sampling = self.sampling_for_chat()
        except GrammarError as e:  # a schema that was never checked here (an import)
            sampling, problem = self._free_sampling(), f"Structured output: {e}"
        if (
            problem is None
            and structured
            and self.loaded is not None
            and self.loaded.remote is not None
        ):
            problem = (
                "Structured output needs a model on this computer: a remote engine "
                "would not hold its answer to the schema"
            )
        model = self.loaded.name if self.loaded else None
        row = reply.row = self.chat.append(
            "assistant",
            "",
            "streaming",
            answer_format="json" if structured else "markdown",
            model=model,
            grounding=reply.grounding,
        )
        try:
            self._store_message(
                row,
                parent=reply.parent,
                status="streaming",
                model=model,
                sampling=self._stored_sampling(sampling),
            )
        except ChatStoreError as e:
            self.error.emit(f"The answer will not be saved: {e}")
        m = self.chat.message(row)
        if self.store is not None and m.store_id is not None:
            reply.writer = StreamWriter(self.store, m.store_id)
        self._enter(reply, ReplyState.STREAMING)
        if problem is not None:
            self._fail(problem)
            return
        functions, choice = None, None
        if self.turns is not None and tools:
            functions = self.turns.offer(tools)
            # The chat's `tool_choice` ("required", or a tool by name) is for the first step
            # of a turn; the steps after a tool's result may answer.
            choice = self.chat_settings.get("tool_choice") if self.turns.rounds == 0 else None
        # A grammar shapes the answer from its first token: no room for a thinking block.
        reply.rid = self.engine.generate(
            messages,
            sampling,
            policy=self._policy(),
            thinking=not structured,
            tools=functions,
            tool_choice=choice or "auto",
            media=self._media_for_model(),
        )
        self.streaming_reply.emit(reply.rid)

    # -- engine signals --------------------------------------------------------------------

    def _show_context(self, used: int) -> None:
        self._context_used = used
        self.context_changed.emit(used, self.loaded.n_ctx if self.loaded else 0)

    def _named(self, info: LoadedModel) -> LoadedModel:
        """The loaded model under the library's name for its file."""
        if info.remote is not None or self.model_name is None:
            return info
        name = self.model_name(info.path)
        return dataclasses.replace(info, name=name) if name and name != info.name else info

    def model_renamed(self) -> None:
        """The user renamed a model in the library: the loaded one shows its new name."""
        if self.loaded is not None:
            named = self._named(self.loaded)
            if named != self.loaded:
                self.loaded = named
                self.engine_changed.emit(named)

    def _waiting_for_model(self) -> ActiveReply | None:
        reply = self._reply
        return reply if reply is not None and reply.state is ReplyState.WAITING_FOR_MODEL else None

    def _on_loaded(self, info: LoadedModel) -> None:
        info = self._named(info)
        self.loaded = info
        self.loading = None
        self.engine_changed.emit(info)
        self._show_context(self._context_used)  # against the context it was loaded with
        self.notice.emit(f"Loaded {info.name}")
        reply = self._waiting_for_model()
        if reply is not None:
            self._run(reply)

    def _on_load_cancelled(self) -> None:
        self.loading = None
        self.loaded = None  # the worker frees the old model before loading a new one
        self.engine_changed.emit(None)
        self._show_context(self._context_used)  # no model: no context size to show
        self.notice.emit("Loading cancelled")
        if self._waiting_for_model() is not None:
            self._end()
            self._busy_changed()

    def _on_unloaded(self) -> None:
        self.loaded = None
        self.engine_changed.emit(None)
        self._show_context(self._context_used)
        self.notice.emit("Model ejected")

    def _mine(self, rid: int) -> ActiveReply | None:
        """The active reply if a signal with request id `rid` is about it."""
        reply = self._reply
        return reply if reply is not None and reply.is_for(rid) else None

    def _on_started(self, rid: int, prompt_tokens: int) -> None:
        if (reply := self._mine(rid)) is not None:
            reply.prompt_tokens = prompt_tokens
            self._show_context(prompt_tokens)

    def _on_trimmed(self, dropped: int) -> None:
        if self._streaming():
            self.context_note.emit(
                f"{dropped} old message{'s' if dropped != 1 else ''} left out: the "
                "conversation no longer fits the context (policy: drop oldest)"
            )

    def _on_tokens(self, rid: int, text: str, n: int) -> None:
        if (reply := self._mine(rid)) is not None and reply.row is not None:
            self.chat.append_text(reply.row, text)
            self._grown(reply, n)
            reply.write(text)
            self._report_store(reply)
        elif (gone := self._abandoned.get(rid)) is not None:
            gone.write(text)  # stored, as its figures will count it
            self._report_store(gone)

    def _on_reasoning(self, rid: int, text: str, n: int) -> None:
        if (reply := self._mine(rid)) is not None and reply.row is not None:
            self.chat.append_thinking(reply.row, text)
            self._grown(reply, n)
            reply.write(text, thinking=True)
            self._report_store(reply)
        elif (gone := self._abandoned.get(rid)) is not None:
            gone.write(text, thinking=True)
            self._report_store(gone)

    def _on_thought(self, rid: int, tokens: int, seconds: float) -> None:
        if (reply := self._mine(rid)) is not None and reply.row is not None:
            self.chat.set_thought(reply.row, *reply.thought(tokens, seconds))

    def _grown(self, reply: ActiveReply, n: int) -> None:
        # The answer takes context as it grows (the performance panel counts it too).
        self._show_context(reply.prompt_tokens + n)

    def _on_tool_calls(self, rid: int, calls: list[dict[str, Any]]) -> None:
        if self._mine(rid) is not None and self.turns is not None:
            self.turns.calls_made(calls)

    def _on_turns_ended(self, note: str) -> None:
        if note:
            self.context_note.emit(note)
        self.conversations_changed.emit()
        self._busy_changed()

    def _settle(self, reply: ActiveReply, status: str, stats: dict[str, Any]) -> None:
        """Save how an abandoned reply ended in the store (it is no longer on screen)."""
        if reply.close(status, stats):
            self.conversations_changed.emit()
        self._report_store(reply)

    def _report_store(self, reply: ActiveReply) -> None:
        """Say once that the store refused the answer (a full disk): it is not saved."""
        if (error := reply.take_store_error()) is not None:
            self.error.emit(f"The answer is no longer being saved: {error}")

    def _on_finished(self, rid: int, stats: GenerationStats) -> None:
        if (gone := self._abandoned.pop(rid, None)) is not None:
            # As after Stop: complete, with the figures of a cancelled reply (shown stopped).
            self._settle(gone, "complete", gone.final_stats(stats).to_dict())
            return
        reply = self._mine(rid)
        if reply is None or reply.row is None:
            return
        self._end()
        row = reply.row
        stats = reply.final_stats(stats)
        self.chat.finish(row, stats)
        if reply.close("complete", stats.to_dict()):
            self.conversations_changed.emit()
        self._report_store(reply)
        self._show_context(stats.prompt_tokens + stats.gen_tokens)
        if (
            self.turns is not None
            and stats.stop_reason != "cancelled"
            and self.turns.answer_finished(row, self.chat.message(row).store_id)
        ):
            return  # the tool loop goes on; the chat stays busy
        self._busy_changed()

    def _on_failed(self, rid: int, message: str) -> None:
        if rid and (gone := self._abandoned.pop(rid, None)) is not None:
            self._settle(gone, "interrupted", {"error": message})
            return
        if rid:
            if self._mine(rid) is None:
                return  # an abandoned reply ended with an error: nobody's business
        elif self.loading is not None:  # a load or a connection failed
            self.loading = None
            # The old model was freed before loading the new one.
            self.loaded = None
        if not rid and self._streaming():
            self.error.emit(message)  # not about the reply streaming now
            return
        self._fail(message)

    def _fail(self, message: str) -> None:
        """The active reply (if any) ended with `message`, with or without text."""
        reply = self._end()
        if reply is not None:
            # An answer that broke off after some text (a dropped connection, a timeout) is
            # kept and marked interrupted, as after a crash: it stays in the history and can
            # be read.
            shown = self.chat.message(reply.row) if reply.row is not None else None
            partial = shown is not None and bool(shown.text or shown.thinking)
            if reply.row is not None:
                if partial:
                    self.chat.interrupt(reply.row, message)
                else:
                    self.chat.fail(reply.row, message)
            if reply.close("interrupted" if partial else "error", {"error": message}):
                self.conversations_changed.emit()
            self._report_store(reply)
        self._busy_changed()
        self.error.emit(message)
