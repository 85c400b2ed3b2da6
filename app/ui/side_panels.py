"""The chat page's side panels, and how they give way so the chat keeps its width.

The chat page has up to three panels beside the chat: the conversations sidebar (left), the
chat settings drawer and the performance panel (right). Each has a wish: shown, hidden, or
"auto" (never toggled: shown while there is room). On every resize `fit_panels` shows the
wished panels, the one opened last first, while the chat keeps at least CHAT_MIN px; the
others fold for the while (their wish stays, so a wider window shows them again). Each panel
is in a scroll area (`scrolled`), so a short window scrolls it rather than squeezing or
cutting it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from PySide6.QtWidgets import QFrame, QScrollArea, QVBoxLayout, QWidget

from app.ui.scroll_guard import guard_layout_requests

# The chat's least width beside panels that show by themselves: about 70 characters of its
# text a line.
CHAT_MIN = 540


def fit_panels(
    room: int,
    widths: Mapping[str, int],
    wishes: Mapping[str, bool | None],
    order: Sequence[str],
    least: int = 0,
) -> set[str]:
    """The panels to show in `room` px (the chat's and the panels' together). `order`: the
    panels by priority (the one opened last first); a panel wished hidden (False) stays
    hidden; the others are shown in that order while the chat keeps CHAT_MIN, but the one
    the user opened last only needs to leave the chat `least` (what its column cannot do
    without): in a small window, what was asked for shows."""
    shown: set[str] = set()
    left = room
    for i, key in enumerate(order):
        if wishes.get(key) is False or key not in widths:
            continue
        need = least if i == 0 and wishes.get(key) is True else max(CHAT_MIN, least)
        if left - widths[key] >= need:
            shown.add(key)
            left -= widths[key]
    return shown


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


def page_of(area: QScrollArea) -> QWidget | None:
    """The page a `scrolled` area shows."""
    holder = area.widget()
    return holder.page if isinstance(holder, _Holder) else holder


def content_width(area: QScrollArea) -> int:
    """The width `area` needs to show its page without scrolling sideways."""
    page = area.widget()
    if page is None:
        return 0
    bar = area.verticalScrollBar().sizeHint().width()
    return page.minimumSizeHint().width() + bar + 2 * area.frameWidth()
