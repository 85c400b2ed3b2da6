"""The performance panel's chart (pyqtgraph): generation speed and process RAM over time.

Two plots share one time axis (time since the panel started). The top one has a marker per
finished reply at its own rate, `GenerationStats.gen_tps`, the figure its footer shows (over
the reply's generation, a short segment at that height), so a short fast reply is a point at
its real speed however the timer's ticks fall; while a reply runs, a dashed line follows its
rolling rate, and the marker replaces it when the reply ends. The bottom plot is the process
RAM in MiB or GiB, the axis says which. "Since start" shows everything, "Last reply" the last
(or the running) reply.

The chart stores what it is given and draws only in `redraw()`, which the panel calls on its
timer tick: never per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyqtgraph as pg  # type: ignore[import-untyped]
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (
    QComboBox,
    QGraphicsItem,
    QHBoxLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)

SINCE_START, LAST_REPLY = "Since start", "Last reply"
# RAM samples kept; past it every other one is dropped (hours of ticks at full resolution).
MAX_SAMPLES = 20_000
SINCE_START_STEPS = 20  # the right edge of "since start" moves in steps of about 1/20 of it
MIN_SPAN_S = 30.0  # "since start" shows at least this much, so the first seconds are not stretched
# Tick steps that read well as m:ss (seconds).
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800)
# Series colours for a light and a dark background (the light ones are the old chart's).
COLORS = {False: {"tps": "#4e79a7", "ram": "#f28e2b"}, True: {"tps": "#8cb8ea", "ram": "#ffb25c"}}


@dataclass(frozen=True)
class Reply:
    """A finished reply, in seconds since the chart's start: request sent, first token, end,
    and its generation rate (tokens/s, as in its footer)."""

    start: float
    first: float
    end: float
    tps: float


def ram_unit(max_bytes: float) -> tuple[str, float]:
    """The RAM axis unit: MiB up to 2 GiB (the bundled model's process is a few hundred
    MiB), GiB above."""
    return ("GiB", float(2**30)) if max_bytes >= 2 * 2**30 else ("MiB", float(2**20))


def time_text(seconds: float) -> str:
    """m:ss, or h:mm:ss from an hour on."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def time_step(span: float, max_ticks: int) -> float:
    """The smallest step of TIME_STEPS that puts at most `max_ticks` ticks on `span` s."""
    for step in TIME_STEPS:
        if span / step <= max_ticks:
            return float(step)
    return float(TIME_STEPS[-1])


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 1.5, 2, 3, 5, 7.5 times a power of ten that is >= `value` (0 for 0):
    a y range that changes only when the data cross one of these, so a tick that moves the
    data a little leaves the axis as it was drawn."""
    if value <= 0:
        return 0.0
    power = 10.0 ** math.floor(math.log10(value))
    for m in (1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0):
        if value <= m * power * (1 + 1e-9):
            return m * power
    return 10.0 * power


def x_range(
    mode: str, now: float, replies: list[Reply], running_since: float | None
) -> tuple[float, float]:
    """The visible time range: [0, now] since start, or the last reply (the one running,
    else the last finished, with a margin); with no reply yet, since start."""
    if mode == LAST_REPLY and running_since is not None:
        return running_since, max(now, running_since + 5.0)
    if mode == LAST_REPLY and replies:
        r = replies[-1]
        pad = max(0.5, 0.1 * (r.end - r.start))
        return max(0.0, r.start - pad), r.end + pad
    # The right edge moves in whole steps of the time axis, not with every tick: while it
    # stays, the axes keep their drawing and a tick repaints only the curves (repainting both
    # plots' axes cost ~8 ms of GUI time per tick, taken from decoding on 2 cores).
    step = time_step(now, SINCE_START_STEPS)
    return 0.0, max(math.ceil(now / step) * step, MIN_SPAN_S)


class TimeAxis(pg.AxisItem):  # type: ignore[misc]
    """A time axis in m:ss with steps of whole seconds, minutes or hours."""

    def tickSpacing(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, float]]:
        span = maxVal - minVal
        if not span > 0:
            return list(super().tickSpacing(minVal, maxVal, size))
        return [(time_step(span, max(2, int(size // 55))), 0.0)]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        return [time_text(v) for v in values]


class PerfChart(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.replies: list[Reply] = []
        self.live: list[tuple[float, float]] = []  # the running reply: (time, rolling rate)
        self.ram: list[tuple[float, float]] = []  # (time, bytes)
        # What the plots show now (redraw sets only what differs).
        self._replies_drawn = 0
        self._live_drawn = False
        self._ram_unit: str | None = None
        self._ranges: tuple[tuple[float, float], ...] = ()
        self.running_since: float | None = None
        self.now = 0.0
        self.redraws = 0

        self.range_box = QComboBox()
        self.range_box.addItems([SINCE_START, LAST_REPLY])
        self.range_box.setAccessibleName("Chart time range")
        self.range_box.setToolTip("Everything since the app started, or the last reply")
        self.range_box.currentTextChanged.connect(lambda _t: self.redraw(self.now))
        self.view = pg.GraphicsLayoutWidget()
        self.view.setAccessibleName("Tokens per second and memory chart")
        self.view.setToolTip(
            "Dots: each reply's generation speed, as in its footer. Dashed: "
            "the reply in progress (rolling). Below: this process's RAM."
        )
        self.view.setMinimumHeight(190)
        self.view.ci.setContentsMargins(2, 4, 8, 2)
        self.speed = self.view.addPlot(row=0, col=0, axisItems={"bottom": TimeAxis("bottom")})
        self.memory = self.view.addPlot(row=1, col=0, axisItems={"bottom": TimeAxis("bottom")})
        self.memory.setXLink(self.speed)
        self.speed.setLabel("left", "Speed", units="tok/s")
        self.memory.setLabel("left", "RAM", units="MiB")
        self.memory.setLabel("bottom", "Time since start", units="min:s")
        self.speed.getAxis("bottom").setStyle(showValues=False)  # the plot below has them
        for plot in (self.speed, self.memory):
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.setMouseEnabled(x=False, y=False)
            plot.disableAutoRange()
            plot.showGrid(x=True, y=True, alpha=0.2)
            left = plot.getAxis("left")
            left.enableAutoSIPrefix(False)  # "ktok/s" and "kMiB" read worse than the numbers
            left.setWidth(56)  # the same width in both plots: their time axes line up
            for name in ("left", "bottom"):
                # A curve's new point repaints the view under it, axes included; an axis
                # replayed its picture each time. Cached as a pixmap, it is drawn again only
                # when its range, label or style changes: a redraw with its paint went from
                # 2.8 to 1.3 ms of GUI-thread CPU (median, 2 EPYC cores).
                plot.getAxis(name).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.memory.getAxis("bottom").enableAutoSIPrefix(False)
        self.segments = self.speed.plot(connect="pairs")
        self.marks = self.speed.plot(pen=None, symbol="o", symbolSize=7)
        self.live_curve = self.speed.plot()
        self.ram_curve = self.memory.plot()

        top = QHBoxLayout()
        top.addWidget(QLabel("Speed and memory"))
        top.addStretch(1)
        top.addWidget(self.range_box)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(top)
        lay.addWidget(self.view, 1)
        self.apply_palette()

    # -- data --------------------------------------------------------------------------

    def reply_started(self, t: float) -> None:
        self.running_since = t
        self.live.clear()

    def reply_ended(self, reply: Reply | None) -> None:
        """A reply finished (`reply`, with a rate) or failed (None): its live line goes."""
        self.running_since = None
        self.live.clear()
        if reply is not None:
            self.replies.append(reply)

    def sample(self, t: float, ram_bytes: float, live_tps: float | None) -> None:
        """One tick: process RAM, and the rolling rate while a reply runs (None: none)."""
        self.ram.append((t, ram_bytes))
        if len(self.ram) > MAX_SAMPLES:
            self.ram = self.ram[::-2][::-1]  # every other sample, keeping the newest
        if self.running_since is not None and live_tps is not None:
            self.live.append((t, live_tps))

    @property
    def mode(self) -> str:
        return self.range_box.currentText()

    def set_mode(self, mode: str) -> None:
        self.range_box.setCurrentText(mode)

    # -- drawing -------------------------------------------------------------------------

    def redraw(self, now: float) -> None:
        """Bring the plots up to `now`. Only what changed is set again: pyqtgraph repaints
        an axis (its labels, ticks, text) whenever its range or label is set, even to the
        same value, and that repaint was most of a tick's cost."""
        self.now = now
        self.redraws += 1
        lo, hi = x_range(self.mode, now, self.replies, self.running_since)
        r = self.replies
        if len(r) != self._replies_drawn:
            self._replies_drawn = len(r)
            self.segments.setData(
                _xs(p for x in r for p in (x.first, x.end)),
                _xs(p for x in r for p in (x.tps, x.tps)),
            )
            self.marks.setData(_xs(x.end for x in r), _xs(x.tps for x in r))
        if self.live or self._live_drawn:
            self.live_curve.setData(_xs(t for t, _ in self.live), _xs(v for _, v in self.live))
            self._live_drawn = bool(self.live)
        unit, scale = ram_unit(max((b for _, b in self.ram), default=0.0))
        if unit != self._ram_unit:
            self._ram_unit = unit
            self.memory.getAxis("left").setLabel("RAM", units=unit)
        self.ram_curve.setData(_xs(t for t, _ in self.ram), _xs(b / scale for _, b in self.ram))
        seen = [x.tps for x in r if x.end >= lo and x.first <= hi]
        seen += [v for t, v in self.live if lo <= t <= hi]
        ram = [b / scale for t, b in self.ram if lo <= t <= hi]
        ranges = (
            (lo, hi),
            (0.0, nice_ceiling(max(seen, default=0.0) * 1.2) or 10.0),
            (0.0, nice_ceiling(max(ram, default=0.0) * 1.2) or 1.0),
        )
        if ranges != self._ranges:
            self._ranges = ranges
            (x0, x1), (s0, s1), (m0, m1) = ranges
            self.speed.setXRange(x0, x1, padding=0)
            self.speed.setYRange(s0, s1, padding=0)
            self.memory.setYRange(m0, m1, padding=0)

    def reply_rates(self) -> list[float]:
        """The plotted reply markers' heights (tokens/s), oldest first."""
        return _data(self.marks)[1]

    def ram_values(self) -> tuple[str, list[float]]:
        """The RAM axis unit and the plotted values in it."""
        return str(self.memory.getAxis("left").labelUnits), _data(self.ram_curve)[1]

    def visible_x(self) -> tuple[float, float]:
        lo, hi = self.speed.viewRange()[0]
        return float(lo), float(hi)

    def apply_palette(self) -> None:
        """Background, axes and text from the palette; brighter series on a dark one."""
        pal = self.palette()
        base = pal.color(QPalette.ColorRole.Base)
        text = pal.color(QPalette.ColorRole.Text)
        grid = pal.color(QPalette.ColorRole.Mid)
        self.view.setBackground(base)
        for plot in (self.speed, self.memory):
            for name in ("left", "bottom"):
                axis = plot.getAxis(name)
                axis.setPen(grid)
                axis.setTextPen(text)
        colors = COLORS[base.lightness() < 128]
        tps, ram = QColor(colors["tps"]), QColor(colors["ram"])
        self.segments.setPen(pg.mkPen(tps, width=2))
        self.marks.setSymbolBrush(tps)
        self.marks.setSymbolPen(pg.mkPen(base, width=1))
        self.live_curve.setPen(pg.mkPen(tps, width=1, style=Qt.PenStyle.DashLine))
        self.ram_curve.setPen(pg.mkPen(ram, width=2))

    def changeEvent(self, e: QEvent) -> None:
        super().changeEvent(e)
        if e.type() == QEvent.Type.PaletteChange:  # light <-> dark
            self.apply_palette()


def _xs(values: Any) -> Any:
    return np.fromiter(values, dtype=float)


def _data(item: Any) -> tuple[list[float], list[float]]:
    xs, ys = item.getData()
    if xs is None or ys is None:
        return [], []
    return [float(x) for x in xs], [float(y) for y in ys if not math.isnan(y)]
