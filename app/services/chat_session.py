"""The chat's behaviour, Qt-free: the conversation on screen and its typed settings, what the
user asks of it (send, regenerate, edit, continue, stop, branches, delete), and whether they
may ask now.

Sending loads the chosen engine first when it is not the one in use (the newcomer's path:
type, press Enter, watch it load and answer); the engine port says which one the chat wants:
its saved remote binding, else the model selected in the library. Every reply runs the
pipeline of app/services/chat_pipeline.py (load -> retrieve -> tools -> stream) as the one
`ActiveReply` of the chat; the engine's events reach it through app/services/chat_replies.py.
Whether the user may send is one answer (`can_send`: no reply running and the chat not
paused), told to the listener as `state_changed`.

A reasoning model's thinking arrives apart from its answer and is stored with the message,
never sent back with the history. A chat with a structured-output schema is answered under
its grammar, and its answers are shown as JSON. With MCP tools (`use_tools`), an answer that
calls some hands over to the `ToolLoop`, which asks the user, runs them and asks for the
next step here, until the model answers without calls. With documents (`use_documents`), a
chat whose settings name collections has its question searched before the model runs; a
failed search fails the answer with the reason (never answered without its documents
unnoticed). Continue gives a cut-off answer the passages it was written from; Regenerate
searches again.

Images and audio go to a model loaded with a projector for them; their files are kept in the
store before the message refers to them, and every later turn sends the history's
attachments again, one marker each in their message's text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.services.attachments import NewAttachment
from app.services.chat_branches import cut_at, last_context, stored_conversation
from app.services.chat_ports import Jobs, Searcher
from app.services.chat_replies import ChatReplies
from app.services.chat_reply import ActiveReply, ReplyState
from app.services.chat_settings import ChatSettings, EngineBinding
from app.services.chat_store import ChatStoreError
from app.services.chat_summary import ChatSummary, load_summary
from app.services.chat_tools import ToolLoop
from app.services.conversation import Message

APP_CLOSED = "The app closed before the answer ended"
NO_MODEL = "Select a model in the library first"

# Why an attachment of a kind ("image", "audio") cannot go to the engine (None: it can).
KindCheck = Callable[[str], str | None]


class ChatSession(ChatReplies):
    def use_tools(self, turns: ToolLoop) -> ToolLoop:
        """Offer the chat's MCP tools to the model (a model loaded on this computer)."""
        self.turns = turns
        turns.store = self.store
        # The loop's next step: a new answer with the results in the history.
        turns.on_continue = lambda: self.run(ActiveReply(engine_ready=True))
        turns.on_ended = self._turns_ended
        return turns

    def use_documents(self, retriever: Searcher, searches: Jobs) -> None:
        """Ground the answers of chats that name collections in their passages."""
        self.retriever = retriever
        self.searches = searches

    def _turns_ended(self, note: str) -> None:
        if note:
            self.listener.context_note(note)
        self.listener.conversations_changed()
        self._changed()

    # -- whether the user may send ---------------------------------------------------------

    @property
    def reply_row(self) -> int | None:
        """The assistant message being streamed (None: none is)."""
        reply = self.reply
        return reply.row if reply is not None and reply.streaming else None

    def set_paused(self, reason: str | None) -> None:
        """Pause the chat (while a benchmark runs, both would share the processor and skew
        its numbers): sends, edits, regenerations and continues are refused with `reason`.
        None resumes."""
        self.paused = reason
        self._changed()

    def _refused(self) -> bool:
        """Sending is paused: say why, and refuse."""
        if self.paused is None:
            return False
        self.listener.notice(self.paused)
        return True

    # -- the engine --------------------------------------------------------------------------

    def connections_changed(self) -> None:
        """The saved connections changed (a URL, a key): a remote engine in use is built
        again, from the new settings, before its next reply."""
        if self.loaded is not None and self.loaded.remote is not None:
            self.loaded = None

    def cancel_load(self) -> None:
        if self.loading is not None:
            self.engine.cancel_load()

    def eject(self) -> None:
        if self.streaming:
            self.engine.stop()
        self.engine.unload()

    # -- requests ----------------------------------------------------------------------------

    def send(
        self, text: str, attachments: Sequence[NewAttachment] = (), check: KindCheck | None = None
    ) -> bool:
        """Add the user's message (with its images and audio, each passing `check`) and
        start the reply; False when one is still running, sending is paused, or the model
        cannot take an attachment (the window keeps what was typed and attached)."""
        if self._refused() or self.busy or not (text.strip() or attachments):
            return False  # a recording or a picture alone is a message; nothing at all is not
        if self.engine.chosen(self.settings) is None and self.loaded is None:
            self.listener.error(NO_MODEL)
            return False
        for a in attachments:
            if check is not None and (why := check(a.kind)) is not None:
                self.listener.error(why)
                return False
        try:
            kept = self.media.keep(self.store, attachments)
        except ChatStoreError as e:
            self.listener.error(f"The message was not sent: {e}")
            return False
        row = self.chat.append("user", text, attachments=kept)
        self.store_message(row, parent=True)
        self._new_turn()
        self.run(ActiveReply())
        return True

    def regenerate(self, row: int) -> bool:
        """A new answer to the same question, as a sibling of the answer at `row`."""
        m = self.chat.message(row)
        if self._refused() or self.busy or m.role != "assistant":
            return False
        parent = self._stored_parent(m)
        self._truncate(row)
        self._new_turn()
        self.run(ActiveReply(parent=parent))
        return True

    def edit(self, row: int, text: str) -> bool:
        """Replace the user message at `row` with `text` as a new branch, and answer it."""
        m = self.chat.message(row)
        if self._refused() or self.busy or m.role != "user" or not text.strip():
            return False
        parent = self._stored_parent(m)
        self._truncate(row)
        new_row = self.chat.append("user", text, attachments=m.attachments)  # kept as sent
        self.store_message(new_row, parent=parent)
        self._new_turn()
        self.run(ActiveReply())
        return True

    def continue_reply(self, row: int) -> bool:
        """Generate more of a cut-off answer (interrupted or stopped), after its text."""
        m = self.chat.message(row)
        last = len(self.chat.conversation.messages) - 1
        if self._refused() or self.busy or m.role != "assistant" or row != last:
            return False
        if m.answer_format == "json":
            # The grammar would start over at the top of the schema, not where the text
            # stopped.
            self.listener.error(
                "A structured answer cannot be continued: Regenerate it (or raise Max tokens first)"
            )
            return False
        choice = self.engine.chosen(self.settings)
        if choice is not None and choice.remote:
            # Chat APIs have no portable "continue this answer"; leave the answer as it is.
            self.listener.error(
                "Continue works with a local model only: choose This computer "
                "above the chat, or Regenerate to ask the server again"
            )
            return False
        if choice is None and self.loaded is None:
            self.listener.error(NO_MODEL)
            return False
        self.run(ActiveReply(continue_row=row))
        return True

    def stop(self) -> None:
        if self.turns is not None and self.turns.stop():
            return  # the tool loop ends (a running tool is cancelled first)
        reply = self.reply
        if reply is None:
            return
        if reply.streaming:
            self.engine.stop()  # it ends when the engine says so (`finished`, cancelled)
            return
        self._end()
        if reply.state is ReplyState.WAITING_FOR_MODEL:
            self.engine.cancel_load()
        self._changed()

    def _new_turn(self) -> None:
        self.turn_grounding = None
        if self.turns is not None:
            self.turns.new_turn(self.settings)

    # -- conversations -------------------------------------------------------------------------

    @property
    def conversation_id(self) -> int | None:
        return self.chat.conversation.store_id

    def new_chat(self) -> None:
        self._abandon()
        self.settings = ChatSettings()
        self.chat.clear()
        self._show_context(0)
        self._show_summary(None)
        self._changed()

    def open_conversation(self, conversation_id: int) -> None:
        """Show a stored conversation (its active branch)."""
        if self.store is None:
            return
        self._abandon()
        shown, stored = stored_conversation(self.store, conversation_id)
        self.settings = ChatSettings.from_stored(stored)
        self.chat.set_conversation(shown)
        self._show_context(last_context(shown))
        self._show_summary(load_summary(self.store, shown))
        self._changed()

    def _show_summary(self, summary: ChatSummary | None) -> None:
        """Another chat on screen: its summary (if any); its meter comes with its next
        request."""
        self.summary = summary
        self.listener.context_meter(None)
        self.listener.summary_changed(summary.text if summary is not None else None)

    def _abandon(self) -> None:
        if self.turns is not None:
            self.turns.abandon()
        reply = self._end()
        if reply is None:
            return
        if reply.streaming and reply.rid is not None:
            # Stopped as Stop stops it: the engine's `finished` (cancelled, with the figures
            # so far) closes its stored message, off screen.
            self.engine.stop()
            self.abandoned[reply.rid] = reply
            self.listener.streaming_reply(None)
        else:
            reply.close()  # nothing streamed: no stored answer to settle

    def detach_store(self) -> None:
        """At shutdown (engine thread ended): save the answer on screen as it is, then stop
        using the store, so late events cannot touch a closed database."""
        closed = {"error": APP_CLOSED}
        if self.reply is not None:
            if self.reply.streaming:  # cut by the quit: kept, marked so that Continue offers
                self.reply.close("interrupted", closed)
            else:
                self.reply.close()
        for reply in self.abandoned.values():  # the engine ended before they did
            reply.close("interrupted", closed)
        self.abandoned.clear()
        if self.turns is not None:
            self.turns.abandon()
        self.store = None

    # -- settings ------------------------------------------------------------------------------

    def set_settings(self, settings: ChatSettings) -> None:
        """Settings for this chat (from the settings drawer); stored with the conversation.
        The chat's engine is not the drawer's business: it stays as it was."""
        self.settings = settings.with_engine(settings.engine or self.settings.engine)
        cid = self.conversation_id
        if self.store is not None and cid is not None:
            # Replaced, not merged: what the drawer no longer holds (a value back at its
            # default, a cleared schema) must not come back when the chat is opened again.
            self.store.replace_settings(cid, self.settings.to_stored())

    def set_engine(self, binding: EngineBinding | None) -> None:
        """The engine this chat uses from its next reply on: None for the local model
        selected in the library. Saved with the conversation, so opening it again brings
        its engine back."""
        self.settings = self.settings.with_engine(binding)
        cid = self.conversation_id
        if self.store is not None and cid is not None:
            self.store.update_settings(cid, engine=binding.to_stored() if binding else None)

    # -- branches --------------------------------------------------------------------------------

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
            self.listener.conversations_changed()
        else:
            self._truncate(row)
        return True

    def _stored_parent(self, m: Message) -> int | None:
        if self.store is None or m.store_id is None:
            return None
        return self.store.message(m.store_id).parent_id

    def _truncate(self, row: int) -> None:
        self.chat.set_conversation(cut_at(self.chat.conversation, row))


__all__ = ["APP_CLOSED", "ChatSession", "KindCheck"]
