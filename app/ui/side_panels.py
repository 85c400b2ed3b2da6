"""The main window's columns: side panels that give way so the chat keeps its width.

QSplitter keeps widgets without stretch at their width and takes a narrower window out of
the stretched one: at 1000 px the chat shrank to a third while both side panels kept theirs.
`PanelSplitter` does the opposite on every resize (`fit`): the side panels shrink first,
toward the width their content needs, then the performance panel (right) folds away, and
the chat keeps at least CHAT_SHARE. The widths the user gave the sides (dragging a handle,
or saved) are what they grow back to in a wider window. `SideTabs` puts each side page in a
scroll area, so a short window scrolls a page rather than squeezing or cutting it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QFrame,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.ui.scroll_guard import guard_layout_requests

# The chat's least width: this share of the panes, at most CHAT_ENOUGH px. In a 1000 px
# window that is 550 px, 75-80 characters of the chat's text a line (a comfortable measure);
# past 600 px more width helps the side panels more than the chat.
CHAT_SHARE = 0.5625
CHAT_ENOUGH = 600


def fit(total: int, want: tuple[int, int], need: tuple[int, int]) -> tuple[int, int, int]:
    """Widths of (left, chat, right) for `total` px of panes. The sides get the widths
    wanted (0: folded) while the chat keeps its least width; else both shrink toward `need`
    (their content's width) in proportion to what they have above it; if even that leaves
    the chat too little, the right one folds and the left takes the room, down to its need."""
    left, right = want
    room = total - min(math.ceil(CHAT_SHARE * total), CHAT_ENOUGH)
    if left + right <= room:
        return left, total - left - right, right
    need_l, need_r = min(need[0], left), min(need[1], right)
    if right and need_l + need_r <= room:
        above_l, above_r = left - need_l, right - need_r  # > 0 together: left+right > room
        l_ = need_l + (room - need_l - need_r) * above_l // (above_l + above_r)
        return l_, total - room, room - l_
    l_ = min(left, max(room, need_l))
    return l_, total - l_, 0


class PanelSplitter(QSplitter):
    """Three panes: left side panel, chat, right side panel (see `fit`). `needs` tells the
    sides' content widths at the moment of a resize."""

    def __init__(self, needs: Callable[[], tuple[int, int]], parent: QWidget | None = None) -> None:
        super().__init__(Qt.Orientation.Horizontal, parent)
        self._needs = needs
        self.want = (0, 0)
        self.splitterMoved.connect(lambda _pos, _i: self.remember())

    def remember(self) -> None:
        """The sides' widths now are the user's (after a drag or a restore)."""
        sizes = self.sizes()
        if len(sizes) == 3:
            self.want = (sizes[0], sizes[2])

    def setSizes(self, sizes: Sequence[int]) -> None:
        super().setSizes(sizes)
        if len(sizes) == 3:
            self.want = (sizes[0], sizes[2])

    def refit(self) -> None:
        if self.count() != 3 or self.width() <= 0:
            return
        total = self.width() - 2 * self.handleWidth()
        left, chat, right = fit(total, self.want, self._needs())
        super().setSizes([left, chat, right])

    def resizeEvent(self, e: QResizeEvent) -> None:
        super().resizeEvent(e)
        self.refit()


class _Holder(QWidget):
    """A scrolled page's holder. QScrollArea gives a page with wrapping text its preferred
    height for the width, and scrolls when the view is shorter, though the page would fit;
    this holder asks for its minimum height instead."""

    def __init__(self, page: QWidget) -> None:
        super().__init__()
        self.page = page
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(page)

    def heightForWidth(self, width: int) -> int:
        lay = self.layout()
        return lay.totalMinimumHeightForWidth(width) if lay is not None else -1


def scrolled(page: QWidget) -> QScrollArea:
    """`page` in a frameless scroll area that gives it the whole view when it fits."""
    area = QScrollArea()
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setWidgetResizable(True)
    area.setWidget(_Holder(page))
    # A figure's new text asks for a layout that reaches the viewport, and the area answers
    # it by re-placing and repainting the whole page (the performance chart too) on every
    # tick; let through only the requests that change the page's size.
    guard_layout_requests(area)
    return area


def content_width(area: QScrollArea) -> int:
    """The width `area` needs to show its page without scrolling sideways."""
    page = area.widget()
    if page is None:
        return 0
    bar = area.verticalScrollBar().sizeHint().width()
    return page.minimumSizeHint().width() + bar + 2 * area.frameWidth()


class SideTabs(QTabWidget):
    """Tabs whose pages scroll (`add_page`); a page is found by itself, not its scroll
    area (`setCurrentWidget`, `indexOf`, `page`)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._areas: dict[QWidget, QScrollArea] = {}

    def add_page(self, page: QWidget, title: str) -> int:
        area = scrolled(page)
        self._areas[page] = area
        return self.addTab(area, title)

    def setCurrentWidget(self, widget: QWidget) -> None:
        super().setCurrentWidget(self._areas.get(widget, widget))

    def indexOf(self, widget: QWidget) -> int:
        return super().indexOf(self._areas.get(widget, widget))

    def page(self, index: int) -> QWidget | None:
        area = self.widget(index)
        holder = area.widget() if isinstance(area, QScrollArea) else None
        return holder.page if isinstance(holder, _Holder) else area

    def need(self) -> int:
        """The width the current page needs, with the tab frame around it."""
        area = self.currentWidget()
        if not isinstance(area, QScrollArea):
            return self.minimumSizeHint().width()
        frame = self.width() - area.width()  # the tab frame, once laid out
        if not 0 <= frame <= 40:
            frame = 8
        return content_width(area) + frame
