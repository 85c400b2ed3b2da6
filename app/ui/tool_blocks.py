"""Tool calls in the chat, as the user sees and answers them.

`ToolCallBlock`: a call the model made (the tool, its server, the arguments as pretty JSON)
with Allow once / Always allow this tool / Deny while it waits for the user, and the decision
once taken. `ToolResultBlock`: what the tool answered (or its error, or the refusal), folded
to one line and opened with a click; a running tool shows its progress and a Cancel button.

Tool output is untrusted text: it is shown as plain text (never rich text or Markdown, so
nothing in it is rendered, linked or run).
"""

from __future__ import annotations

import json

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase, QTextOption
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.ui.code_highlight import CodeHighlighter, is_dark
from app.ui.conversation import Message, ToolCallView

DECISION_WORDS = {
    "allowed": "Allowed once",
    "always": "Always allowed",
    "denied": "Denied",
    "cancelled": "Not answered (stopped)",
}
ERROR_STYLE = "color: #c62828;"  # readable on light and dark
MAX_SHOWN_LINES = 14  # a result taller than this scrolls inside its block


def pretty_arguments(arguments: str) -> str:
    """The arguments as indented JSON (as the model wrote them when they do not parse)."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def _plain_box(text: str) -> QPlainTextEdit:
    box = QPlainTextEdit()
    box.setReadOnly(True)
    box.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
    box.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
    box.setPlainText(text)
    _fit(box, text)
    return box


def _fit(box: QPlainTextEdit, text: str) -> None:
    lines = min(max(1, text.count("\n") + 1), MAX_SHOWN_LINES)
    box.setFixedHeight(lines * box.fontMetrics().lineSpacing() + 2 * box.frameWidth() + 10)


class ToolCallBlock(QFrame):
    """`decided(call_id, decision)`: the user pressed allowed | always | denied."""

    decided = Signal(str, str)

    def __init__(self, call: ToolCallView, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("toolCall")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.call_id = call.id
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 6, 8, 6)
        lay.setSpacing(4)
        self.title = QLabel()
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        self.title.setAccessibleName("Tool call")
        lay.addWidget(self.title)
        self.arguments = _plain_box(pretty_arguments(call.arguments))
        self.arguments.setAccessibleName("Arguments")
        self._highlighter = CodeHighlighter(
            self.arguments.document(), "json", is_dark(self.palette())
        )
        lay.addWidget(self.arguments)
        self.buttons = QWidget()
        row = QHBoxLayout(self.buttons)
        row.setContentsMargins(0, 0, 0, 0)
        self.allow_button = QPushButton("Allow once")
        self.always_button = QPushButton("Always allow this tool")
        self.deny_button = QPushButton("Deny")
        for b, decision in (
            (self.allow_button, "allowed"),
            (self.always_button, "always"),
            (self.deny_button, "denied"),
        ):
            b.setAccessibleName(b.text())
            b.clicked.connect(lambda _=False, d=decision: self.decided.emit(self.call_id, d))
            row.addWidget(b)
        row.addStretch(1)
        lay.addWidget(self.buttons)
        self.decision = QLabel()
        self.decision.setAccessibleName("Decision")
        self.decision.setEnabled(False)  # dimmed: a record, not a question
        lay.addWidget(self.decision)
        self.sync(call)

    def sync(self, call: ToolCallView) -> None:
        where = f" · {call.server}" if call.server else ""
        self.title.setText(f"Tool call: {call.name}{where}")
        shown = pretty_arguments(call.arguments)
        if shown != self.arguments.toPlainText():
            self.arguments.setPlainText(shown)
            _fit(self.arguments, shown)
        pending = call.decision == "pending"
        self.buttons.setVisible(pending)
        self.decision.setText(DECISION_WORDS.get(call.decision, ""))
        self.decision.setVisible(not pending)
        if pending:
            self.allow_button.setFocus(Qt.FocusReason.OtherFocusReason)


class ToolResultBlock(QFrame):
    """A tool message. `cancel_requested()`: Cancel pressed while the tool runs."""

    cancel_requested = Signal()

    def __init__(self, message: Message, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("toolResult")
        self.setFrameShape(QFrame.Shape.NoFrame)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        head = QHBoxLayout()
        self.toggle = QToolButton()
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setAccessibleName("Tool result")
        self.toggle.toggled.connect(self._show)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Tool progress")
        self.progress.setMaximumWidth(220)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Cancel the tool")
        self.cancel_button.clicked.connect(self.cancel_requested)
        head.addWidget(self.toggle)
        head.addWidget(self.progress)
        head.addWidget(self.cancel_button)
        head.addStretch(1)
        lay.addLayout(head)
        self.note = QLabel()
        self.note.setTextFormat(Qt.TextFormat.PlainText)
        self.note.setWordWrap(True)
        lay.addWidget(self.note)
        self.text = _plain_box("")
        self.text.setAccessibleName("Tool output")
        lay.addWidget(self.text)
        self._shown = ""
        self.sync(message)
        self._show(False)

    def sync(self, message: Message) -> None:
        name = message.tool_name or "tool"
        status = message.tool_status
        running = status == "running"
        words = {
            "running": "running…",
            "complete": "result",
            "error": "failed",
            "denied": "denied",
            "cancelled": "cancelled",
        }[status]
        self.toggle.setText(f"{name}: {words}")
        self.toggle.setVisible(not running)
        p = message.progress
        self.progress.setVisible(running)
        self.cancel_button.setVisible(running)
        if running:
            if p is not None and p.total:
                self.progress.setRange(0, 1000)
                self.progress.setValue(int(1000 * min(p.done / p.total, 1.0)))
            else:
                self.progress.setRange(0, 0)  # busy: no total known
            self.progress.setFormat(
                p.message if p is not None and p.message else f"{name}: running…"
            )
        notes = []
        if message.truncated:
            notes.append("The result was cut to the size limit before it reached the model.")
        self.note.setText(" ".join(notes))
        self.note.setVisible(bool(notes))
        self.toggle.setStyleSheet(ERROR_STYLE if status == "error" else "")
        if message.text != self._shown:
            self._shown = message.text
            self.text.setPlainText(message.text)
            _fit(self.text, message.text)
        if status == "error" and not self.toggle.isChecked():
            self.toggle.setChecked(True)  # a failure is read at once

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    def _show(self, expanded: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        self.text.setVisible(expanded and bool(self._shown))


__all__ = ["ToolCallBlock", "ToolResultBlock", "pretty_arguments"]
