"""The Benchmark window on the real SmolLM2, offscreen: Run is off without a model and while
the chat replies; a run fills the table and the charts, pauses the chat, and saves JSON that
`candlewick bench compare` reads; Cancel stops within a request and keeps what was measured;
a bad workload file or bad levels are one line; the results table passes qtmodeltester."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QEvent, QModelIndex, Qt
from PySide6.QtWidgets import QApplication
from pytestqt.modeltest import ModelTester
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.paths import AppPaths
from app.services.speed_records import SpeedService, file_key
from app.ui.bench_page import BenchPage
from app.ui.bench_table import COLUMNS, RAW_ROLE, BenchTableModel
from app.ui.bench_view import CHAT_BUSY_TIP, MAX_LEVEL, NO_MODEL_TIP, BenchView
from app.ui.main_window import MainWindow
from engine.bench.levels import parse_levels
from engine.bench.metrics import LevelMetrics, RequestTrace
from engine.bench.result import BenchResult
from engine.settings import LoadParams, SamplingParams

# The offscreen platform plugin (no window manager) says these when a window is shown/raised.
pytestmark = pytest.mark.qt_log_ignore(
    "This plugin does not support propagateSizeHints", "This plugin does not support raise"
)
COL = {c.header.split("\n")[0]: i for i, c in enumerate(COLUMNS)}
# Generous: on a 2-core machine shared with other jobs a tiny run can take minutes.
RUN_TIMEOUT_MS = 600_000


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = build_window(sampling=SamplingParams(temperature=0.0, max_tokens=4))
    w.show()
    qtbot.waitExposed(w)
    yield w
    w.close()
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def bench_view(w: MainWindow) -> BenchView:
    view = w.findChild(BenchView)
    assert view is not None
    return view


def load(qtbot: QtBot, w: MainWindow, path: Path) -> BenchView:
    view = bench_view(w)
    # One thread: llama.cpp's spinning worker threads crawl when other jobs share the cores.
    w.controller.load(path, LoadParams(n_ctx=1024, n_threads=1))
    qtbot.waitUntil(lambda: view.run_button.isEnabled(), timeout=120_000)
    return view


def small_run(
    view: BenchView,
    *,
    levels: str = "1,2",
    requests: int = 2,
    max_tokens: int = 8,
    roofline: bool = True,
) -> None:
    view.workload.setCurrentIndex(view.workload.findData("chat"))
    view.levels.setText(levels)
    view.requests.setValue(requests)
    view.max_tokens.setValue(max_tokens)
    view.slo.setValue(30.0)
    view.roofline.setChecked(roofline)
    view.bandwidth_bytes = 64 << 20  # enough for a figure; the real default is 512 MiB


def raw(view: BenchView, row: int, name: str) -> Any:
    return view.table_model.index(row, COL[name]).data(RAW_ROLE)


def text(view: BenchView, row: int, name: str) -> str:
    return str(view.table_model.index(row, COL[name]).data())


@pytest.mark.timeout(900)
def test_run_fills_table_and_charts_and_saves_comparable_json(
    window: MainWindow,
    qtbot: QtBot,
    smollm2_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    view = bench_view(window)
    assert not view.run_button.isEnabled()
    assert view.run_button.toolTip() == NO_MODEL_TIP
    assert not view.run()
    # View > Go to > Benchmark (or the rail) shows it as a page of the window.
    action = next(a for a in window.actions() if a.text() == "Benchmark")
    action.trigger()
    page = window.page("benchmark")
    assert window.current_page() == "benchmark" and isinstance(page, BenchPage)
    assert page.currentWidget() is view  # the Speed tab first; Compare quants beside it

    view = load(qtbot, window, smollm2_path)
    assert "SmolLM2" in view.model_label.text()

    # While the chat replies, Run is off and says why.
    window.chat_view.input.submitted.emit("Say hello.")
    assert window.controller.busy
    assert not view.run_button.isEnabled()
    assert view.run_button.toolTip() == CHAT_BUSY_TIP
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=RUN_TIMEOUT_MS)
    assert view.run_button.isEnabled()
    rows_before = window.chat_model.rowCount()

    small_run(view)
    with qtbot.waitSignal(view.running_changed) as started:
        assert view.run()
    assert started.args == [True]
    # The chat waits while the benchmark runs.
    assert not window.chat_view.send_button.isEnabled()
    assert "benchmark" in window.chat_view.send_button.toolTip().lower()
    window.chat_view.input.submitted.emit("Are you there?")
    assert window.chat_model.rowCount() == rows_before
    answer = window.chat_model.message(rows_before - 1).text
    window.chat_view.message_action.emit("regenerate", rows_before - 1)
    assert not window.controller.busy
    assert window.chat_model.message(rows_before - 1).text == answer
    assert "benchmark is running" in window.statusBar().currentMessage()
    assert not view.run_button.isEnabled() and view.cancel_button.isEnabled()
    statuses: list[str] = []

    def seen() -> bool:
        statuses.append(view.status.text())
        return not view.running

    qtbot.waitUntil(seen, timeout=RUN_TIMEOUT_MS)
    assert any(s.startswith("Level 2 of 2 · 2 concurrent · request") for s in statuses), statuses
    assert view.status.text().startswith("Done in"), view.status.text()
    assert not view.error_label.isVisible()
    assert window.chat_view.send_button.isEnabled()
    assert view.progress.value() == view.progress.maximum()

    result = view.result.to_dict() if view.result is not None else None
    assert result is not None and result["cancelled"] is False
    # Its one-request decode speed is kept as measured on the file (Compare quants says so).
    kept = SpeedService(AppPaths.default().data).records.get(
        file_key(smollm2_path.name, smollm2_path.stat().st_size)
    )
    assert kept["measured"]["source"] == "benchmark" and kept["measured"]["tokens_per_s"] > 0
    assert result["target"]["mode"] == "scheduler" and result["target"]["n_slots"] == 2
    ModelTester(None).check(view.table_model, force_py=True)
    assert view.table_model.rowCount() == 2
    for row, conc in enumerate((1, 2)):
        assert raw(view, row, "Concurrent") == conc
        assert text(view, row, "OK / sent") == "2 / 2"
        assert raw(view, row, "Failures") == 0
        for lo, hi in (("TTFT p50", "TTFT p95"), ("Latency p50", "Latency p95")):
            assert 0 < raw(view, row, lo) <= raw(view, row, hi)
        assert raw(view, row, "TTFT p95") <= raw(view, row, "Latency p95")
        for name in ("Prompt", "Generation", "Total", "Peak RAM"):
            assert raw(view, row, name) > 0, name
            assert text(view, row, name) != "-"
        # A few tokens a second at least, and below what any CPU decodes 135M weights at.
        assert 1 < raw(view, row, "Generation") < 5000
        assert raw(view, row, "Peak RAM") > 90 << 20  # at least the weights are resident
        assert raw(view, row, "Meets TTFT") is True
        assert text(view, row, "Status") == "done"
    header = view.table_model.headerData(COL["TTFT p50"], Qt.Orientation.Horizontal)
    assert "(s)" in header
    assert "tokens/s" in view.table_model.headerData(COL["Total"], Qt.Orientation.Horizontal)

    # Charts on screen, summary with the objective and the roofline, machine context.
    assert not view.chart.pixmap.isNull() and view.chart.pixmap.width() > 500
    assert "TTFT p95 ≤ 30 s: 2" in view.summary.text()
    rf = result["roofline"]
    assert rf and rf["limit_tps"] > 0 and rf["achieved_pct"] > 0
    assert f"{rf['achieved_pct']:.0f} % of the limit" in view.summary.text()
    ctx = view.context.text()
    for part in ("CPU ", "cores", "RAM ", "GPU ", "llama-cpp-python", "Q4_1", "per request"):
        assert part in ctx, (part, ctx)

    # Save JSON and PNG; `candlewick bench compare` reads the JSON.
    assert view.save_json_button.isEnabled() and view.save_png_button.isEnabled()
    out = tmp_path / "run.json"
    assert view.save_json(out)
    assert json.loads(out.read_text(encoding="utf-8"))["levels"] == result["levels"]
    png = tmp_path / "run.png"
    assert view.save_png(png)
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    from app.cli import main

    capsys.readouterr()
    assert main(["bench", "compare", str(out), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ttft_p50" in printed and "1.00" in printed


@pytest.mark.timeout(900)
def test_cancel_stops_within_a_request_and_keeps_partial_results(
    window: MainWindow, qtbot: QtBot, smollm2_path: Path
) -> None:
    view = load(qtbot, window, smollm2_path)
    small_run(view, levels="1,2", requests=6, max_tokens=96, roofline=False)
    assert view.run()
    # Cancel once the first timed request has finished.
    qtbot.waitUntil(
        lambda: view.status.text().startswith("Level 1 of 2") and view.progress.value() >= 1,
        timeout=RUN_TIMEOUT_MS,
    )
    done_at_cancel = view.progress.value()
    t_cancel = time.perf_counter()  # the traces' clock
    view.cancel()
    assert "Cancelling" in view.status.text()
    qtbot.waitUntil(lambda: not view.running, timeout=RUN_TIMEOUT_MS)

    result = view.result.to_dict() if view.result is not None else None
    assert result is not None and result["cancelled"] is True
    assert [lv["concurrency"] for lv in result["levels"]] == [1]  # level 2 never started
    traces = result["traces"]["1"]
    # At most one more request had started, and whatever was in flight when Cancel was
    # pressed stopped at its next token. (Answers can end within a tenth of a second here, so
    # Cancel may also land between two requests: then none is in flight, and none starts.)
    assert len(traces) <= done_at_cancel + 2
    in_flight = [t for t in traces if t["t_start"] <= t_cancel < t["t_end"]]
    assert all(t["error"] == "cancelled" for t in in_flight)
    assert not [t for t in traces if t["t_start"] > t_cancel + 0.5]
    assert view.table_model.rowCount() == 1
    assert text(view, 0, "Status") == "cancelled"
    assert raw(view, 0, "TTFT p50") > 0 and raw(view, 0, "Generation") > 0
    assert view.status.text().startswith("Cancelled after")
    assert "1 of 2 levels" in view.status.text()
    assert not view.chart.pixmap.isNull()  # the partial result is charted too
    assert view.save_json_button.isEnabled()
    assert window.chat_view.send_button.isEnabled()
    assert view.run_button.isEnabled()


def test_cancel_while_loading_measures_nothing(
    window: MainWindow, qtbot: QtBot, smollm2_path: Path
) -> None:
    view = load(qtbot, window, smollm2_path)
    # Loading again: nothing to run until the new load is done.
    seen: list[bool] = []
    set_loaded = view.set_loaded

    def record(info: Any) -> None:
        set_loaded(info)
        seen.append(view.run_button.isEnabled())

    view.set_loaded = record  # type: ignore[method-assign]
    window.controller.load(smollm2_path, LoadParams(n_ctx=1024, n_threads=1))
    qtbot.waitUntil(
        lambda: bool(seen) and seen[-1] and window.controller.loading is None, timeout=120_000
    )
    assert False in seen
    small_run(view, roofline=False)
    assert view.run()
    view.cancel()  # before the benchmark's instance has loaded, or during the warm-up
    qtbot.waitUntil(lambda: not view.running, timeout=RUN_TIMEOUT_MS)
    assert view.result is None and view.table_model.rowCount() == 0
    assert view.status.text() == "Cancelled before the first level; nothing was measured."
    assert not view.save_json_button.isEnabled() and view.run_button.isEnabled()
    assert window.chat_view.send_button.isEnabled()


def test_bad_workload_file_and_bad_levels_are_one_line(window: MainWindow, tmp_path: Path) -> None:
    view = bench_view(window)
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"prompt": "fine"}\nthis is not json\n', encoding="utf-8")
    before = view.workload.count()
    assert not view.load_workload_file(bad)
    msg = view.error_label.text()
    assert not view.error_label.isHidden()
    assert msg == "Workload not loaded: prompts.jsonl line 2: not valid JSON"
    assert view.workload.count() == before

    binary = tmp_path / "blob.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert not view.load_workload_file(binary)
    assert view.error_label.text() == "Workload not loaded: blob.jsonl is not UTF-8 text"
    assert not view.load_workload_file(tmp_path / "missing.jsonl")
    assert "\n" not in view.error_label.text() and "Traceback" not in view.error_label.text()

    good = tmp_path / "mine.jsonl"
    good.write_text('{"prompt": "Hi", "max_tokens": 4}\n{"prompt": "Bye"}\n', encoding="utf-8")
    assert view.load_workload_file(good)
    assert view.error_label.isHidden()
    assert view.workload.currentText() == "mine.jsonl (2 prompts)"
    assert len(view.chosen_workload().prompts) == 2

    for levels, expected in (("1, 2,4", [1, 2, 4]), ("4 2 2", [2, 4])):
        assert parse_levels(levels, limit=MAX_LEVEL) == expected
    for levels in ("", "1,x", "0,2", "1,100", "-1"):
        with pytest.raises(ValueError) as e:
            parse_levels(levels, limit=MAX_LEVEL)
        assert "\n" not in str(e.value)


def test_results_table_model(qtmodeltester: ModelTester) -> None:
    """Formatting and marking on a hand-made result, checked with qtmodeltester."""
    lv: dict[str, Any] = {
        "concurrency": 1,
        "requests": 3,
        "succeeded": 2,
        "failure_rate": 1 / 3,
        "ttft_p50": 0.1234,
        "ttft_p95": 0.2,
        "prompt_tps_p50": 400.0,
        "gen_tps_p50": 99.94,
        "latency_p50": 1.0,
        "latency_p95": 1.5,
        "total_throughput_tps": 90.0,
        "peak_ram_bytes": 300 << 20,
        "peak_vram_bytes": None,
        "meets_slo": False,
        "error_samples": ["cancelled"],
    }
    # Metrics the table does not show.
    unshown: dict[str, Any] = {
        "errors": 1,
        "timeouts": 0,
        "gen_tps_mean": None,
        "requests_per_s": 0.0,
        "wall_s": 0.0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
    }
    model = BenchTableModel()
    assert model.rowCount() == 0
    model.set_result(
        BenchResult(
            levels=[
                LevelMetrics(**unshown, **lv),
                LevelMetrics(
                    **unshown,
                    **{
                        **lv,
                        "concurrency": 2,
                        "succeeded": 3,
                        "failure_rate": 0.0,
                        "meets_slo": None,
                    },
                ),
            ],
            traces={1: [RequestTrace(0, 0.0, 1.0), RequestTrace(1, 0.0, 1.0, error="cancelled")]},
        )
    )
    qtmodeltester.check(model, force_py=True)  # and watches the reset below
    assert model.rowCount() == 2 and model.columnCount() == len(COLUMNS)
    assert model.rowCount(model.index(0, 0)) == 0

    def cell(row: int, name: str) -> Any:
        return model.index(row, COL[name]).data()

    assert cell(0, "OK / sent") == "2 / 3"
    assert cell(0, "Failures") == "33"
    assert cell(0, "TTFT p50") == "0.123"
    assert cell(0, "Generation") == "99.9"
    assert cell(0, "Peak RAM") == "300"
    assert cell(0, "Peak VRAM") == "-"
    assert cell(0, "Meets TTFT") == "no" and cell(1, "Meets TTFT") == "-"
    assert cell(0, "Status") == "cancelled" and cell(1, "Status") == "done"
    assert model.index(0, COL["Status"]).data(Qt.ItemDataRole.ToolTipRole) == "cancelled"
    assert model.data(QModelIndex()) is None
    model.set_result(None)
    assert model.rowCount() == 0
