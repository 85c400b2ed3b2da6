"""The messages of the chat on screen, as the chat's session changes them.

`Transcript` is what the session (and its tool loop) may do to the conversation: append a
message, grow an answer, settle it. `PlainTranscript` does it to a plain `Conversation`; the
window's `ChatModel` (app/ui/chat_model.py) does the same through one of these and tells its
views (a Qt item model), so the session never knows whether a window is looking.
"""

from __future__ import annotations

from typing import Protocol

from app.services.attachments import Attachment
from app.services.conversation import (
    AnswerFormat,
    Conversation,
    Message,
    MessageState,
    Role,
    ToolCallView,
    ToolDecision,
    ToolProgress,
    ToolStatus,
)
from engine.host.stats import GenerationStats
from engine.rag.grounding import Grounding


class Transcript(Protocol):
    @property
    def conversation(self) -> Conversation: ...
    def message(self, row: int) -> Message: ...
    def set_conversation(self, conversation: Conversation) -> None: ...
    def clear(self) -> None: ...
    def append(
        self,
        role: Role,
        text: str,
        state: MessageState = "done",
        *,
        answer_format: AnswerFormat = "markdown",
        model: str | None = None,
        grounding: Grounding | None = None,
        attachments: list[Attachment] | None = None,
    ) -> int: ...
    def append_text(self, row: int, text: str) -> None: ...
    def append_thinking(self, row: int, text: str) -> None: ...
    def set_thought(self, row: int, tokens: int, seconds: float) -> None: ...
    def finish(self, row: int, stats: GenerationStats) -> None: ...
    def refresh(self, row: int) -> None: ...
    def set_state(self, row: int, state: MessageState) -> None: ...
    def fail(self, row: int, error: str) -> None: ...
    def interrupt(self, row: int, error: str) -> None: ...
    def set_tool_calls(self, row: int, calls: list[ToolCallView]) -> None: ...
    def set_decision(self, row: int, call_id: str, decision: ToolDecision) -> None: ...
    def append_tool(self, call: ToolCallView, status: ToolStatus, text: str = "") -> int: ...
    def set_tool_progress(self, row: int, progress: ToolProgress) -> None: ...
    def set_left_out(self, ids: frozenset[str]) -> None:
        """The messages (by `Message.id`) the last prompt sent left out of the context."""
        ...

    def left_out(self, row: int) -> bool: ...
    def set_tool_result(
        self, row: int, status: ToolStatus, text: str, *, truncated: bool = False
    ) -> None: ...


class PlainTranscript:
    """A `Transcript` over a plain conversation: what each change does to the data."""

    def __init__(self, conversation: Conversation | None = None) -> None:
        self._conv = conversation or Conversation()
        self.left_out_ids: frozenset[str] = frozenset()

    def set_left_out(self, ids: frozenset[str]) -> None:
        self.left_out_ids = ids

    def left_out(self, row: int) -> bool:
        return self._conv.messages[row].id in self.left_out_ids

    @property
    def conversation(self) -> Conversation:
        return self._conv

    def message(self, row: int) -> Message:
        return self._conv.messages[row]

    def set_conversation(self, conversation: Conversation) -> None:
        self._conv = conversation
        self.left_out_ids = frozenset()  # another chat: the next prompt says again

    def clear(self) -> None:
        self.set_conversation(Conversation())

    def append(
        self,
        role: Role,
        text: str,
        state: MessageState = "done",
        *,
        answer_format: AnswerFormat = "markdown",
        model: str | None = None,
        grounding: Grounding | None = None,
        attachments: list[Attachment] | None = None,
    ) -> int:
        self._conv.messages.append(
            Message(
                role,
                text,
                state,
                answer_format=answer_format,
                model=model,
                grounding=grounding,
                attachments=list(attachments or ()),
            )
        )
        return len(self._conv.messages) - 1

    def append_text(self, row: int, text: str) -> None:
        self._conv.messages[row].text += text

    def append_thinking(self, row: int, text: str) -> None:
        self._conv.messages[row].thinking += text

    def set_thought(self, row: int, tokens: int, seconds: float) -> None:
        """The thinking block closed after `tokens` tokens and `seconds` seconds."""
        self._conv.messages[row].thought = (tokens, seconds)

    def finish(self, row: int, stats: GenerationStats) -> None:
        m = self._conv.messages[row]
        m.stats = stats
        m.state = "stopped" if stats.stop_reason == "cancelled" else "done"
        if stats.thinking_tokens:
            m.thought = (stats.thinking_tokens, stats.thinking_s)

    def set_grounding(self, row: int, grounding: Grounding | None) -> None:
        self._conv.messages[row].grounding = grounding

    def refresh(self, row: int) -> None:
        """The message at `row` changed outside the transcript (its branch position)."""

    def set_state(self, row: int, state: MessageState) -> None:
        m = self._conv.messages[row]
        m.state = state
        if state == "streaming":
            m.stats = None

    def fail(self, row: int, error: str) -> None:
        m = self._conv.messages[row]
        m.state = "error"
        m.error = error

    def interrupt(self, row: int, error: str) -> None:
        """The reply broke off (a dropped connection, a timeout) after some text: the text
        stays, marked interrupted, with the reason."""
        m = self._conv.messages[row]
        m.state = "interrupted"
        m.error = error

    def set_tool_calls(self, row: int, calls: list[ToolCallView]) -> None:
        self._conv.messages[row].tool_calls = list(calls)

    def set_decision(self, row: int, call_id: str, decision: ToolDecision) -> None:
        for c in self._conv.messages[row].tool_calls:
            if c.id == call_id:
                c.decision = decision

    def append_tool(self, call: ToolCallView, status: ToolStatus, text: str = "") -> int:
        """A tool message answering `call` (running, or already denied/cancelled)."""
        self._conv.messages.append(
            Message("tool", text, tool_call_id=call.id, tool_name=call.name, tool_status=status)
        )
        return len(self._conv.messages) - 1

    def set_tool_progress(self, row: int, progress: ToolProgress) -> None:
        self._conv.messages[row].progress = progress

    def set_tool_result(
        self, row: int, status: ToolStatus, text: str, *, truncated: bool = False
    ) -> None:
        m = self._conv.messages[row]
        m.tool_status, m.text, m.truncated, m.progress = status, text, truncated, None


__all__ = ["PlainTranscript", "Transcript"]
