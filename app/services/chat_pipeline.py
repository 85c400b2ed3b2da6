"""How one reply of the chat comes to be, Qt-free: an explicit pipeline of steps.

    LOAD      the engine the chat wants is the one in use, else switch to it and wait
    RETRIEVE  a chat with collections has its question searched (off this thread) and wait
    TOOLS     a chat with MCP tools has them listed (starting their servers) and wait
    STREAM    the answer's message is added and stored, and the engine asked for it

A new answer runs every step; more of a cut-off answer (Continue) runs LOAD and CONTINUE
(the passages it was written from, no new search, no tools). Each step either is done, and
the next one runs, or waits: what it waited for (the engine loaded, the passages found, the
tools listed) resumes the pipeline at the step after it, since each step records what it
found on the reply (`ActiveReply`). A reply that was stopped or abandoned meanwhile is not
the active one any more, and its late results are dropped. The engine's events about the
reply that streams are app/services/chat_replies.py's.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, cast

from app.services.attachments import Attachment
from app.services.chat_ports import (
    ChatListener,
    EngineChoice,
    EngineInfo,
    EnginePort,
    Jobs,
    MediaKeeper,
    Searcher,
    Turn,
)
from app.services.chat_prompt import PromptBuilder
from app.services.chat_reply import ActiveReply, Parent, ReplyState
from app.services.chat_settings import ChatSettings
from app.services.chat_store import ChatStore, ChatStoreError, StreamWriter
from app.services.chat_summary import ChatSummary
from app.services.chat_tools import OfferedTool, ToolLoop
from app.services.chat_transcript import Transcript
from engine.decoding.constraints import GrammarError
from engine.rag.grounding import Grounding, approx_tokens, budget_for, ground
from engine.settings import SamplingParams

# The context assumed for retrieval's budget when a remote engine does not tell its own.
REMOTE_CTX_GUESS = 8192


class Step(enum.Enum):
    LOAD = "load"
    RETRIEVE = "retrieve"
    TOOLS = "tools"
    STREAM = "stream"
    CONTINUE = "continue"


ANSWER = (Step.LOAD, Step.RETRIEVE, Step.TOOLS, Step.STREAM)
CONTINUATION = (Step.LOAD, Step.CONTINUE)


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


class ChatPipeline:
    def __init__(
        self,
        engine: EnginePort,
        chat: Transcript,
        media: MediaKeeper,
        *,
        sampling: SamplingParams | None = None,
        store: ChatStore | None = None,
        listener: ChatListener | None = None,
    ) -> None:
        self.engine = engine
        self.chat = chat
        self.media = media
        self.sampling = sampling or SamplingParams()  # the app's; the chat's settings over it
        self.listener = listener or ChatListener()
        self.settings = ChatSettings()  # the chat on screen's
        self.loaded: EngineInfo | None = None
        self.loading: Hashable | None = None  # the engine being switched to
        self.reply: ActiveReply | None = None
        # Streaming replies the chat moved away from (New chat, another conversation), by
        # request id: stopped in the engine, stored as Stop stores an answer once it ends.
        self.abandoned: dict[int, ActiveReply] = {}
        self.paused: str | None = None  # why sending is paused (a benchmark runs)
        self.turns: ToolLoop | None = None
        self.retriever: Searcher | None = None
        self.searches: Jobs | None = None
        # The passages of the turn's first step: the steps after a tool's result reuse them.
        self.turn_grounding: Grounding | None = None
        # Tokens the conversation on screen takes in the context, as of its last request.
        self.context_used = 0
        # Its summary of the turns the context leaves out (policy "summarise").
        self.summary: ChatSummary | None = None
        self._store = store
        self.prompt = PromptBuilder(chat, self.attachment_data, engine.media_marker)

    @property
    def store(self) -> ChatStore | None:
        return self._store

    @store.setter
    def store(self, store: ChatStore | None) -> None:
        self._store = store
        if self.turns is not None:
            self.turns.store = store

    def attachment_data(self, a: Attachment) -> bytes | None:
        """A sent attachment's bytes (None: the file is gone)."""
        return self.media.data(self.store, a)

    # -- state ------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.reply is not None or (self.turns is not None and self.turns.active)

    @property
    def can_send(self) -> bool:
        return not self.busy and self.paused is None

    @property
    def streaming(self) -> bool:
        return self.reply is not None and self.reply.streaming

    def _changed(self) -> None:
        self.listener.state_changed()

    def _enter(self, reply: ActiveReply, state: ReplyState) -> None:
        reply.state = state
        self._changed()

    def _end(self) -> ActiveReply | None:
        """Let go of the active reply (the one place that does): later events about it are
        dropped. The caller settles its message and says the chat is idle."""
        reply, self.reply = self.reply, None
        return reply

    def _show_context(self, used: int) -> None:
        self.context_used = used
        self.listener.context_changed(used, self.loaded.n_ctx if self.loaded else 0)

    # -- the pipeline -------------------------------------------------------------------------

    def run(self, reply: ActiveReply) -> None:
        """Make `reply` the active one and run its steps from where it stands."""
        self.reply = reply
        self._advance(reply)

    def _advance(self, reply: ActiveReply) -> None:
        steps: dict[Step, Callable[[ActiveReply], bool]] = {
            Step.LOAD: self._load,
            Step.RETRIEVE: self._retrieve,
            Step.TOOLS: self._tools,
            Step.STREAM: self._stream,
            Step.CONTINUE: self._continue,
        }
        for step in CONTINUATION if reply.continue_row is not None else ANSWER:
            if self.reply is not reply or not steps[step](reply):
                return  # ended, or waiting: what it waits for resumes here

    def _load(self, reply: ActiveReply) -> bool:
        """Done when the engine the chat wants is in use (or none is chosen)."""
        if reply.engine_ready:
            return True
        choice = self.engine.chosen(self.settings)
        if not self.needs_switch(choice):
            reply.engine_ready = True
            return True
        assert choice is not None
        self._enter(reply, ReplyState.WAITING_FOR_MODEL)
        if self.loading != choice.key:
            self.switch(choice)
        return False  # `engine_loaded` resumes it

    def needs_switch(self, choice: EngineChoice | None) -> bool:
        return choice is not None and (self.loaded is None or self.loaded.key != choice.key)

    def switch(self, choice: EngineChoice) -> bool:
        """Start switching to `choice`; False (with a message) while a reply streams."""
        if self.streaming:
            what = "switching" if choice.remote else "loading"
            self.listener.error(f"Wait for the reply to finish (or press Stop) before {what}")
            return False
        self.loading = choice.key
        self.listener.notice(choice.label)
        self.engine.start(choice)
        self.listener.loading_started(choice.key)
        return True

    def _retrieve(self, reply: ActiveReply) -> bool:
        """Search the chat's collections for the question; done at once when there is
        nothing to search (or the search cannot run: the answer then fails with why)."""
        if reply.retrieved:
            return True
        reply.retrieved = True
        collections = list(self.settings.collections)
        if not collections:
            return True
        if self.turns is not None and self.turns.rounds > 0:
            reply.grounding = self.turn_grounding  # a tool loop's next step: same question
            return True
        retriever, searches = self.retriever, self.searches
        if retriever is None or searches is None:
            reply.retrieval_error = "Documents are not available in this window"
            return True
        question = next(
            (m.text for m in reversed(self.chat.conversation.messages) if m.role == "user"), ""
        )
        s = self.settings
        k, share = s.docs_k, s.docs_budget
        reranker = Path(s.docs_reranker) if s.docs_reranker is not None else None
        n_ctx = (self.loaded.n_ctx if self.loaded is not None else 0) or REMOTE_CTX_GUESS
        max_tokens = self.prompt.free_sampling(self.sampling, s).max_tokens
        history = self.prompt.messages(s, self.loaded)
        loaded = self.loaded
        count = self.engine.token_counter(loaded) if loaded is not None else approx_tokens
        reply.retrieved = False
        self._enter(reply, ReplyState.RETRIEVING)
        self.listener.notice(f"Searching {', '.join(collections)}…")

        def search() -> Grounding:
            hits = retriever.search(collections, question, k, reranker=reranker)
            used = count("\n".join(str(m.get("content") or "") for m in history))
            budget = budget_for(n_ctx, max_tokens, used, share / 100)
            return ground(hits, count, budget, collections=collections)

        def found(result: Any, error: BaseException | None) -> None:
            if self.reply is not reply or reply.state is not ReplyState.RETRIEVING:
                return  # stopped or abandoned meanwhile
            reply.retrieved = True
            if error is not None:
                reply.retrieval_error = f"Documents: {one_line(error)}"
            else:
                reply.grounding = self.turn_grounding = cast(Grounding, result)
                self.listener.notice(reply.grounding.summary)
            self._advance(reply)

        searches.run(search, found, name="candlewick-retrieval")
        return False

    def _tools(self, reply: ActiveReply) -> bool:
        """The tools offered with the answer: only a model on this computer calls tools,
        and not under a schema; an answer that fails for its documents starts none."""
        if reply.tools is not None:
            return True
        turns = self.turns
        loaded = self.loaded
        if (
            reply.retrieval_error
            or turns is None
            or self.settings.structured_output is not None
            or loaded is None
            or loaded.remote is not None
        ):
            reply.tools = []
            return True
        reply.tools = turns.runner.cached(self.settings)
        if reply.tools is not None:
            return True
        self._enter(reply, ReplyState.WAITING_FOR_TOOLS)
        self.listener.notice("Starting the chat's tool servers…")

        def ready(found: list[OfferedTool]) -> None:
            if self.reply is not reply or reply.state is not ReplyState.WAITING_FOR_TOOLS:
                return  # stopped or abandoned meanwhile
            for problem in turns.runner.problems:
                self.listener.context_note(f"Tools unavailable: {problem}")
            reply.tools = found
            self._advance(reply)

        turns.runner.prepare(self.settings, ready)
        return False

    def _stream(self, reply: ActiveReply) -> bool:
        """Add the answer's message (stored as streaming) and ask the engine for it."""
        s = self.settings
        messages = self.prompt.messages(s, self.loaded, grounding=reply.grounding)
        reply.sent = self.prompt.sources(s, grounding=reply.grounding)
        structured = s.structured_output is not None
        problem = reply.retrieval_error
        try:
            sampling = self.prompt.sampling(self.sampling, s)
        except GrammarError as e:  # a schema that was never checked here (an import)
            sampling = self.prompt.free_sampling(self.sampling, s)
            problem = f"Structured output: {e}"
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
            self.store_message(
                row,
                parent=reply.parent,
                status="streaming",
                model=model,
                sampling=self.prompt.stored_sampling(sampling, s),
            )
        except ChatStoreError as e:
            self.listener.error(f"The answer will not be saved: {e}")
        m = self.chat.message(row)
        if self.store is not None and m.store_id is not None:
            reply.writer = StreamWriter(self.store, m.store_id)
        self._enter(reply, ReplyState.STREAMING)
        if problem is not None:
            self._fail(problem)
            return False
        functions, choice = None, None
        if self.turns is not None and reply.tools:
            functions = self.turns.offer(reply.tools)
            # The chat's `tool_choice` ("required", or a tool by name) is for the first step
            # of a turn; the steps after a tool's result may answer.
            choice = s.tool_choice if self.turns.rounds == 0 else None
        # A grammar shapes the answer from its first token: no room for a thinking block.
        reply.rid = self.engine.generate(
            Turn(
                messages,
                sampling,
                s.context_policy,
                thinking=not structured,
                tools=functions,
                tool_choice=choice or "auto",
                media=self.prompt.media(self.loaded),
                **self._context_fields(reply),
            )
        )
        self.listener.streaming_reply(reply.rid)
        return True

    def _continue(self, reply: ActiveReply) -> bool:
        """Ask the engine for more of the answer at `continue_row`, after its text."""
        row = cast(int, reply.continue_row)
        m = self.chat.message(row)
        # The passages it was written from, as stored: no new search. Free text: a
        # structured answer is never continued, so the chat's schema is not this answer's.
        messages = self.prompt.messages(self.settings, self.loaded, row, m.grounding)
        reply.sent = self.prompt.sources(self.settings, row, m.grounding)
        sampling = self.prompt.free_sampling(self.sampling, self.settings)
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
            Turn(
                messages,
                dataclasses.replace(sampling, grammar=None),
                self.settings.context_policy,
                continue_text=m.text,
                continue_thinking=m.thinking,
                media=self.prompt.media(self.loaded, row),
                **self._context_fields(reply, m.grounding),
            )
        )
        self.listener.streaming_reply(reply.rid)
        return True

    def _context_fields(
        self, reply: ActiveReply, grounding: Grounding | None = None
    ) -> dict[str, Any]:
        """A request's summary (policy "summarise") and what the meter calls its messages."""
        kinds, tails = self.prompt.meter_tags(self.settings, grounding or reply.grounding)
        summary = self.summary
        sent = reply.sent or []
        return {
            "summary": summary.for_request(sent)
            if summary is not None and self.settings.context_policy == "summarise"
            else None,
            "kinds": kinds,
            "tails": tails,
        }

    # -- the store ------------------------------------------------------------------------------

    def _ensure_conversation(self) -> int | None:
        if self.store is None:
            return None
        conv = self.chat.conversation
        if conv.store_id is None:
            conv.store_id = self.store.create_conversation(settings=self.settings.to_stored()).id
        return conv.store_id

    def store_message(
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
        self.listener.conversations_changed()

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
                self.listener.conversations_changed()
            self._report_store(reply)
        self._changed()
        self.listener.error(message)

    def _report_store(self, reply: ActiveReply) -> None:
        """Say once that the store refused the answer (a full disk): it is not saved."""
        if (error := reply.take_store_error()) is not None:
            self.listener.error(f"The answer is no longer being saved: {error}")


__all__ = ["ANSWER", "CONTINUATION", "REMOTE_CTX_GUESS", "ChatPipeline", "Step"]
