"""The performance panel on injected time and CPU samples (no wall clock, no model): the
rolling rate follows the last reply and goes blank when nothing is generated, the "CPU busy"
line appears and disappears with other processes' load, and the model row has its name."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QObject
from pytestqt.qtbot import QtBot

from app.ui.perf_panel import TICK_MS, PerfPanel
from app.ui.worker import LoadedModel
from engine.host.stats import GenerationStats

TICK = TICK_MS / 1000


class Machine:
    """A clock and CPU counters the test moves forward: this process keeps `own` cores
    busy, other processes `others`."""

    def __init__(self) -> None:
        self.t = 0.0
        self.own_s = 0.0
        self.busy_s = 0.0
        self.own = 1.0
        self.others = 0.0

    def clock(self) -> float:
        return self.t

    def probe(self) -> tuple[float, float]:
        return self.own_s, self.busy_s

    def advance(self, dt: float) -> None:
        self.t += dt
        self.own_s += self.own * dt
        self.busy_s += (self.own + self.others) * dt


def make_panel(qtbot: QtBot, m: Machine) -> PerfPanel:
    panel = PerfPanel(clock=m.clock, cpu_probe=m.probe, n_cores=2)
    qtbot.addWidget(panel)
    return panel


def run_reply(
    panel: PerfPanel, m: Machine, rid: int, tps: float, seconds: float, ttft: float = 0.5
) -> None:
    """A reply whose tokens reach the GUI at `tps`, with the panel's timer ticking every
    400 ms in between (at its own moments, not the tokens')."""
    panel.follow(rid)
    panel.on_started(rid, 20)
    m.advance(ttft)
    n, next_token, next_tick = 0, m.t, m.t + TICK
    end = m.t + seconds
    while m.t < end:
        if next_token <= next_tick:
            m.advance(next_token - m.t)
            n += 1
            panel.on_tokens(rid, "x", n)
            next_token += 1 / tps
        else:
            m.advance(next_tick - m.t)
            panel.tick()
            next_tick += TICK
    panel.on_finished(
        rid, GenerationStats(prompt_tokens=20, gen_tokens=n, gen_tps=tps, ttft_s=ttft)
    )


def rolling(panel: PerfPanel) -> str:
    return panel.labels["tg_avg"].text()


def test_rolling_rate_is_the_last_reply_and_goes_blank_when_idle(qtbot: QtBot) -> None:
    m = Machine()
    panel = make_panel(qtbot, m)
    run_reply(panel, m, 1, tps=20.6, seconds=6.0)
    assert rolling(panel) == "20.6 tok/s"
    m.advance(5.0)
    panel.tick()
    # Nothing generated for longer than the window: no rate (the old panel kept 20.6 here).
    assert rolling(panel) == "—"
    assert panel.labels["tg"].text() == "idle"
    # A slow reply right after: during it and when it ends, its own speed.
    panel.follow(2)
    panel.on_started(2, 30)
    panel.tick()
    assert rolling(panel) == "—"  # no token yet
    run_reply(panel, m, 2, tps=2.1, seconds=8.0, ttft=1.5)
    assert rolling(panel) == "2.1 tok/s"
    assert panel.labels["tg_last"].text() == "2.1 tok/s"
    m.advance(1.0)
    panel.tick()
    assert rolling(panel) == "2.1 tok/s"
    m.advance(3.0)
    panel.tick()
    assert rolling(panel) == "—"


def test_a_reply_slowing_down_shows_the_new_speed_within_seconds(qtbot: QtBot) -> None:
    m = Machine()
    panel = make_panel(qtbot, m)
    panel.follow(1)
    panel.on_started(1, 10)
    n = 0
    for _ in range(200):  # 10 s at 20 tok/s
        m.advance(0.05)
        n += 1
        panel.on_tokens(1, "x", n)
        if round(m.t / 0.05) % 8 == 0:
            panel.tick()
    for _ in range(8):  # then 2 tok/s for 4 s
        m.advance(0.5)
        n += 1
        panel.on_tokens(1, "x", n)
        panel.tick()
    assert panel.rolling_tps is not None and 1.9 <= panel.rolling_tps <= 2.1


def test_cpu_busy_line_appears_and_disappears(qtbot: QtBot) -> None:
    m = Machine()
    panel = make_panel(qtbot, m)
    for _ in range(6):
        m.advance(TICK)
        panel.tick()
    assert panel.cpu_note.isHidden()
    assert panel.labels["cpu"].text() == "100% of 2 cores"
    m.others = 1.8  # a compile job next to the chat
    for _ in range(6):
        m.advance(TICK)
        panel.tick()
    assert not panel.cpu_note.isHidden()
    assert panel.cpu_note.text() == "CPU busy: other processes use 180% of 2 cores"
    m.others = 0.0
    for _ in range(6):
        m.advance(TICK)
        panel.tick()
    assert panel.cpu_note.isHidden() and panel.cpu_note.text() == ""


def test_model_row_names_the_loaded_model(qtbot: QtBot) -> None:
    m = Machine()
    panel = make_panel(qtbot, m)
    assert panel.labels["model"].text() == "—"
    panel.on_loaded(
        LoadedModel(
            path=Path("/m/SmolLM2-135M-Instruct.Q4_1.gguf"),
            name="SmolLM2 135M Instruct · Q4_1",
            n_ctx=2048,
            n_layer=30,
            n_gpu_layers=0,
            load_s=0.1,
        )
    )
    assert panel.labels["model"].text() == "SmolLM2 135M Instruct · Q4_1"
    panel.on_unloaded()
    assert panel.labels["model"].text() == "—"


class LayoutRequests(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.LayoutRequest:
            self.n += 1
        return False


# Offscreen, a top-level window's layout says this whenever it asks for a size.
@pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")
def test_figures_that_change_every_tick_do_not_lay_the_panel_out(qtbot: QtBot) -> None:
    """A plain label's new text laid the whole panel out and repainted it, the chart too,
    on every tick of a streaming reply (~10 ms of GUI-thread CPU a tick on 2 cores)."""
    m = Machine()
    panel = make_panel(qtbot, m)
    panel.show()
    qtbot.waitExposed(panel)
    run_reply(panel, m, 1, tps=50, seconds=2)  # every figure has had a value once
    qtbot.wait(20)
    box = panel.labels["tg"].parentWidget()
    assert box is not None
    requests = LayoutRequests()
    box.installEventFilter(requests)
    before = {key: label.text() for key, label in panel.labels.items()}
    panel.follow(2)
    panel.on_started(2, 20)
    for i in range(1, 30):
        m.advance(TICK)
        panel.on_tokens(2, "x", 7 * i)
        panel.tick()
        qtbot.wait(1)
    changed = [k for k, label in panel.labels.items() if label.text() != before[k]]
    assert {"ttft", "tg", "tg_avg"} <= set(changed)  # the figures moved...
    assert requests.n == 0  # ...without a layout of the panel
    # A value longer than any before still fits (the figure grows once).
    wide = "123,456,789 / 1,048,576 tokens"
    panel.labels["ctx"].setText(wide)
    ctx = panel.labels["ctx"]
    # Its new size is applied by the layout, in an event of its own.
    qtbot.waitUntil(lambda: ctx.width() >= ctx.fontMetrics().horizontalAdvance(wide))


def test_only_the_reply_it_follows_moves_the_figures(qtbot: QtBot) -> None:
    """The chat names the reply that streams (`follow`); the late signals of one it let go,
    or of any other request id, move no figure and add nothing to the chart."""
    m = Machine()
    panel = make_panel(qtbot, m)
    run_reply(panel, m, 1, tps=20.0, seconds=2.0)
    # Reply 2 streams, then the chat lets it go (New chat): its figures end there.
    panel.follow(2)
    panel.on_started(2, 30)
    m.advance(0.5)
    panel.on_tokens(2, "x", 3)
    panel.follow(None)
    assert not panel.generating and panel.labels["tg"].text() == "idle"
    figures = ("ttft", "pp", "tg", "tg_last", "spec", "ctx", "source")
    shown = [panel.labels[key].text() for key in figures]
    for rid in (2, 7):  # the abandoned reply's late end, and a request never followed
        panel.on_started(rid, 99_999)
        panel.on_tokens(rid, "x", 99_999)
        stale = GenerationStats(prompt_tokens=99_999, gen_tokens=99_999, gen_tps=999.0)
        panel.on_finished(rid, stale)
        panel.on_failed(rid, "a stale failure")
    m.advance(TICK)
    panel.tick()
    assert not panel.generating and panel.prompt_tokens == 30
    assert [panel.labels[key].text() for key in figures] == shown
    assert panel.chart.reply_rates() == [20.0]
