"""The performance chart (pyqtgraph) behind the panel, on injected time, CPU and RAM: one
marker per finished reply at exactly the rate its footer shows (a short fast reply too), drawn
on the timer's tick only, axes with units, the time-range choice, RAM in the axis' unit and
the palette's colours."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QColor, QPalette
from pytestqt.qtbot import QtBot

from app.ui import perf_chart
from app.ui.chat_view import format_stats
from app.ui.perf_chart import LAST_REPLY, SINCE_START, nice_ceiling, time_step, time_text
from app.ui.perf_panel import TICK_MS, PerfPanel
from engine.host.stats import GenerationStats

TICK = TICK_MS / 1000
MIB = 2**20


class Clock:
    """Time and process RAM the test moves forward; CPU use is one steady core."""

    def __init__(self) -> None:
        self.t = 0.0
        self.rss = 300 * MIB

    def now(self) -> float:
        return self.t

    def cpu(self) -> tuple[float, float]:
        return self.t, self.t


def make_panel(qtbot: QtBot, c: Clock) -> PerfPanel:
    panel = PerfPanel(clock=c.now, cpu_probe=c.cpu, n_cores=2, ram_probe=lambda: c.rss)
    qtbot.addWidget(panel)
    return panel


def idle(panel: PerfPanel, c: Clock, seconds: float) -> None:
    """The panel's timer ticking with nothing generated."""
    for _ in range(round(seconds / TICK)):
        c.t += TICK
        panel.tick()


def reply(
    panel: PerfPanel,
    c: Clock,
    rid: int,
    tps: float,
    seconds: float,
    ttft: float = 0.3,
    tick: bool = True,
) -> GenerationStats:
    """A reply whose tokens arrive at `tps` for `seconds`, the timer ticking in between
    (`tick`); ends with the engine's stats at that rate."""
    panel.follow(rid)
    panel.on_started(rid, 20)
    c.t += ttft
    n, next_tick, end = 0, c.t + TICK, c.t + seconds
    while c.t < end - 1e-9:
        c.t = min(c.t + 1 / tps, end)
        n += 1
        panel.on_tokens(rid, "x", n)
        if tick and c.t >= next_tick:
            panel.tick()
            next_tick += TICK
    stats = GenerationStats(prompt_tokens=20, gen_tokens=n, gen_tps=tps, ttft_s=ttft)
    panel.on_finished(rid, stats)
    return stats


def test_one_marker_per_reply_at_the_rate_its_footer_shows(qtbot: QtBot) -> None:
    c = Clock()
    panel = make_panel(qtbot, c)
    footers = []
    for rid, (tps, seconds) in enumerate(((20.6, 6.0), (2.1, 8.0), (77.0, 0.2)), 1):
        stats = reply(panel, c, rid, tps, seconds)
        footers.append(format_stats(stats))
        idle(panel, c, 2.0)
    rates = panel.chart.reply_rates()
    assert rates == [20.6, 2.1, 77.0]
    for rate, footer in zip(rates, footers, strict=True):
        assert f"{rate:.1f} tok/s" in footer
    # Each marker sits at its reply's end, in order, inside the time drawn so far.
    ends = [r.end for r in panel.chart.replies]
    assert ends == sorted(ends) and ends[-1] <= c.t


def test_a_short_fast_reply_between_two_ticks_appears_at_its_rate(qtbot: QtBot) -> None:
    c = Clock()
    panel = make_panel(qtbot, c)
    reply(panel, c, 1, 8.0, 10.0)
    idle(panel, c, 1.0)
    # 77 tok/s for 0.2 s: no tick falls inside it, so a chart of tick samples misses it.
    reply(panel, c, 2, 77.0, 0.2, tick=False)
    assert panel.chart.reply_rates() == [8.0]  # not drawn before the tick
    idle(panel, c, TICK)
    assert panel.chart.reply_rates() == [8.0, 77.0]
    fast = panel.chart.replies[-1]
    for mode in (SINCE_START, LAST_REPLY):
        panel.chart.set_mode(mode)
        lo, hi = panel.chart.visible_x()
        assert lo <= fast.end <= hi
        assert panel.chart.speed.viewRange()[1][1] >= 77.0  # the y range reaches it


def test_the_chart_is_drawn_on_the_tick_not_per_token(qtbot: QtBot) -> None:
    c = Clock()
    panel = make_panel(qtbot, c)
    before = panel.chart.redraws
    panel.follow(1)
    panel.on_started(1, 10)
    for n in range(1, 200):
        c.t += 0.005
        panel.on_tokens(1, "x", n)
    panel.on_finished(1, GenerationStats(gen_tokens=199, gen_tps=200.0))
    assert panel.chart.redraws == before
    panel.tick()
    assert panel.chart.redraws == before + 1


def test_while_a_reply_streams_the_chart_is_redrawn_at_most_once_a_second(
    qtbot: QtBot,
) -> None:
    """The figures follow every tick; the chart (the GUI thread's costliest paint) waits a
    second between redraws while tokens arrive, and shows the finished reply at the next tick."""
    c = Clock()
    panel = make_panel(qtbot, c)
    idle(panel, c, 1.0)
    before, ticks = panel.chart.redraws, panel.ticks
    reply(panel, c, 1, tps=100.0, seconds=10.0)
    ticked = panel.ticks - ticks
    drawn = panel.chart.redraws - before
    assert ticked >= 24  # 10 s of 400 ms ticks
    assert 8 <= drawn <= 11  # about one a second, not one a tick
    assert panel.chart.reply_rates() == []  # the marker waits for the next tick
    panel.tick()
    assert panel.chart.redraws == before + drawn + 1
    assert panel.chart.reply_rates() == [100.0]
    idle(panel, c, 2.0)  # idle again: every tick redraws
    assert panel.chart.redraws == before + drawn + 1 + 5


def test_while_a_reply_runs_its_rolling_rate_is_dashed_then_replaced(qtbot: QtBot) -> None:
    c = Clock()
    panel = make_panel(qtbot, c)
    panel.follow(1)
    panel.on_started(1, 10)
    for n in range(1, 41):  # 20 tok/s for 2 s, ticking
        c.t += 0.05
        panel.on_tokens(1, "x", n)
        if n % 8 == 0:
            panel.tick()
    # Each tick samples the rate; the chart draws them at most once a second while streaming.
    assert len(panel.chart.live) >= 4 and all(19.0 <= v <= 21.0 for _, v in panel.chart.live)
    _xs, ys = panel.chart.live_curve.getData()
    assert len(ys) >= 2 and all(19.0 <= y <= 21.0 for y in ys)
    panel.on_failed(1, "stopped")
    panel.tick()
    assert panel.chart.live == [] and panel.chart.reply_rates() == []


def test_axes_say_their_units(qtbot: QtBot) -> None:
    c = Clock()
    panel = make_panel(qtbot, c)
    idle(panel, c, 1.0)
    chart = panel.chart
    speed = chart.speed.getAxis("left")
    ram = chart.memory.getAxis("left")
    time = chart.memory.getAxis("bottom")
    assert (speed.labelText, speed.labelUnits) == ("Speed", "tok/s")
    assert (ram.labelText, ram.labelUnits) == ("RAM", "MiB")
    assert (time.labelText, time.labelUnits) == ("Time since start", "min:s")
    assert "tok/s" in speed.labelString() and "MiB" in ram.labelString()
    # No SI prefix to misread (1200 tok/s is not "1.2 ktok/s").
    assert not speed.autoSIPrefix and not ram.autoSIPrefix
    assert time.tickStrings([0.0, 75.0, 3725.0], 1.0, 1.0) == ["0:00", "1:15", "1:02:05"]
    assert [time_text(s) for s in (59.6, 600)] == ["1:00", "10:00"]
    assert time_step(25.0, 5) == 5.0 and time_step(3600.0, 6) == 600.0


def test_time_range_last_reply_or_since_start(qtbot: QtBot) -> None:
    c = Clock()
    panel = make_panel(qtbot, c)
    first = reply(panel, c, 1, 20.0, 5.0)
    idle(panel, c, 60.0)
    reply(panel, c, 2, 30.0, 4.0)
    idle(panel, c, 2.0)
    chart = panel.chart
    a, b = chart.replies
    assert chart.mode == SINCE_START  # the default: everything
    lo, hi = chart.visible_x()
    # Everything since start, the right edge rounded up to a step of the time axis (a
    # twentieth of the span or a little more, see time_step).
    assert lo == 0.0 and c.t <= hi < c.t * 1.13
    chart.set_mode(LAST_REPLY)
    lo, hi = chart.visible_x()
    assert a.end < lo <= b.start and b.end <= hi < c.t
    assert hi - lo < 10.0
    # A new reply: "Last reply" follows it while it runs.
    panel.follow(3)
    panel.on_started(3, 10)
    c.t += 1.0
    panel.on_tokens(3, "x", 1)
    panel.tick()
    lo, _hi = chart.visible_x()
    assert lo == pytest.approx(c.t - 1.0)
    chart.set_mode(SINCE_START)
    assert chart.visible_x()[0] == 0.0
    assert first.gen_tps == chart.reply_rates()[0]


def test_ram_is_plotted_in_the_unit_its_axis_names(qtbot: QtBot) -> None:
    c = Clock()
    panel = make_panel(qtbot, c)
    idle(panel, c, 1.2)
    unit, values = panel.chart.ram_values()
    assert unit == "MiB" and values == [300.0, 300.0, 300.0]
    assert panel.labels["ram"].text() == "300.0 MiB"
    c.rss = 3 * 2**30
    idle(panel, c, TICK)
    unit, values = panel.chart.ram_values()
    assert unit == "GiB" and values == pytest.approx([300 / 1024] * 3 + [3.0])
    assert panel.chart.memory.viewRange()[1][1] >= 3.0


def test_history_since_start_is_bounded(qtbot: QtBot, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perf_chart, "MAX_SAMPLES", 10)
    c = Clock()
    panel = make_panel(qtbot, c)
    for i in range(25):
        c.rss = (100 + i) * MIB
        c.t += TICK
        panel.tick()
    times = [t for t, _ in panel.chart.ram]
    assert len(times) <= 10
    assert times[-1] == pytest.approx(c.t)  # the newest stays
    assert times[0] < c.t / 2  # and the early part still covers the start


def test_colours_follow_the_palette(qtbot: QtBot) -> None:
    c = Clock()
    panel = make_panel(qtbot, c)
    chart = panel.chart
    light_tps = chart.marks.opts["symbolBrush"].color().name()
    dark = QPalette()
    dark.setColor(QPalette.ColorRole.Base, QColor("#1e1e1e"))
    dark.setColor(QPalette.ColorRole.Text, QColor("#e6e6e6"))
    dark.setColor(QPalette.ColorRole.Mid, QColor("#5a5a5a"))
    panel.setPalette(dark)
    assert chart.view.backgroundBrush().color().name() == "#1e1e1e"
    for axis in (chart.speed.getAxis("left"), chart.memory.getAxis("bottom")):
        assert axis.textPen().color().name() == "#e6e6e6"
    assert chart.marks.opts["symbolBrush"].color().name() != light_tps


def test_nice_ceiling_rounds_up_to_few_values() -> None:
    assert nice_ceiling(0.0) == 0.0
    assert nice_ceiling(132.0) == 150.0
    assert nice_ceiling(150.0) == 150.0
    assert nice_ceiling(151.0) == 200.0
    assert nice_ceiling(0.8) == 1.0
    assert nice_ceiling(7.6) == 10.0
    # Any value gets a ceiling under 1.7 times itself (3 -> 5 is the widest gap): the data
    # still fill most of the plot.
    for v in (0.013, 1.9, 26.0, 301.0, 4100.0, 99_999.0):
        assert v <= nice_ceiling(v) < v * 1.7


def test_a_tick_that_changes_no_range_leaves_the_axes_as_drawn(qtbot: QtBot) -> None:
    """pyqtgraph redraws an axis whenever its range or label is set, to the same value too;
    so a tick sets them only when they change."""
    c = Clock()
    panel = make_panel(qtbot, c)
    reply(panel, c, 1, 20.0, 5.0)
    idle(panel, c, 2.0)
    changes: list[object] = []
    for plot in (panel.chart.speed, panel.chart.memory):
        plot.getViewBox().sigRangeChanged.connect(lambda *a: changes.append(a))
        plot.getAxis("left").label.setHtml("marker")  # setLabel would write it again
    idle(panel, c, 2 * TICK)  # same RAM, same replies, the right edge within its step
    assert changes == []
    assert panel.chart.memory.getAxis("left").label.toPlainText() == "marker"
    reply(panel, c, 2, 90.0, 2.0)  # a faster reply: the speed axis must grow
    assert changes, "the y range did not follow a reply above it"
    assert panel.chart.speed.viewRange()[1][1] >= 90.0
