"""The Qt item model of one conversation (a list: one row per message).

It is a `Transcript` (app/services/chat_transcript.py): each change is made by the plain
one it wraps, then told to the views. A store can hand in a loaded conversation with
`set_conversation`. Only the GUI thread calls it: engine signals are applied here (through
the chat's session), never by the worker.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import (
    QAbstractListModel,
    QByteArray,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    Signal,
)

from app.services.attachments import Attachment
from app.services.chat_transcript import PlainTranscript
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

ROLE_ROLE = Qt.ItemDataRole.UserRole + 1
STATE_ROLE = Qt.ItemDataRole.UserRole + 2
STATS_ROLE = Qt.ItemDataRole.UserRole + 3
ERROR_ROLE = Qt.ItemDataRole.UserRole + 4
MESSAGE_ROLE = Qt.ItemDataRole.UserRole + 5
THINKING_ROLE = Qt.ItemDataRole.UserRole + 6  # a reasoning model's thinking block
LEFT_OUT_ROLE = Qt.ItemDataRole.UserRole + 7  # the last prompt left the message out

Index = QModelIndex | QPersistentModelIndex


class ChatModel(QAbstractListModel):
    # Where the last prompt's tokens went (a ContextMeter, or None), for the chat's meter.
    meter_changed = Signal(object)
    # The chat's summary of earlier turns (str, or None: none), and the person's edit of it.
    summary_changed = Signal(object)
    summary_edited = Signal(str)

    def __init__(
        self, conversation: Conversation | None = None, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self._data = PlainTranscript(conversation)

    # -- read ------------------------------------------------------------------------------

    @property
    def conversation(self) -> Conversation:
        return self._data.conversation

    @property
    def _messages(self) -> list[Message]:
        return self._data.conversation.messages

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._messages)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._messages):
            return None
        m = self._messages[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return m.text
        if role == Qt.ItemDataRole.AccessibleTextRole:
            return f"{m.role}: {m.text}"
        if role == ROLE_ROLE:
            return m.role
        if role == STATE_ROLE:
            return m.state
        if role == STATS_ROLE:
            return m.stats
        if role == ERROR_ROLE:
            return m.error
        if role == MESSAGE_ROLE:
            return m
        if role == THINKING_ROLE:
            return m.thinking
        if role == LEFT_OUT_ROLE:
            return self._data.left_out(index.row())
        return None

    def roleNames(self) -> dict[int, QByteArray]:
        names = dict(super().roleNames())
        for role, name in (
            (ROLE_ROLE, b"role"),
            (STATE_ROLE, b"state"),
            (STATS_ROLE, b"stats"),
            (ERROR_ROLE, b"error"),
            (THINKING_ROLE, b"thinking"),
            (LEFT_OUT_ROLE, b"leftOut"),
        ):
            names[role] = QByteArray(name)
        return names

    def message(self, row: int) -> Message:
        return self._messages[row]

    def left_out(self, row: int) -> bool:
        return self._data.left_out(row)

    # -- write (GUI thread only) -----------------------------------------------------------

    def set_conversation(self, conversation: Conversation) -> None:
        self.beginResetModel()
        self._data.set_conversation(conversation)
        self.endResetModel()

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
        row = len(self._messages)
        self.beginInsertRows(QModelIndex(), row, row)
        self._data.append(
            role,
            text,
            state,
            answer_format=answer_format,
            model=model,
            grounding=grounding,
            attachments=attachments,
        )
        self.endInsertRows()
        return row

    def append_text(self, row: int, text: str) -> None:
        self._data.append_text(row, text)
        self._changed(row, [Qt.ItemDataRole.DisplayRole])

    def append_thinking(self, row: int, text: str) -> None:
        self._data.append_thinking(row, text)
        self._changed(row, [THINKING_ROLE])

    def set_thought(self, row: int, tokens: int, seconds: float) -> None:
        """The thinking block closed after `tokens` tokens and `seconds` seconds."""
        self._data.set_thought(row, tokens, seconds)
        self._changed(row, [THINKING_ROLE])

    def finish(self, row: int, stats: GenerationStats) -> None:
        self._data.finish(row, stats)
        self._changed(row, [STATE_ROLE, STATS_ROLE, THINKING_ROLE])

    def set_grounding(self, row: int, grounding: Grounding | None) -> None:
        """The passages the answer at `row` was given (None: none)."""
        self._data.set_grounding(row, grounding)
        self._changed(row, [MESSAGE_ROLE])

    def refresh(self, row: int) -> None:
        """The message at `row` changed outside the model (e.g. its branch position)."""
        self._changed(row, [MESSAGE_ROLE])

    def set_state(self, row: int, state: MessageState) -> None:
        self._data.set_state(row, state)
        self._changed(row, [STATE_ROLE, STATS_ROLE])

    def fail(self, row: int, error: str) -> None:
        self._data.fail(row, error)
        self._changed(row, [STATE_ROLE, ERROR_ROLE])

    def interrupt(self, row: int, error: str) -> None:
        """The reply broke off (a dropped connection, a timeout) after some text: the text
        stays, marked interrupted, with the reason."""
        self._data.interrupt(row, error)
        self._changed(row, [STATE_ROLE, ERROR_ROLE])

    # -- tool calls (the agent loop) -------------------------------------------------------

    def set_tool_calls(self, row: int, calls: list[ToolCallView]) -> None:
        self._data.set_tool_calls(row, calls)
        self._changed(row, [MESSAGE_ROLE])

    def set_decision(self, row: int, call_id: str, decision: ToolDecision) -> None:
        self._data.set_decision(row, call_id, decision)
        self._changed(row, [MESSAGE_ROLE])

    def append_tool(self, call: ToolCallView, status: ToolStatus, text: str = "") -> int:
        """A tool message answering `call` (running, or already denied/cancelled)."""
        row = len(self._messages)
        self.beginInsertRows(QModelIndex(), row, row)
        self._data.append_tool(call, status, text)
        self.endInsertRows()
        return row

    def set_tool_progress(self, row: int, progress: ToolProgress) -> None:
        self._data.set_tool_progress(row, progress)
        self._changed(row, [MESSAGE_ROLE])

    def set_tool_result(
        self, row: int, status: ToolStatus, text: str, *, truncated: bool = False
    ) -> None:
        self._data.set_tool_result(row, status, text, truncated=truncated)
        self._changed(row, [Qt.ItemDataRole.DisplayRole, MESSAGE_ROLE])

    def set_meter(self, meter: object) -> None:
        self.meter_changed.emit(meter)

    def set_summary(self, text: str | None) -> None:
        self.summary_changed.emit(text)

    def set_left_out(self, ids: frozenset[str]) -> None:
        """Mark the messages the last prompt left out (and unmark the others)."""
        was = self._data.left_out_ids
        self._data.set_left_out(ids)
        for row, m in enumerate(self._messages):
            if (m.id in was) != (m.id in ids):
                self._changed(row, [LEFT_OUT_ROLE])

    def _changed(self, row: int, roles: list[int]) -> None:
        idx = self.index(row, 0)
        self.dataChanged.emit(idx, idx, roles)
