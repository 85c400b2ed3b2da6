"""The composer under the chat: the message box, Attach, Speak (voice input: voice_input.py),
a live token count of the draft and one Send button that turns into Stop while an answer is
written.

The count uses whatever counter the window hands in (the loaded model's tokenizer; an
estimate without one). It runs on a short debounce timer after the last keystroke, never per
key: tokenizing a long draft on every key would make typing lag on a busy machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEvent, QMimeData, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QHideEvent, QImage, QKeyEvent, QPainter, QPaintEvent, QPalette, QPen
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.ui.attacher import Attacher
from app.ui.voice_input import VoiceInput

CountTokens = Callable[[str], int]
COUNT_DELAY_MS = 250  # after the last keystroke


class ChatInput(QPlainTextEdit):
    """Enter sends; Shift+Enter inserts a new line. Files dropped or pasted (file links, or a
    picture with no text) are attachments, not text. Up in an empty box goes to the last
    message (`up_from_empty`), as in other chat apps."""

    submitted = Signal(str)
    files_dropped = Signal(object)  # list[Path]
    image_pasted = Signal(object)  # QImage
    up_from_empty = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPlaceholderText("Ask anything — Enter sends, Shift+Enter adds a line")
        self.setAccessibleName("Message input")
        self.setTabChangesFocus(True)
        # As tall as what is typed, from two lines up to MAX_LINES, then it scrolls.
        self.setSizePolicy(self.sizePolicy().horizontalPolicy(), QSizePolicy.Policy.Fixed)
        self.document().documentLayout().documentSizeChanged.connect(self.fit_height)
        self.fit_height()

    MIN_LINES, MAX_LINES = 2, 8

    def fit_height(self, *_: object) -> None:
        # A plain text document's height is in lines (wrapped lines included).
        lines = self.document().documentLayout().documentSize().height()
        lines = min(max(int(lines), self.MIN_LINES), self.MAX_LINES)
        margins = self.contentsMargins()
        extra = margins.top() + margins.bottom() + 2 * int(self.document().documentMargin())
        height = lines * self.fontMetrics().lineSpacing() + extra
        if height != self.height() or self.minimumHeight() != height:
            self.setFixedHeight(height)

    def event(self, e: QEvent) -> bool:
        # Ctrl+K deletes to the end of the line in Qt's text boxes on some desktops; here it
        # is the command palette's, as in other chat apps, so the box lets it through.
        if (
            e.type() == QEvent.Type.ShortcutOverride
            and isinstance(e, QKeyEvent)
            and e.key() == Qt.Key.Key_K
            and e.modifiers() == Qt.KeyboardModifier.ControlModifier
        ):
            e.ignore()
            return True
        return super().event(e)

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            e.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            text = self.toPlainText().strip()
            if text:
                self.submitted.emit(text)
            e.accept()
            return
        if e.key() == Qt.Key.Key_Up and not self.toPlainText():
            self.up_from_empty.emit()
            e.accept()
            return
        super().keyPressEvent(e)

    @staticmethod
    def _files(source: QMimeData) -> list[Path]:
        return [Path(u.toLocalFile()) for u in source.urls() if u.isLocalFile()]

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        if self._files(source) or source.hasImage():
            return True
        return super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        files = self._files(source)
        if files:
            self.files_dropped.emit(files)
        elif source.hasImage() and not source.hasText():
            image = source.imageData()
            if isinstance(image, QImage) and not image.isNull():
                self.image_pasted.emit(image)
        else:
            super().insertFromMimeData(source)


class Composer(QFrame):
    """The box and its row of controls, drawn as one rounded field in palette colours."""

    def __init__(
        self, attacher: Attacher, voice: VoiceInput | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setObjectName("composer")
        self.setAccessibleName("Composer")
        self.input = ChatInput()
        self.input.setFrameShape(QFrame.Shape.NoFrame)
        self.input.fit_height()  # its frame is gone: its height changes with it
        # The box sits on the composer's own fill, not a second white rectangle.
        self.input.viewport().setAutoFillBackground(False)
        self.attach_button = attacher.button
        self.attach_button.setFlat(True)
        # Its width never counts toward the chat's least width (that folds side panels).
        self.token_label = QLabel()
        self.token_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.token_label.setObjectName("draftTokens")
        self.token_label.setAccessibleName("Tokens in the message")
        self.token_label.setToolTip("What the message costs in the loaded model's tokens")
        self.token_label.setEnabled(False)  # dimmed, from the palette
        # Send and Stop share one place: only one of them shows, Stop while a reply runs.
        self.send_button = QPushButton("Send")
        self.send_button.setAccessibleName("Send message")
        self.send_button.setDefault(False)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setAccessibleName("Stop generating")
        self.stop_button.setToolTip("Stop generating (Esc)")
        for b in (self.attach_button, self.send_button, self.stop_button):
            b.setMinimumWidth(60)  # under the style's 80: a narrow chat keeps its panels
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.attach_button)
        if voice is not None:  # Speak, and while it records the level and the time
            voice.box = self.input
            voice.button.setFlat(True)
            voice.button.setMinimumWidth(60)
            row.addWidget(voice.button)
            row.addWidget(voice.meter)
            row.addWidget(voice.time_label)
        row.addWidget(self.token_label, 1)  # the room between Attach and Send
        row.addWidget(self.send_button)
        row.addWidget(self.stop_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 8, 6)
        lay.setSpacing(2)
        lay.addWidget(self.input)
        lay.addLayout(row)

        self.token_counter: CountTokens | None = None
        self._count_timer = QTimer(self)
        self._count_timer.setSingleShot(True)
        self._count_timer.setInterval(COUNT_DELAY_MS)
        self._count_timer.timeout.connect(self.count_now)
        self.input.textChanged.connect(self._draft_changed)
        self.set_busy(False)
        self._focus_within = False
        app = QApplication.instance()
        if isinstance(app, QApplication):
            app.focusChanged.connect(self._on_focus_changed)

    def set_busy(self, busy: bool, paused: str | None = None) -> None:
        """A reply on its way: Stop in Send's place. `paused`: why sending waits (Send is
        shown disabled with that reason as its tooltip)."""
        # The keyboard stays on the place: Send's focus goes to Stop and back.
        had_focus = self.send_button.hasFocus() or self.stop_button.hasFocus()
        self.stop_button.setEnabled(busy)
        self.stop_button.setVisible(busy)
        self.send_button.setVisible(not busy)
        self.send_button.setEnabled(not busy and paused is None)
        self.send_button.setToolTip(paused or "Send (Enter)")
        if had_focus:
            (self.stop_button if busy else self.send_button).setFocus()

    def set_token_counter(self, counter: CountTokens | None) -> None:
        self.token_counter = counter
        self._draft_changed()

    def _draft_changed(self) -> None:
        if not self.input.toPlainText().strip():
            self._count_timer.stop()
            self.token_label.setText("")
            return
        if self.token_counter is not None:
            self._count_timer.start()

    def count_now(self) -> int | None:
        """Count the draft now (the timer's job; tests call it). None: nothing to count."""
        self._count_timer.stop()
        text = self.input.toPlainText()
        if not text.strip() or self.token_counter is None:
            self.token_label.setText("")
            return None
        n = self.token_counter(text)
        self.token_label.setText(f"~{n:,} token{'s' if n != 1 else ''}")
        return n

    def hideEvent(self, e: QHideEvent) -> None:
        self._count_timer.stop()  # counted again on the next keystroke
        super().hideEvent(e)

    def _on_focus_changed(self, _old: QWidget | None, new: QWidget | None) -> None:
        inside = new is not None and (new is self or self.isAncestorOf(new))
        if inside != self._focus_within:
            self._focus_within = inside
            self.update()

    def changeEvent(self, e: QEvent) -> None:
        if e.type() == QEvent.Type.PaletteChange:
            self.update()
        super().changeEvent(e)

    def paintEvent(self, e: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        role = QPalette.ColorRole.Highlight if self._focus_within else QPalette.ColorRole.Mid
        p.setPen(QPen(pal.color(role), 1.5 if self._focus_within else 1.0))
        p.setBrush(pal.color(QPalette.ColorRole.Base))
        p.drawRoundedRect(QRectF(self.rect()).adjusted(1, 1, -1, -1), 10, 10)
        p.end()


__all__ = ["COUNT_DELAY_MS", "ChatInput", "Composer", "CountTokens"]
