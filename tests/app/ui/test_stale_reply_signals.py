"""A late signal of an earlier reply (its request id is not the one on screen) never lands in
the message being streamed now: not its text, not its end, not its failure."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pytestqt.qtbot import QtBot

from app.ui.main_window import MainWindow
from engine.host.stats import GenerationStats
from engine.settings import SamplingParams
from tests.app.ui.test_ui_window import close_window, open_window
from tests.app.ui.ui_signal_log import SignalLog

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")
SHORT = SamplingParams(temperature=0.0, max_tokens=4)
LONG = SamplingParams(temperature=0.0, max_tokens=1500)


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = open_window(qtbot, SHORT)
    yield w
    close_window(w)


@pytest.mark.model
def test_a_stale_request_id_does_not_land_in_the_current_message(
    qtbot: QtBot, window: MainWindow
) -> None:
    log = SignalLog(window.engine.worker)
    with qtbot.waitSignal(log.got_finished, timeout=120_000):
        window.chat_view.input.submitted.emit("Say hello.")
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=30_000)
    old = log.request_ids("finished")[0]
    first = window.chat_model.message(1)
    assert first.state == "done" and first.text == log.text_of(old)

    # A second, long reply: once it streams, the first reply's signals come "late".
    window.controller.sampling = LONG
    log.clear()
    with qtbot.waitSignal(log.got_tokens, timeout=120_000):
        window.chat_view.input.submitted.emit("Write a long story about a lighthouse keeper.")
    row = window.controller.reply_row
    assert row == 3 and window.chat_model.message(row).state == "streaming"
    current = log.request_ids("tokens")[0]
    assert current != old

    # The performance panel shows the current reply: the stale signals move it no more.
    panel = window.perf_panel
    qtbot.waitUntil(lambda: panel.generating and panel.gen_tokens > 0, timeout=30_000)
    figures = (panel.prompt_tokens, panel.gen_tps, panel.chart.running_since)

    w = window.engine.worker
    w.started.emit(old, 99_999)
    w.tokens.emit(old, "STALE TEXT", 99_999)
    w.finished.emit(old, GenerationStats(gen_tokens=99_999, stop_reason="length"))
    w.failed.emit(old, "a stale failure")
    qtbot.wait(50)
    reply = window.chat_model.message(row)
    assert "STALE" not in reply.text and reply.state == "streaming" and reply.stats is None
    assert window.controller.busy and window.controller.reply_row == row
    assert not window.banner.isVisible()  # the stale failure is nobody's business
    assert panel.generating and panel.gen_tokens < 99_999
    assert (panel.prompt_tokens, panel.gen_tps, panel.chart.running_since) == figures
    assert window.chat_model.message(1).text == first.text  # nor the old message's

    # The current reply goes on and ends as its own signals say.
    with qtbot.waitSignal(log.got_finished, timeout=60_000) as done:
        window.controller.stop()
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=30_000)
    stats = done.args[0]
    assert log.request_ids("finished")[-1] == current and stats.stop_reason == "cancelled"
    reply = window.chat_model.message(row)
    assert reply.state == "stopped" and reply.stats is stats
    assert reply.text == log.text_of(current) and reply.text.strip()
    assert "STALE" not in reply.text
