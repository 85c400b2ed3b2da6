"""A model file that makes llama.cpp abort on its first load: the window stays up and says
why. The probe child is made to abort through its fault hook (tests/engine/test_load_probe.py
says why a hook and not a file); the abort is a real GGML_ASSERT inside llama.cpp."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.services.paths import AppPaths
from engine.native.load_probe import FirstLoads
from engine.native.native_load import FAULT_ENV
from tests.app.ui.test_ui_window import close_window, open_window
from tests.app.ui.ui_signal_log import SignalLog

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def test_an_abort_on_first_load_leaves_the_window_up(
    qtbot: QtBot, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = AppPaths.default().models
    models.mkdir(parents=True, exist_ok=True)
    path = Path(shutil.copyfile(smollm2_path, models / "aborts.gguf"))
    window = open_window(qtbot)
    try:
        panel = window.library_panel
        log = SignalLog(window.engine.worker)
        monkeypatch.setenv(FAULT_ENV, "abort")
        with qtbot.waitSignal(log.got_failed, timeout=60_000) as blocker:
            panel.load_requested.emit(path, panel.load_params())
        message = blocker.args[0]
        assert re.fullmatch(
            r"Could not load aborts\.gguf: llama\.cpp crashed while loading "
            r"aborts\.gguf \(SIGABRT\): llama-model\.cpp:\d+: "
            r"GGML_ASSERT\(!ml\.no_alloc\) failed",
            message,
        ), message
        assert window.isVisible() and window.banner.isVisible()
        assert window.banner.label.text() == message
        assert not FirstLoads(AppPaths.default().cache).known(path)

        # Without the fault the same file loads, and is remembered for next time.
        monkeypatch.delenv(FAULT_ENV)
        with qtbot.waitSignal(log.got_loaded, timeout=60_000):
            panel.load_requested.emit(path, panel.load_params())
        assert FirstLoads(AppPaths.default().cache).known(path)
    finally:
        close_window(window)
