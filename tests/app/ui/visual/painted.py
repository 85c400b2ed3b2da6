"""What the screen shows: the chat viewport grabbed from the X server, and where the last
message sits in it. Checks return problems (empty when the end of the chat is in view), so a
failure says what was wrong instead of a bare False."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PySide6.QtCore import QPoint, QRect
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication, QWidget

from app.ui.chat_view import ChatView

# A pixel is ink when one of its channels differs this much from the background's.
INK_DELTA = 64
# Anti-aliased text of one line covers a few percent of its box; an empty box none.
MIN_INK_SHARE = 0.01


def grab_screen(w: QWidget) -> QImage:
    """The pixels the X server holds for `w`'s area (not a re-render of the widget). `w` is
    repainted first, so the screen shows its geometry as it is now, not one event behind."""
    w.repaint()
    QApplication.sync()
    pos = w.mapToGlobal(QPoint(0, 0))
    return w.screen().grabWindow(0, pos.x(), pos.y(), w.width(), w.height()).toImage()


def ink_mask(img: QImage) -> np.ndarray:
    """True where a pixel differs from the image's most common colour (its background)."""
    img = img.convertToFormat(QImage.Format.Format_RGB32)
    h, w = img.height(), img.width()
    raw = np.frombuffer(img.constBits(), np.uint8).reshape(h, img.bytesPerLine())
    px = raw[:, : w * 4].reshape(h, w, 4)[:, :, :3].astype(np.int16)
    flat = px.reshape(-1, 3)
    colours, counts = np.unique(flat, axis=0, return_counts=True)
    bg = colours[counts.argmax()]
    return np.asarray(np.abs(px - bg).max(axis=2) > INK_DELTA)


def ink_share(mask: np.ndarray, r: QRect) -> float:
    box = mask[max(r.top(), 0) : r.bottom() + 1, max(r.left(), 0) : r.right() + 1]
    return float(box.mean()) if box.size else 0.0


def end_of_chat_problems(view: ChatView, shot: Path) -> list[str]:
    """Why the end of the conversation is not on screen: the last message's last block must
    end inside the viewport, nothing but the list's margin may lie below the last message
    when the chat is taller than the viewport (a short chat starts at the top), and the
    screen must show ink in that block. Saves the grab to `shot`."""
    vp = view.scroll_area.viewport()
    last = view.message_widgets[-1]
    tail = last.body.widgets[-1]
    tail_rect = QRect(tail.mapTo(vp, QPoint(0, 0)), tail.size())
    below = vp.height() - last.mapTo(vp, QPoint(0, last.height())).y()
    margin = view.scroll_area.widget().layout().contentsMargins().bottom()
    img = grab_screen(vp)
    img.save(str(shot))
    problems = []
    if not 0 < tail_rect.bottom() < vp.height():
        problems.append(
            f"the last text block ends at y={tail_rect.bottom()}, outside the "
            f"viewport (0..{vp.height()})"
        )
    scrolls = view.scroll_area.verticalScrollBar().maximum() > 0
    if scrolls and below > margin + 2:
        problems.append(f"{below} px of empty space below the last message (margin {margin})")
    visible = tail_rect.intersected(vp.rect())
    share = ink_share(ink_mask(img), visible)
    if share < MIN_INK_SHARE:
        problems.append(
            f"the screen shows {share:.1%} ink where the last text block is "
            f"({visible.getRect()}): nothing painted there"
        )
    return [f"{p} (screenshot {shot})" for p in problems]
