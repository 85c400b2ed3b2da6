"""A word-wrapped rich-text label that remembers its sizes until its text, format or font change.

`QLabel` with rich text lays its whole document out again for every size question
(`sizeHint`, `minimumSizeHint`, `heightForWidth`), and a layout asks them of every label in
it whenever one of them changes. While an answer streams only its last paragraph changes, yet
each update laid out and repainted every paragraph above it. Measured offscreen on 2 EPYC
cores with six paragraphs: 2.8 ms of GUI-thread time per update, 0.8 ms with the sizes kept.
The paragraph that grows keeps its widths too (see `setText`).

`hint_at_own_width` is the same idea one level up, for the widgets that hold paragraphs.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QMargins, QSize, Qt
from PySide6.QtWidgets import QLabel, QWidget

# Changes after which every remembered size may be wrong.
_RESIZING_EVENTS = frozenset(
    {
        QEvent.Type.FontChange,
        QEvent.Type.StyleChange,
        QEvent.Type.ContentsRectChange,
        QEvent.Type.LayoutDirectionChange,
    }
)


class ProseLabel(QLabel):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._heights: dict[int, int] = {}
        self._hint: QSize | None = None
        self._least: QSize | None = None

    def forget_sizes(self) -> None:
        self._heights.clear()
        self._hint = self._least = None

    def setText(self, text: str) -> None:
        old = self.text()
        if text != old:
            if old and text.startswith(old):
                # A streamed paragraph growing: only its height at a width changes. Its
                # preferred and least widths (the longest line, the longest word) stay as
                # they were until it is set anew; asking Qt for them lays the whole text
                # out twice more, at widths no one shows.
                self._heights.clear()
            else:
                self.forget_sizes()
        super().setText(text)

    def setTextFormat(self, fmt: Qt.TextFormat) -> None:
        if fmt != self.textFormat():
            self.forget_sizes()
        super().setTextFormat(fmt)

    def setWordWrap(self, on: bool) -> None:
        self.forget_sizes()
        super().setWordWrap(on)

    def changeEvent(self, e: QEvent) -> None:
        if e.type() in _RESIZING_EVENTS:
            self.forget_sizes()
        super().changeEvent(e)

    def heightForWidth(self, width: int) -> int:
        height = self._heights.get(width)
        if height is None:
            if len(self._heights) > 16:  # a window resized by hand asks many widths
                self._heights.clear()
            height = self._heights[width] = super().heightForWidth(width)
        return height

    def sizeHint(self) -> QSize:
        if self._hint is None:
            self._hint = super().sizeHint()
        return QSize(self._hint)

    def minimumSizeHint(self) -> QSize:
        if self._least is None:
            self._least = super().minimumSizeHint()
        return QSize(self._least)


def hint_at_own_width(widget: QWidget) -> QSize | None:
    """`widget`'s size hint from its layout's hints alone, without Qt's height-for-width step.

    For a widget whose layout has height-for-width, `QWidget.sizeHint` lays the layout out
    again at the hint's width to get its height, and Qt asks the hint of every message and
    body on each token update: the paragraph that grows was laid out at two widths no one
    sees (its hint width and its minimum width) besides the one shown. In the chat's list a
    height-for-width child is placed by its height at the real width alone, so the hint's
    height is not used there. For a widget without a layout: None (use Qt's hint).
    """
    layout = widget.layout()
    if layout is None:
        return None
    m: QMargins = widget.contentsMargins()
    return layout.sizeHint() + QSize(m.left() + m.right(), m.top() + m.bottom())
