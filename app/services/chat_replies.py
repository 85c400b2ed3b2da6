"""The engine's events applied to the chat's reply, Qt-free: a load that ended (the reply
waiting for it runs on), the answer's text and thinking as they stream (shown, and stored at
most a second behind), and how it ended (finished, with its figures, or failed). Each event
carries its reply's request id: one that is not the active reply's belongs to a reply the
chat moved away from (New chat, another conversation), which is stored off screen until it
ends, or to nobody.
"""

from __future__ import annotations

from typing import Any

from app.services.chat_pipeline import ChatPipeline
from app.services.chat_ports import EngineInfo
from app.services.chat_reply import ActiveReply, ReplyState
from app.services.chat_store import ChatStoreError
from app.services.chat_summary import ChatSummary, save_summary
from engine.host.context_meter import ContextMeter
from engine.host.context_summary import Summary
from engine.host.stats import GenerationStats


class ChatReplies(ChatPipeline):
    def engine_loaded(self, info: EngineInfo) -> None:
        self.loaded = info
        self.loading = None
        self.listener.engine_changed(info)
        self._show_context(self.context_used)  # against the context it was loaded with
        self.listener.notice(f"Loaded {info.name}")
        reply = self.reply
        if reply is not None and reply.state is ReplyState.WAITING_FOR_MODEL:
            reply.engine_ready = True
            self._advance(reply)

    def load_cancelled(self) -> None:
        self.loading = None
        self.loaded = None  # the engine frees the old model before loading a new one
        self.listener.engine_changed(None)
        self._show_context(self.context_used)  # no model: no context size to show
        self.listener.notice("Loading cancelled")
        if self.reply is not None and self.reply.state is ReplyState.WAITING_FOR_MODEL:
            self._end()
            self._changed()

    def unloaded(self) -> None:
        self.loaded = None
        self.listener.engine_changed(None)
        self._show_context(self.context_used)
        self.listener.notice("Model ejected")

    def _mine(self, rid: int) -> ActiveReply | None:
        """The active reply if an event with request id `rid` is about it."""
        reply = self.reply
        return reply if reply is not None and reply.is_for(rid) else None

    def started(self, rid: int, prompt_tokens: int) -> None:
        if (reply := self._mine(rid)) is not None:
            reply.prompt_tokens = prompt_tokens
            self._show_context(prompt_tokens)

    def context_meter(self, rid: int, meter: ContextMeter) -> None:
        """Where the prompt of reply `rid` went: shown, and the turns it left out marked."""
        reply = self._mine(rid)
        if reply is None or reply.sent is None:
            return
        sent = reply.sent
        ids = (sent[i] for i in meter.left_out if 0 <= i < len(sent))
        self.chat.set_left_out(frozenset(i for i in ids if i is not None))
        self.listener.context_meter(meter)

    def summarised(self, rid: int, summary: Summary) -> None:
        """The engine summarised the turns the prompt of reply `rid` leaves out: kept for
        the next requests (and in the store), shown."""
        reply = self._mine(rid)
        if reply is None or reply.sent is None:
            return
        self.summary = ChatSummary.of(summary, reply.sent)
        self._save_summary()
        self.listener.summary_changed(self.summary.text)

    def edit_summary(self, text: str) -> None:
        """The person's own words for the summary: sent from the next request on."""
        if self.summary is None or text == self.summary.text:
            return
        self.summary = ChatSummary(text, self.summary.covers)
        self._save_summary()

    def _save_summary(self) -> None:
        if self.store is None or self.summary is None:
            return
        try:
            save_summary(self.store, self.chat.conversation, self.summary)
        except ChatStoreError as e:
            self.listener.error(f"The summary was not saved: {e}")

    def trimmed(self, dropped: int) -> None:
        if self.streaming:
            n = f"{dropped} old message{'s' if dropped != 1 else ''}"
            how = {
                "summarise": f"{n} sent as a summary",
                "truncate_middle": f"{n.replace(' old', '')} from the middle left out",
            }.get(self.settings.context_policy, f"{n} left out")
            self.listener.context_note(
                f"{how}: the conversation no longer fits the context "
                f"(policy: {self.settings.context_policy.replace('_', ' ')})"
            )

    def tokens(self, rid: int, text: str, n: int, *, thinking: bool = False) -> None:
        """Text (or a reasoning model's thinking) of the reply `rid`, `n` tokens so far."""
        if (reply := self._mine(rid)) is not None and reply.row is not None:
            if thinking:
                self.chat.append_thinking(reply.row, text)
            else:
                self.chat.append_text(reply.row, text)
            # The answer takes context as it grows (the performance panel counts it too).
            self._show_context(reply.prompt_tokens + n)
            reply.write(text, thinking=thinking)
            self._report_store(reply)
        elif (gone := self.abandoned.get(rid)) is not None:
            gone.write(text, thinking=thinking)  # stored, as its figures will count it
            self._report_store(gone)

    def thought(self, rid: int, tokens: int, seconds: float) -> None:
        if (reply := self._mine(rid)) is not None and reply.row is not None:
            self.chat.set_thought(reply.row, *reply.thought(tokens, seconds))

    def tool_calls(self, rid: int, calls: list[dict[str, Any]]) -> None:
        if self._mine(rid) is not None and self.turns is not None:
            self.turns.calls_made(calls)

    def finished(self, rid: int, stats: GenerationStats) -> None:
        if (gone := self.abandoned.pop(rid, None)) is not None:
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
            self.listener.conversations_changed()
        self._report_store(reply)
        self._show_context(stats.prompt_tokens + stats.gen_tokens)
        if (
            self.turns is not None
            and stats.stop_reason != "cancelled"
            and self.turns.answer_finished(row, self.chat.message(row).store_id)
        ):
            return  # the tool loop goes on; the chat stays busy
        self._changed()

    def failed(self, rid: int, message: str) -> None:
        """A reply failed (`rid` its id), or a load or connection did (`rid` 0)."""
        if rid and (gone := self.abandoned.pop(rid, None)) is not None:
            self._settle(gone, "interrupted", {"error": message})
            return
        if rid:
            if self._mine(rid) is None:
                return  # an abandoned reply ended with an error: nobody's business
        elif self.loading is not None:  # a load or a connection failed
            self.loading = None
            self.loaded = None  # the old model was freed before loading the new one
        if not rid and self.streaming:
            self.listener.error(message)  # not about the reply streaming now
            return
        self._fail(message)

    def _settle(self, reply: ActiveReply, status: str, stats: dict[str, Any]) -> None:
        """Save how an abandoned reply ended in the store (it is no longer on screen)."""
        if reply.close(status, stats):
            self.listener.conversations_changed()
        self._report_store(reply)
