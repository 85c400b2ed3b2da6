"""Editing a message where it stands: its bubble becomes a text box with Save and Cancel.
Enter (or Ctrl+Enter) saves, Shift+Enter adds a line, Esc cancels.

The box takes Enter and Esc before the window's shortcuts do (Esc is the window's Stop), so
a key meant for the edit never stops a reply or sends a message.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QKeyEvent, QResizeEvent, QTextCursor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

_KEYS = (Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Escape)


class EditBox(QPlainTextEdit):
    """The text box: as tall as its text (2 to 12 lines, then it scrolls)."""

    save = Signal()
    cancel = Signal()

    MIN_LINES, MAX_LINES = 2, 12

    def __init__(self, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Edit message")
        self.setTabChangesFocus(True)
        self.setPlainText(text)
        self.moveCursor(QTextCursor.MoveOperation.End)
        self.textChanged.connect(self._fit)
        self._fit()

    def event(self, e: QEvent) -> bool:
        if (
            e.type() == QEvent.Type.ShortcutOverride
            and isinstance(e, QKeyEvent)
            and e.key() in _KEYS
        ):
            e.accept()  # the key comes here as a key press, not to a window shortcut
            return True
        return super().event(e)

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            e.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.save.emit()
        elif e.key() == Qt.Key.Key_Escape:
            self.cancel.emit()
        else:
            super().keyPressEvent(e)
            return
        e.accept()

    def resizeEvent(self, e: QResizeEvent) -> None:
        super().resizeEvent(e)
        self._fit()  # another width wraps the text into other lines

    def _fit(self) -> None:
        # The plain-text layout measures the document in lines (wrapped ones counted).
        lines = int(self.document().documentLayout().documentSize().height())
        lines = max(self.MIN_LINES, min(self.MAX_LINES, lines))
        # Text, the document's margin and the frame; a pixel short and a scroll bar shows.
        extra = 2 * self.document().documentMargin() + 2 * self.frameWidth() + 2
        self.setFixedHeight(int(lines * self.fontMetrics().lineSpacing() + extra))


class MessageEditor(QWidget):
    """The box with its Save and Cancel buttons and a line saying which keys do what."""

    saved = Signal(str)  # the text as it is in the box
    cancelled = Signal()

    def __init__(self, text: str, hint: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageEditor")
        self.box = EditBox(text)
        self.save_button = QPushButton("Save")
        self.save_button.setAccessibleName("Save the edit")
        self.save_button.setDefault(True)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Cancel the edit")
        self.hint = QLabel(hint)
        self.hint.setEnabled(False)  # dimmed, from the palette
        self.hint.setWordWrap(True)
        self.box.save.connect(self._save)
        self.box.cancel.connect(self.cancelled)
        self.save_button.clicked.connect(self._save)
        self.cancel_button.clicked.connect(self.cancelled)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.hint, 1)
        row.addWidget(self.cancel_button)
        row.addWidget(self.save_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        lay.addWidget(self.box)
        lay.addLayout(row)

    @property
    def text(self) -> str:
        return self.box.toPlainText()

    def set_saving_allowed(self, allowed: bool, why: str = "") -> None:
        """While a reply streams an edit cannot be answered: Save waits (the text stays)."""
        self.save_button.setEnabled(allowed)
        self.save_button.setToolTip("" if allowed else why)

    def _save(self) -> None:
        if self.save_button.isEnabled():
            self.saved.emit(self.text)


__all__ = ["EditBox", "MessageEditor"]
