"""The navigation rail: a narrow column of icon-and-label buttons, one per page of the window
(Chat, Models, Downloads, Documents, Local server, Benchmark), as chat apps put it.

Each button is checkable and exclusive, reachable with Tab and the arrow keys, and has an
accessible name. The icons are drawn here from the palette's text colour, so they follow a
light or dark palette without image files and look the same on every platform.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QKeyEvent, QPainter, QPainterPath, QPen, QPixmap
from PySide6.QtWidgets import (
    QButtonGroup,
    QFrame,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

ICON = 22  # px, drawn at the screen's pixel ratio

Painter = Callable[[QPainter, float], None]


def _chat(p: QPainter, s: float) -> None:
    path = QPainterPath()
    path.addRoundedRect(QRectF(2, 3, s - 4, s * 0.62), 4, 4)
    tail = QPainterPath()
    tail.moveTo(6, 3 + s * 0.62 - 1)
    tail.lineTo(5, s - 2)
    tail.lineTo(11, 3 + s * 0.62 - 1)
    p.drawPath(path.united(tail))


def _models(p: QPainter, s: float) -> None:
    for i in range(3):  # stacked layers: the library of model files
        y = 4 + i * (s - 8) / 3
        p.drawRoundedRect(QRectF(3, y, s - 6, (s - 8) / 3 - 2), 2, 2)


def _downloads(p: QPainter, s: float) -> None:
    m = s / 2
    p.drawLine(QPointF(m, 3), QPointF(m, s - 8))
    p.drawPolyline([QPointF(m - 5, s - 13), QPointF(m, s - 8), QPointF(m + 5, s - 13)])
    p.drawLine(QPointF(4, s - 3), QPointF(s - 4, s - 3))


def _documents(p: QPainter, s: float) -> None:
    fold = 6
    p.drawPolygon(
        [
            QPointF(5, 2),
            QPointF(s - 5 - fold, 2),
            QPointF(s - 5, 2 + fold),
            QPointF(s - 5, s - 2),
            QPointF(5, s - 2),
        ]
    )
    for y in (9.0, 13.0, 17.0):
        p.drawLine(QPointF(8, y), QPointF(s - 8, y))


def _server(p: QPainter, s: float) -> None:
    for y in (3.0, s / 2 + 1):
        p.drawRoundedRect(QRectF(3, y, s - 6, s / 2 - 4), 2, 2)
        p.drawPoint(QPointF(7, y + (s / 2 - 4) / 2))


def _benchmark(p: QPainter, s: float) -> None:
    p.drawLine(QPointF(3, s - 3), QPointF(s - 3, s - 3))
    for i, h in enumerate((0.35, 0.6, 0.85)):
        x = 5 + i * (s - 10) / 3
        p.drawRect(QRectF(x, s - 3 - h * (s - 6), (s - 10) / 3 - 2, h * (s - 6)))


def _sidebar(p: QPainter, s: float) -> None:
    p.drawRoundedRect(QRectF(2, 3, s - 4, s - 6), 2, 2)
    p.drawLine(QPointF(8, 3), QPointF(8, s - 3))


def _drawer(p: QPainter, s: float) -> None:
    for i, knob in enumerate((0.3, 0.7, 0.45)):  # sliders: the chat's settings
        y = 5 + i * (s - 10) / 2
        p.drawLine(QPointF(3, y), QPointF(s - 3, y))
        p.drawEllipse(QPointF(3 + knob * (s - 6), y), 2.2, 2.2)


def _perf(p: QPainter, s: float) -> None:
    p.drawPolyline([QPointF(2, s - 5), QPointF(7, s - 10), QPointF(11, s - 7), QPointF(s - 3, 4)])
    p.drawLine(QPointF(2, s - 2), QPointF(s - 2, s - 2))


ICONS: dict[str, Painter] = {
    "sidebar": _sidebar,
    "drawer": _drawer,
    "perf": _perf,
    "chat": _chat,
    "models": _models,
    "downloads": _downloads,
    "documents": _documents,
    "server": _server,
    "benchmark": _benchmark,
}


def rail_icon(kind: str, colour: QColor, ratio: float = 1.0) -> QIcon:
    """The rail's icon `kind` (a key of ICONS; an unknown one is a blank square) in `colour`."""
    pix = QPixmap(int(ICON * ratio), int(ICON * ratio))
    pix.setDevicePixelRatio(ratio)
    pix.fill(Qt.GlobalColor.transparent)
    p = QPainter(pix)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    pen = QPen(colour, 1.6)
    pen.setCapStyle(Qt.PenCapStyle.RoundCap)
    pen.setJoinStyle(Qt.PenJoinStyle.RoundJoin)
    p.setPen(pen)
    draw = ICONS.get(kind)
    if draw is not None:
        draw(p, float(ICON))
    p.end()
    return QIcon(pix)


class NavRail(QFrame):
    """The rail's buttons; `current_changed(key)` when the user picks a page."""

    current_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("navRail")
        self.setAccessibleName("Pages")
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Preferred)
        self.group = QButtonGroup(self)
        self.group.setExclusive(True)
        self.buttons: dict[str, QToolButton] = {}
        self._icons: dict[str, str] = {}
        self._ranks: dict[str, int] = {}
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(4, 6, 4, 6)
        self._lay.setSpacing(2)
        self._lay.addStretch(1)

    def add(self, key: str, label: str, icon: str, tip: str = "", rank: int = 99) -> QToolButton:
        """A button for the page `key`, among the others by `rank` (lowest on top), above
        the stretch (so the rail's top fills first)."""
        b = QToolButton()
        b.setText(label)
        b.setAccessibleName(label)
        b.setToolTip(tip or label)
        b.setCheckable(True)
        b.setAutoRaise(True)
        b.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextUnderIcon)
        b.setIconSize(QSize(ICON, ICON))
        b.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        b.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        b.clicked.connect(lambda _checked=False, k=key: self._picked(k))
        b.installEventFilter(self)
        self.group.addButton(b)
        self.buttons[key] = b
        self._icons[key] = icon
        place = sum(1 for r in self._ranks.values() if r <= rank)
        self._ranks[key] = rank
        self._lay.insertWidget(place, b)
        self._paint_icon(key)
        self.setFixedWidth(max(self.sizeHint().width(), 76))
        return b

    def keys(self) -> list[str]:
        """The pages' keys, top to bottom."""
        return sorted(self.buttons, key=lambda k: self._ranks[k])

    def current(self) -> str:
        for key, b in self.buttons.items():
            if b.isChecked():
                return key
        return ""

    def set_current(self, key: str) -> None:
        """Show `key` as the current page (no signal)."""
        b = self.buttons.get(key)
        if b is not None:
            b.setChecked(True)

    def _picked(self, key: str) -> None:
        self.set_current(key)
        self.current_changed.emit(key)

    def _paint_icon(self, key: str) -> None:
        colour = self.palette().color(self.foregroundRole())
        self.buttons[key].setIcon(rail_icon(self._icons[key], colour, self.devicePixelRatioF()))

    def changeEvent(self, e: QEvent) -> None:
        if e.type() == QEvent.Type.PaletteChange:  # light <-> dark: icons in the new colour
            for key in self.buttons:
                self._paint_icon(key)
        super().changeEvent(e)

    def eventFilter(self, obj: QObject, e: QEvent) -> bool:
        # Up/Down move between the rail's buttons (Tab still leaves the rail).
        if e.type() == QEvent.Type.KeyPress and isinstance(obj, QToolButton):
            assert isinstance(e, QKeyEvent)
            keys = self.keys()
            here = [k for k in keys if self.buttons[k] is obj]
            if here and e.key() in (Qt.Key.Key_Up, Qt.Key.Key_Down):
                step = -1 if e.key() == Qt.Key.Key_Up else 1
                nxt = keys[(keys.index(here[0]) + step) % len(keys)]
                self.buttons[nxt].setFocus(Qt.FocusReason.TabFocusReason)
                return True
        return super().eventFilter(obj, e)
