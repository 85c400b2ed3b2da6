"""Broken model files through the desktop app's load path (the library panel's load request,
the engine worker, the first-load probe): the window stays up and says in one line why each
refused file was refused. The files are the fuzz corpus of tests/fuzz_gguf.py."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tests.app.ui.test_ui_window import close_window, open_window
from tests.app.ui.ui_signal_log import SignalLog
from tests.fuzz_gguf import Corpus, is_one_line

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

SEED = 7  # another seed than the CLI corpus test's, so these are other files
# A longer run: CANDLEWICK_DESKTOP_FUZZ_FILES=1000 (docs/reliability.md).
FILES = int(os.environ.get("CANDLEWICK_DESKTOP_FUZZ_FILES", "36"))


def test_fuzzed_files_through_the_window(qtbot: QtBot, smollm2_path: Path, tmp_path: Path) -> None:
    window = open_window(qtbot)
    outcomes: collections.Counter[str] = collections.Counter()
    try:
        panel = window.library_panel
        log = SignalLog(window.engine.worker)
        for i, mutation in enumerate(Corpus(smollm2_path).generate(SEED, FILES)):
            path = tmp_path / f"fuzz-{i:04d}.gguf"
            mutation.write(path)
            log.clear()
            panel.load_requested.emit(path, panel.load_params())
            qtbot.waitUntil(lambda: bool({"loaded", "failed"} & set(log.names)), timeout=30_000)
            path.unlink()
            assert window.isVisible(), mutation.label
            if "loaded" in log.names:
                outcomes["loaded"] += 1
                assert window.model_label.text().endswith("ctx 4,096"), mutation.label
                continue
            outcomes["refused"] += 1
            message = log.values("failed")[0]
            assert is_one_line(message), (mutation.label, message)
            assert message.startswith(f"Could not load {path.name}: "), message
            assert "internal error" not in message, (mutation.label, message)
            assert window.banner.isVisible() and window.banner.label.text() == message
            assert window.model_label.text() == "No model loaded"
        # Most mutations are refused; the rest are ones llama.cpp tolerates (docs/reliability.md).
        assert outcomes["refused"] >= FILES // 2, outcomes
        assert outcomes["refused"] + outcomes["loaded"] == FILES
        print(f"desktop fuzz, seed {SEED}: {FILES} files, {dict(outcomes)}")  # with -s
    finally:
        close_window(window)
