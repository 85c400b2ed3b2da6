"""The paragraph an answer is writing now: Markdown drawn from one document, laid out once
per new text.

A word-wrapped rich-text `QLabel` lays its document out three times for each height it is
asked (at its shown width, at the asked width, then back: `QTextDocument.setTextWidth`
always lays out again), and while an answer streams it is asked once per token update.
Profiled offscreen on 2 EPYC cores, those layouts were most of an update's GUI-thread time,
and on 2 cores that time is taken from llama.cpp's decode threads.

This widget owns its document and lays it out only when its text or its width change. It is
shown for the last paragraph of a streaming answer only: it has none of a label's text
interaction (selecting, clicking links), which a paragraph still being written does not
need. When the paragraph is finished, `MarkdownBody` shows it as a `ProseLabel` again.

Screen readers learn its text as its accessible description, told at most twice a second
(`ACCESSIBLE_INTERVAL_MS`), not per token: each change is an event a reader may speak.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, QSize, QTimer
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QHideEvent,
    QPainter,
    QPaintEvent,
    QPalette,
    QTextDocument,
)
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.ui.code_highlight import style_inline_code

# Changes after which the document must be made again (its font, its colours).
_RESTYLING_EVENTS = frozenset({QEvent.Type.FontChange, QEvent.Type.PaletteChange})
ACCESSIBLE_INTERVAL_MS = 500


class StreamingProse(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = QTextDocument(self)
        self._doc.setDocumentMargin(0)  # as a QLabel shows its document
        self._doc.setUndoRedoEnabled(False)
        self._text = ""
        self._laid_out_at: int | None = None  # the width the document is laid out at
        self.layouts = 0  # how many times it was laid out (tests read this)
        policy = QSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        self.setAccessibleName("Answer being written")
        self._tell = QTimer(self)
        self._tell.setSingleShot(True)
        self._tell.setInterval(ACCESSIBLE_INTERVAL_MS)
        self._tell.timeout.connect(self.tell_readers)

    def tell_readers(self) -> None:
        """Give the text so far to screen readers (the timer's job; tests call it)."""
        self._tell.stop()
        text = self._doc.toPlainText()
        if text != self.accessibleDescription():
            self.setAccessibleDescription(text)

    def hideEvent(self, e: QHideEvent) -> None:
        if self._tell.isActive():
            self.tell_readers()
        super().hideEvent(e)

    def text(self) -> str:
        return self._text

    def setText(self, text: str) -> None:
        if text == self._text:
            return
        self._text = text
        self._fill()
        self.updateGeometry()
        self.update()
        if not self.isVisible():
            self.tell_readers()  # nobody hears an unshown paragraph: no timer left behind
        elif not self._tell.isActive():
            self._tell.start()

    def _fill(self) -> None:
        self._doc.setDefaultFont(self.font())
        self._doc.setMarkdown(self._text)
        if "`" in self._text:
            style_inline_code(self._doc, self.palette())
        self._laid_out_at = None

    def _layout_at(self, width: int) -> None:
        if width != self._laid_out_at:
            self._doc.setTextWidth(max(width, 1))
            self._laid_out_at = width
            self.layouts += 1

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        self._layout_at(width)
        return math.ceil(self._doc.size().height())

    def sizeHint(self) -> QSize:
        # Only the height at the shown width is used where it is shown (a height-for-width
        # child of the chat's list); laying it out at another width would undo the point.
        width = self.width() if self.width() > 1 else 40 * self.fontMetrics().averageCharWidth()
        return QSize(width, self.heightForWidth(width))

    def minimumSizeHint(self) -> QSize:
        return QSize(self.fontMetrics().averageCharWidth() * 8, self.fontMetrics().height())

    def paintEvent(self, e: QPaintEvent) -> None:
        self._layout_at(self.width())
        painter = QPainter(self)
        context = QAbstractTextDocumentLayout.PaintContext()
        palette = QPalette(self.palette())
        # Drawn in the colour a label of this widget would use (dimmed for a thinking block).
        palette.setColor(QPalette.ColorRole.Text, self.palette().color(self.foregroundRole()))
        context.palette = palette
        context.clip = e.rect().toRectF()
        layout = self._doc.documentLayout()
        layout.draw(painter, context)
        painter.end()

    def changeEvent(self, e: QEvent) -> None:
        super().changeEvent(e)
        if e.type() in _RESTYLING_EVENTS and self._text:
            self._fill()
            self.updateGeometry()
            self.update()
