"""The Compare quants scatter (pyqtgraph): each file a marker at its generation speed (x,
tokens/s) and quality loss (y, mean KL divergence from the reference), its area growing with
the memory its estimate needs (the file's size where there is no estimate), labelled with its
type. The user's limits are a dashed line each (KL divergence at most, speed at least); the
chosen file is ringed. A file whose speed is not known sits at x = 0, hollow."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyqtgraph as pg  # type: ignore[import-untyped]
from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QVBoxLayout, QWidget

from engine.bench.quant_choice import QuantChoice

MIN_SIZE, MAX_SIZE = 10.0, 42.0  # marker diameters, px
COLORS = {False: ("#4e79a7", "#e15759"), True: ("#8cb8ea", "#ff8a80")}  # marker, chosen


@dataclass(frozen=True)
class Point:
    name: str
    label: str
    x: float  # tokens/s; 0 when unknown
    y: float  # mean KL divergence
    size: float  # marker diameter
    memory_bytes: int
    known_speed: bool
    chosen: bool


def points_of(choice: QuantChoice) -> list[Point]:
    """The markers: diameter by the square root of the memory (area ~ bytes) between the
    smallest and the largest file's."""
    mems = [o.memory.total_bytes or o.size_bytes for o in choice.options]
    lo, hi = (min(mems), max(mems)) if mems else (0, 0)
    out = []
    for o, mem in zip(choice.options, mems, strict=True):
        frac = (
            0.0 if hi == lo else (math.sqrt(mem) - math.sqrt(lo)) / (math.sqrt(hi) - math.sqrt(lo))
        )
        tps = o.speed.tokens_per_s
        out.append(
            Point(
                name=o.name,
                label=("reference " if o.reference else "") + (o.quantization or o.name),
                x=tps if tps is not None else 0.0,
                y=o.kld_mean,
                size=MIN_SIZE + frac * (MAX_SIZE - MIN_SIZE),
                memory_bytes=mem,
                known_speed=tps is not None,
                chosen=o.name == choice.chosen,
            )
        )
    return out


class QuantScatter(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._choice: QuantChoice | None = None
        self.points: list[Point] = []
        self.view = pg.PlotWidget()
        self.view.setAccessibleName("Quality loss against speed chart")
        self.view.setToolTip(
            "Each file: its generation speed (right is faster) and its quality loss, the mean "
            "KL divergence from the reference (lower is better); the larger the marker, the "
            "more memory it needs. Dashed: your limits. Ringed: the recommendation."
        )
        self.view.setMinimumHeight(260)
        self.plot = self.view.getPlotItem()
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.showGrid(x=True, y=True, alpha=0.2)
        self.plot.setLabel("bottom", "Generation speed", units="tokens/s")
        self.plot.setLabel("left", "Mean KL divergence", units="nats")
        for name in ("left", "bottom"):
            self.plot.getAxis(name).enableAutoSIPrefix(False)
        self.scatter = pg.ScatterPlotItem(pxMode=True)
        self.ring = pg.ScatterPlotItem(pxMode=True)
        self.plot.addItem(self.scatter)
        self.plot.addItem(self.ring)
        dash = Qt.PenStyle.DashLine
        self.kld_line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(width=1, style=dash))
        self.speed_line = pg.InfiniteLine(
            angle=90, movable=False, pen=pg.mkPen(width=1, style=dash)
        )
        self.plot.addItem(self.kld_line)
        self.plot.addItem(self.speed_line)
        self.labels: list[pg.TextItem] = []
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.view)
        self.apply_palette()

    def sizeHint(self) -> QSize:
        return QSize(900, 340)

    def show_choice(self, choice: QuantChoice | None) -> None:
        self._choice = choice
        for item in self.labels:
            self.plot.removeItem(item)
        self.labels = []
        self.points = points_of(choice) if choice is not None else []
        colors = COLORS[self.palette().color(QPalette.ColorRole.Base).lightness() < 128]
        fill, pick = QColor(colors[0]), QColor(colors[1])
        spots = []
        for p in self.points:
            brush = pg.mkBrush(fill) if p.known_speed else pg.mkBrush(None)
            spots.append(
                {
                    "pos": (p.x, p.y),
                    "size": p.size,
                    "brush": brush,
                    "pen": pg.mkPen(fill, width=1.5),
                }
            )
            text = pg.TextItem(p.label, color=self.palette().color(QPalette.ColorRole.Text))
            # Centred above the marker, clear of it (the anchor is in the text's heights).
            height = max(text.boundingRect().height(), 1.0)
            text.setAnchor((0.5, 1.0 + (p.size / 2 + 1) / height))
            text.setPos(p.x, p.y)
            self.plot.addItem(text)
            self.labels.append(text)
        self.scatter.setData(spots)
        chosen = [p for p in self.points if p.chosen]
        self.ring.setData(
            [
                {
                    "pos": (p.x, p.y),
                    "size": p.size + 10,
                    "brush": pg.mkBrush(None),
                    "pen": pg.mkPen(pick, width=2.5),
                }
                for p in chosen
            ]
        )
        t = choice.thresholds if choice is not None else None
        self.kld_line.setVisible(t is not None and t.max_kld is not None)
        self.speed_line.setVisible(t is not None and t.min_tokens_per_s is not None)
        if t is not None and t.max_kld is not None:
            self.kld_line.setValue(t.max_kld)
        if t is not None and t.min_tokens_per_s is not None:
            self.speed_line.setValue(t.min_tokens_per_s)
        self._fit(t.max_kld if t else None, t.min_tokens_per_s if t else None)

    def _fit(self, max_kld: float | None, min_tps: float | None) -> None:
        """Room for the markers, the labels and the limit lines, from 0 on both axes."""
        xs = [p.x for p in self.points] + ([min_tps] if min_tps is not None else [])
        ys = [p.y for p in self.points] + ([max_kld] if max_kld is not None else [])
        x_hi = max(xs, default=1.0) or 1.0
        y_hi = max(ys, default=0.01) or 0.01
        # Below 0 a little: the reference (KL divergence 0) shows whole, not cut by the axis.
        self.plot.setXRange(0, x_hi * 1.25, padding=0)
        self.plot.setYRange(-0.08 * y_hi, y_hi * 1.25, padding=0)

    def apply_palette(self) -> None:
        pal = self.palette()
        base = pal.color(QPalette.ColorRole.Base)
        text = pal.color(QPalette.ColorRole.Text)
        grid = pal.color(QPalette.ColorRole.Mid)
        self.view.setBackground(base)
        for name in ("left", "bottom"):
            axis = self.plot.getAxis(name)
            axis.setPen(grid)
            axis.setTextPen(text)
        for line in (self.kld_line, self.speed_line):
            line.setPen(pg.mkPen(text, width=1, style=Qt.PenStyle.DashLine))

    def changeEvent(self, e: QEvent) -> None:
        super().changeEvent(e)
        if e.type() == QEvent.Type.PaletteChange:
            self.apply_palette()
            self.show_choice(self._choice)
