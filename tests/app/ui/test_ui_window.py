"""The main window on the real SmolLM2, offscreen: start state, the newcomer's path (type,
Enter, load, streamed answer, stats footer, panel), Stop, shortcuts, the memory estimate,
errors shown in the window, item models, and remembered geometry."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QModelIndex, Qt, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QAbstractSlider, QApplication
from pytestqt.modeltest import ModelTester
from pytestqt.qtbot import QtBot

from app.main import build_window, platform_problem
from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from app.ui.chat_model import ChatModel
from app.ui.chat_view import CodeBlock, format_stats
from app.ui.library_model import LibraryModel
from app.ui.main_window import MainWindow
from engine.host.stats import GenerationStats
from engine.settings import SamplingParams
from tests.app.ui.model_window import close_window
from tests.app.ui.ui_signal_log import SignalLog

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
# The offscreen platform plugin (no window manager) says this whenever a window is shown.
pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def open_window(qtbot: QtBot, sampling: SamplingParams = GREEDY) -> MainWindow:
    w = build_window(sampling=sampling)
    w.show()
    w.activateWindow()
    qtbot.waitExposed(w)
    w.focus_input()
    return w


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = open_window(qtbot)
    yield w
    close_window(w)


def send(qtbot: QtBot, w: MainWindow, text: str) -> None:
    qtbot.keyClicks(w.chat_view.input, text)
    qtbot.keyClick(w.chat_view.input, Qt.Key.Key_Return)


def wait_idle(qtbot: QtBot, w: MainWindow, timeout: int = 120_000) -> None:
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=timeout)


def test_start_state(window: MainWindow, qtbot: QtBot) -> None:
    assert window.windowTitle() == "Candlewick"
    entry = window.library_panel.selected_entry()
    assert entry is not None and entry.id == "default"
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.chat_view.input)
    # The estimate for the default model is on screen before anything is loaded.
    est = window.library_panel.estimate.current
    assert est is not None and est.weights > 0 and est.kv > 0 and est.compute > 0
    assert "Fits" in window.library_panel.estimate.verdict.text()
    assert window.controller.loaded is None


@pytest.mark.model
def test_type_enter_loads_and_streams_answer(window: MainWindow, qtbot: QtBot) -> None:
    log = SignalLog(window.engine.worker)
    snapshots: list[str] = []
    chat = window.chat_model
    chat.dataChanged.connect(
        lambda top, _b, _r: (
            snapshots.append(chat.message(top.row()).text)
            if chat.message(top.row()).role == "assistant"
            else None
        )
    )
    with qtbot.waitSignal(log.got_finished, timeout=120_000) as blocker:
        send(qtbot, window, "What is the capital of France?")
        assert window.chat_view.input.toPlainText() == ""
    stats = blocker.args[0]
    assert isinstance(stats, GenerationStats)
    wait_idle(qtbot, window)
    assert log.squeezed() == ["progress", "loaded", "started", "tokens", "finished"]

    # The conversation: the question and the streamed answer, in order.
    assert chat.rowCount() == 2
    user, reply = chat.message(0), chat.message(1)
    assert (user.role, user.text) == ("user", "What is the capital of France?")
    assert reply.role == "assistant" and reply.state == "done" and reply.text.strip()
    streamed = "".join(t for t, _ in log.values("tokens"))
    assert reply.text == streamed
    texts = [s for s in snapshots if s]
    assert texts and texts[-1] == reply.text
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))

    # The footer under the reply, and the view's text.
    widget = window.chat_view.message_widgets[1]
    assert widget.footer.isVisible()
    assert widget.footer.text() == format_stats(stats)
    assert f"{stats.gen_tokens} tokens" in widget.footer.text()
    assert "TTFT" in widget.footer.text() and "tok/s" in widget.footer.text()

    # Library panel: loaded, with the estimate next to what llama.cpp really allocated.
    panel = window.library_panel
    assert panel.loaded is not None and panel.loaded.name
    assert panel.estimate.actual.text().startswith("Estimated ")
    assert ", actual " in panel.estimate.actual.text()
    assert panel.eject_button.isEnabled() and not panel.cancel_button.isEnabled()

    # Performance panel after the reply.
    perf = window.perf_panel
    perf.tick()
    assert perf.labels["ttft"].text() == f"{stats.ttft_s:.2f} s"
    assert perf.labels["tg_last"].text() == f"{stats.gen_tps:.1f} tok/s"
    used = stats.prompt_tokens + stats.gen_tokens
    assert perf.labels["ctx"].text() == f"{used:,} / {panel.loaded.n_ctx:,} tokens"
    assert perf.labels["ram"].text().endswith("iB")
    assert len(perf.chart.ram) >= 1
    assert perf.chart.reply_rates() == [stats.gen_tps]  # the footer's figure, on the chart

    # A follow-up turn reuses the loaded model: no second load.
    log.clear()
    with qtbot.waitSignal(log.got_finished, timeout=120_000):
        send(qtbot, window, "And of Italy?")
    wait_idle(qtbot, window)
    assert log.squeezed() == ["started", "tokens", "finished"]
    assert chat.rowCount() == 4


@pytest.mark.model
def test_load_button_then_cancel(window: MainWindow, qtbot: QtBot) -> None:
    panel = window.library_panel
    log = SignalLog(window.engine.worker)
    with qtbot.waitSignal(log.got_load_cancelled, timeout=60_000):
        qtbot.mouseClick(panel.load_button, Qt.MouseButton.LeftButton)
        assert panel.cancel_button.isEnabled() and not panel.load_button.isEnabled()
        qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    assert "loaded" not in log.names
    assert panel.status.text() == "No model loaded" and panel.load_button.isEnabled()
    assert not panel.cancel_button.isEnabled() and not panel.eject_button.isEnabled()
    # Load again, to the end this time, then eject.
    with qtbot.waitSignal(log.got_loaded, timeout=60_000):
        qtbot.mouseClick(panel.load_button, Qt.MouseButton.LeftButton)
    assert panel.progress.value() == 100 and panel.eject_button.isEnabled()
    with qtbot.waitSignal(log.got_unloaded, timeout=30_000):
        qtbot.mouseClick(panel.eject_button, Qt.MouseButton.LeftButton)
    assert panel.status.text() == "No model loaded" and window.controller.loaded is None


def test_shift_enter_adds_a_line(window: MainWindow, qtbot: QtBot) -> None:
    inp = window.chat_view.input
    qtbot.keyClicks(inp, "first")
    qtbot.keyClick(inp, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(inp, "second")
    assert inp.toPlainText() == "first\nsecond"
    assert window.chat_model.rowCount() == 0


@pytest.mark.model
def test_escape_stops_generation(qtbot: QtBot) -> None:
    w = open_window(qtbot, SamplingParams(temperature=0.0, max_tokens=1500))
    try:
        log = SignalLog(w.engine.worker)
        with qtbot.waitSignal(log.got_tokens, timeout=120_000):
            send(qtbot, w, "Write a long story about a lighthouse keeper.")
        assert w.chat_view.stop_button.isEnabled() and not w.chat_view.send_button.isEnabled()
        # The performance panel samples on its own timer while the reply streams.
        perf = w.perf_panel
        assert perf.timer.isActive()
        ticks = perf.ticks
        qtbot.waitUntil(lambda: perf.ticks >= ticks + 2, timeout=10_000)
        assert perf.generating and perf.labels["tg"].text().endswith(" tok/s")
        assert perf.labels["ttft"].text().endswith(" s")
        assert perf.labels["ctx"].text().endswith(" / 4,096 tokens")
        # Loading while a reply streams is refused with a message, and nothing gets stuck.
        qtbot.mouseClick(w.library_panel.load_button, Qt.MouseButton.LeftButton)
        assert w.banner.isVisible() and "Stop" in w.banner.label.text()
        assert not w.library_panel.cancel_button.isEnabled()
        with qtbot.waitSignal(log.got_finished, timeout=60_000) as blocker:
            qtbot.keyClick(w.chat_view.input, Qt.Key.Key_Escape)
        stats = blocker.args[0]
        assert stats.stop_reason == "cancelled" and stats.gen_tokens < 1500
        wait_idle(qtbot, w)
        reply = w.chat_model.message(1)
        assert reply.state == "stopped" and reply.text
        assert w.chat_view.message_widgets[1].footer.text().endswith("stopped")
        assert w.chat_view.send_button.isEnabled() and not w.chat_view.stop_button.isEnabled()
        assert log.squeezed() == ["progress", "loaded", "started", "tokens", "finished"]
    finally:
        close_window(w)


@pytest.mark.model
def test_new_chat_while_streaming_then_send(qtbot: QtBot) -> None:
    """Ctrl+N mid-reply abandons it; a question sent at once gets its own, complete reply
    (the abandoned reply's last tokens and end signal are still queued behind it)."""
    w = open_window(qtbot, SamplingParams(temperature=0.0, max_tokens=1500))
    try:
        log = SignalLog(w.engine.worker)
        with qtbot.waitSignal(log.got_tokens, timeout=120_000):
            send(qtbot, w, "Write a long story about a lighthouse keeper.")
        w.controller.sampling = GREEDY
        qtbot.keyClick(w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
        assert w.chat_model.rowCount() == 0
        send(qtbot, w, "Name three colours.")
        qtbot.waitUntil(lambda: len(log.values("finished")) == 2, timeout=120_000)
        wait_idle(qtbot, w)
        assert [w.chat_model.message(i).role for i in range(2)] == ["user", "assistant"]
        reply = w.chat_model.message(1)
        second = log.values("finished")[1]
        assert reply.state == "done" and reply.stats is second
        assert log.values("finished")[0].stop_reason == "cancelled"
        # Only the second reply's tokens are in the message.
        started = log.names.index("started", log.names.index("finished"))
        assert reply.text == "".join(v[0] for n, v in log.events[started:] if n == "tokens")
    finally:
        close_window(w)


def test_shortcuts_new_chat_and_focus(window: MainWindow, qtbot: QtBot) -> None:
    window.chat_model.append("user", "hello")
    window.chat_model.append("assistant", "hi")
    window.library_panel.table.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.library_panel.table)
    qtbot.keyClick(window, Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier)
    assert QApplication.focusWidget() is window.chat_view.input
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.chat_model.rowCount() == 0
    assert window.chat_view.message_widgets == []


def test_estimate_follows_settings(window: MainWindow) -> None:
    panel = window.library_panel
    est = panel.estimate
    panel.set_context_length(2048)
    small = est.current
    assert small is not None
    panel.set_context_length(8192)
    big = est.current
    assert big is not None and panel.context_length() == 8192
    # A full-attention model's KV cache grows linearly with the context; weights do not.
    assert big.kv == pytest.approx(small.kv * 4, rel=0.01)
    assert big.weights == small.weights and big.total > small.total
    assert panel.ctx_label.text() == "8,192"
    panel.type_k.setCurrentText("q8_0")
    panel.type_v.setCurrentText("q8_0")
    quantized = est.current
    assert quantized is not None and quantized.kv < big.kv
    # A user's page step on the slider (4 x 256 tokens) re-estimates at once.
    panel.ctx_slider.triggerAction(QAbstractSlider.SliderAction.SliderPageStepSub)
    stepped = est.current
    assert stepped is not None and panel.context_length() == 8192 - 4 * 256
    assert stepped.kv == pytest.approx(quantized.kv * (8192 - 1024) / 8192, rel=0.01)
    panel.gpu_auto.setChecked(False)
    assert panel.gpu_slider.isEnabled() and panel.gpu_layers() == panel.gpu_slider.value()
    assert est.verdict.text()  # a verdict is always shown


def test_corrupt_model_file_is_shown_not_crashed(
    window: MainWindow, qtbot: QtBot, smollm2_path: Path
) -> None:
    models = AppPaths.default().models
    models.mkdir(parents=True, exist_ok=True)
    (models / "broken.gguf").write_bytes(b"GGUF" + b"\xff" * 60)
    window.refresh_library()
    panel = window.library_panel
    assert panel.select("broken")
    row = window.library_model.row_of("broken")
    name = window.library_model.data(window.library_model.index(row, 0))
    assert name == "broken.gguf — unreadable"
    assert not panel.load_button.isEnabled()
    assert panel.estimate.verdict.text().startswith("This file cannot be used: ")

    # A file whose header is fine but whose weights are cut off fails in llama.cpp: the
    # message appears in the window's error banner.
    cut = models.parent / "cut.gguf"
    with smollm2_path.open("rb") as f:
        cut.write_bytes(f.read(smollm2_path.stat().st_size // 2))
    log = SignalLog(window.engine.worker)
    with qtbot.waitSignal(log.got_failed, timeout=30_000) as blocker:
        window.library_panel.load_requested.emit(cut, panel.load_params())
    assert window.banner.isVisible()
    assert window.banner.label.text() == blocker.args[0]
    assert blocker.args[0].startswith("Could not load cut.gguf: ")
    assert panel.status.text() == "No model loaded" and panel.load_button.isEnabled() is False


def test_item_models_pass_modeltester(qtmodeltester: ModelTester, tmp_path: Path) -> None:
    (tmp_path / "broken.gguf").write_bytes(b"nope")
    lib = LibraryModel(ModelLibrary(tmp_path).entries())
    assert lib.rowCount() == 2
    qtmodeltester.check(lib)
    chat = ChatModel()
    chat.append("user", "hi")
    row = chat.append("assistant", "", "streaming")
    chat.append_text(row, "hello")
    chat.finish(row, GenerationStats(gen_tokens=1))
    qtmodeltester.check(chat)
    assert chat.data(chat.index(1, 0)) == "hello"
    assert chat.data(QModelIndex()) is None


def test_code_block_copy_button(window: MainWindow, qtbot: QtBot) -> None:
    chat = window.chat_model
    row = chat.append("assistant", "", "streaming")
    chat.append_text(row, "Here:\n\n```python\nprint('hi')\n")
    blocks = window.chat_view.message_widgets[0].body.widgets
    assert isinstance(blocks[1], CodeBlock) and blocks[1].code == "print('hi')\n"
    chat.append_text(row, "x = 1\n```\n\nDone.")
    blocks = window.chat_view.message_widgets[0].body.widgets
    assert len(blocks) == 3 and isinstance(blocks[1], CodeBlock)
    qtbot.mouseClick(blocks[1].copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "print('hi')\nx = 1"
    assert blocks[1].copy_button.text() == "Copied"


def test_geometry_and_panels_are_remembered(qtbot: QtBot, candlewick_home: Path) -> None:
    w = open_window(qtbot)
    try:
        w.resize(780, 560)  # inside the offscreen screen (800x800), so nothing is clamped
        page = w.chat_page
        page.set_wish("sidebar", False)  # the user hid the conversations and the chart
        page.set_wish("perf", False)
        size = (w.width(), w.height())
        assert size != (1360, 860)
        assert not page.shown("sidebar") and not page.shown("perf")
    finally:
        close_window(w)
    assert (candlewick_home / "config" / "window.ini").is_file()
    w2 = open_window(qtbot)
    try:
        assert (w2.width(), w2.height()) == size
        page = w2.chat_page
        assert not page.shown("sidebar") and not page.shown("perf")
        assert not page.toggles["sidebar"].isChecked()
        assert page.wishes["sidebar"] is False and page.wishes["perf"] is False
        page.toggles["sidebar"].click()  # and back (it shows where the chat leaves it room)
        assert page.wishes["sidebar"] is True and page.order[0] == "sidebar"
    finally:
        close_window(w2)


def test_no_display_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    problem = platform_problem()
    assert problem is not None and "no graphical display" in problem and "\n" not in problem


@pytest.fixture
def restore_process_hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`candlewick` installs a crash handler and a log file for the whole process; undo both
    so later tests run as before."""
    import logging

    import app.crash

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    installed: list[app.crash.CrashHandler] = []
    real = app.crash.install_for_gui

    def install_and_remember() -> app.crash.CrashHandler | None:
        h = real()
        if h is not None:
            installed.append(h)
        return h

    monkeypatch.setattr(app.crash, "install_for_gui", install_and_remember)
    yield
    for h in installed:
        h.uninstall()
    for extra in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(extra)
        extra.close()
    root.setLevel(level)


@pytest.mark.usefixtures("restore_process_hooks")
def test_candlewick_without_arguments_opens_the_window(qtbot: QtBot) -> None:
    """`candlewick` with no arguments: the real entry point, on the qasync event loop."""
    from app.cli import main

    seen: dict[str, object] = {}

    def inspect_and_close() -> None:
        windows = [
            w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow) and w.isVisible()
        ]
        if not windows:
            QTimer.singleShot(50, inspect_and_close)
            return
        w = windows[0]
        entry = w.library_panel.selected_entry()
        seen.update(
            title=w.windowTitle(),
            selected=entry.id if entry else None,
            focus=w.focusWidget() is w.chat_view.input,
            pages=w.page_keys(),
            page=w.current_page(),
            sidebar=w.chat_page.shown("sidebar"),
            model_bar=w.model_bar.combo.currentText(),
        )
        w.close()

    QTimer.singleShot(0, inspect_and_close)
    assert main([]) == 0
    assert seen == {
        "title": "Candlewick",
        "selected": "default",
        "focus": True,
        "pages": ["chat", "models", "downloads", "documents", "server", "benchmark"],
        "page": "chat",  # a first start: the chat, its conversations and the bundled model
        "sidebar": True,
        "model_bar": "SmolLM2 135M Instruct · Q4_1",
    }
