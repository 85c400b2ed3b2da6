"""Speculative decoding and per-model load settings in the window, on the real SmolLM2:
choosing prompt lookup gives replies with drafts (shown in the performance panel), settings
are remembered per model across windows, a draft model with another vocabulary is refused
with one line."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.library import LibraryEntry, ModelLibrary
from app.services.paths import AppPaths
from app.ui import library_panel
from app.ui.library_panel import LibraryPanel, inexact_note
from app.ui.main_window import MainWindow
from engine.host.stats import GenerationStats
from engine.memory.cpu_kernels import Exactness
from engine.settings import SamplingParams
from tests.app.ui.ui_signal_log import SignalLog
from tests.engine.drafting import always_draft  # noqa: F401 (a fixture)

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

QUOTE = (
    "The quick brown fox jumps over the lazy dog. The early bird catches the worm. "
    "Repeat both sentences exactly."
)


def open_window(qtbot: QtBot) -> MainWindow:
    w = build_window(sampling=SamplingParams(temperature=0, max_tokens=24))
    w.show()
    qtbot.waitExposed(w)
    return w


def close_window(w: MainWindow) -> None:
    w.close()
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.fixture(autouse=True)
def exact_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The panel's flash-attention rule depends on the model's kernels on this build; these
    tests pin a model whose drafting can be exact, test_amx_kernels_leave_flash_to_the_user the
    other side."""
    monkeypatch.setattr(library_panel, "drafting_exact", lambda path: Exactness(True, ""))


@pytest.fixture
def windows(qtbot: QtBot) -> Iterator[list[MainWindow]]:
    opened: list[MainWindow] = []
    yield opened
    for w in opened:
        close_window(w)


def choose(panel: LibraryPanel, mode: str) -> None:
    panel.spec_mode.setCurrentIndex(panel.spec_mode.findData(mode))


def entry_for(panel: LibraryPanel, path: Path) -> LibraryEntry:
    for row in range(panel.model.rowCount()):
        e = panel.model.entry(row)
        if e.path.resolve() == path.resolve():
            return e
    raise AssertionError(f"{path.name} is not in the library")


def entry_id(panel: LibraryPanel, path: Path) -> str:
    return entry_for(panel, path).id


@pytest.mark.model
@pytest.mark.usefixtures("always_draft")  # what drafts do, not whether they pay here
def test_prompt_lookup_reply_shows_drafts(qtbot: QtBot, windows: list[MainWindow]) -> None:
    w = open_window(qtbot)
    windows.append(w)
    lp = w.library_panel
    lp.set_context_length(1024)
    assert lp.load_params().speculative is None
    choose(lp, "lookup")
    # Drafting forces flash attention on, and says so.
    assert lp.flash.currentText() == "on" and not lp.flash.isEnabled()
    assert lp.spec_note.isVisibleTo(lp) and "Flash attention is on" in lp.spec_note.text()
    params = lp.load_params()
    assert params.speculative is not None and params.speculative.mode == "lookup"
    assert params.flash_attn == "on"
    log = SignalLog(w.engine.worker)
    with qtbot.waitSignal(log.got_loaded, timeout=120_000):
        qtbot.mouseClick(lp.load_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(log.got_finished, timeout=300_000) as done:
        w.chat_view.input.setPlainText(QUOTE)
        qtbot.keyClick(w.chat_view.input, Qt.Key.Key_Return)
    stats: GenerationStats = done.args[0]
    assert 0 < stats.draft_accepted <= stats.draft_tokens
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=30_000)
    text = w.perf_panel.labels["spec"].text()
    assert f"{stats.draft_accepted}/{stats.draft_tokens} drafted tokens accepted" in text
    # Back to off: flash attention is the user's choice again.
    choose(lp, "off")
    assert lp.flash.isEnabled() and lp.flash.currentText() == "auto"
    assert not lp.spec_note.isVisibleTo(lp)


def test_amx_kernels_leave_flash_to_the_user(
    qtbot: QtBot, windows: list[MainWindow], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With AMX weights flash attention cannot make drafts exact, so drafting does not force
    it (it would only cost speed); the note says what the user gets instead."""
    why = "Q4_1 weights are repacked for AMX kernels"
    monkeypatch.setattr(library_panel, "drafting_exact", lambda path: Exactness(False, why))
    w = open_window(qtbot)
    windows.append(w)
    lp = w.library_panel
    lp.flash.setCurrentText("off")
    choose(lp, "lookup")
    assert lp.flash.isEnabled() and lp.flash.currentText() == "off"
    assert lp.spec_note.isVisibleTo(lp) and lp.spec_note.text() == inexact_note(why)
    params = lp.load_params()
    assert params.flash_attn == "off"
    assert params.speculative is not None and params.speculative.mode == "lookup"
    choose(lp, "off")
    assert lp.flash.isEnabled() and lp.flash.currentText() == "off"
    assert not lp.spec_note.isVisibleTo(lp)


def test_settings_remembered_per_model(
    qtbot: QtBot, windows: list[MainWindow], gemma_path: Path
) -> None:
    ModelLibrary(AppPaths.default().models).import_file(gemma_path)
    w = open_window(qtbot)
    windows.append(w)
    lp = w.library_panel
    gemma = entry_id(lp, gemma_path)
    assert lp.select("default")
    lp.set_context_length(1024)
    lp.type_k.setCurrentText("q8_0")
    lp.type_v.setCurrentText("q8_0")
    choose(lp, "lookup")
    lp.draft_max.setValue(6)
    assert lp.select(gemma)
    choose(lp, "off")
    lp.set_context_length(2048)
    lp.type_k.setCurrentText("f16")
    lp.type_v.setCurrentText("f16")
    lp.flash.setCurrentText("off")

    def check_default(panel: LibraryPanel) -> None:
        p = panel.load_params()
        assert (p.n_ctx, p.type_k, p.type_v, p.flash_attn) == (1024, "q8_0", "q8_0", "on")
        assert p.speculative is not None and p.speculative.mode == "lookup"
        assert p.speculative.draft_max == 6

    def check_gemma(panel: LibraryPanel) -> None:
        p = panel.load_params()
        assert (p.n_ctx, p.type_k, p.flash_attn, p.speculative) == (2048, "f16", "off", None)

    assert lp.select("default")
    check_default(lp)
    assert lp.select(gemma)
    check_gemma(lp)
    assert lp.select("default")
    close_window(windows.pop())

    w2 = open_window(qtbot)  # a new window, same profile
    windows.append(w2)
    lp2 = w2.library_panel
    selected = lp2.selected_entry()
    assert selected is not None and selected.id == "default"
    check_default(lp2)
    assert lp2.select(gemma)
    check_gemma(lp2)


def test_draft_model_with_other_vocabulary_refused(
    qtbot: QtBot, windows: list[MainWindow], gemma_path: Path
) -> None:
    ModelLibrary(AppPaths.default().models).import_file(gemma_path)
    w = open_window(qtbot)
    windows.append(w)
    lp = w.library_panel
    assert lp.select("default")
    choose(lp, "draft")
    assert lp.draft_model.isEnabled()
    i = lp.draft_model.findData(str(entry_for(lp, gemma_path).path))
    assert i >= 0
    lp.draft_model.setCurrentIndex(i)
    note = lp.spec_note.text()
    assert "cannot be a draft model" in note and "262144 tokens" in note and "\n" not in note
    assert lp.spec_note.isVisibleTo(lp)
    assert not lp.load_button.isEnabled()
    # The engine refuses it too, with one line, if a load is asked for anyway.
    path = lp.selected_path()
    assert path is not None
    log = SignalLog(w.engine.worker)
    with qtbot.waitSignal(log.got_failed, timeout=120_000) as failed:
        w.engine.load(path, lp.load_params())
    message = failed.args[0]
    assert "cannot be a draft model" in message and "\n" not in message
    assert w.engine.worker.model is None


def test_perf_panel_shows_the_measured_gain(qtbot: QtBot) -> None:
    """The panel shows what drafting measured on this model (the loop's figure), not a
    speed-up against another reply."""
    from app.ui.perf_panel import PerfPanel
    from app.ui.worker import LoadedModel

    panel = PerfPanel()
    qtbot.addWidget(panel)
    info = LoadedModel(
        path=Path("/models/a.gguf"), name="a", n_ctx=512, n_layer=30, n_gpu_layers=0, load_s=0.1
    )
    panel.on_loaded(info)
    spec = GenerationStats(gen_tokens=40, gen_tps=60.0, draft_tokens=20, draft_accepted=15)
    panel.follow(1)
    panel.on_finished(1, spec)
    # Not measured yet: no gain to show.
    assert panel.labels["spec"].text() == "15/20 drafted tokens accepted (75%)"
    panel.follow(2)
    panel.on_finished(2, GenerationStats(gen_tokens=40, gen_tps=40.0))
    assert panel.labels["spec"].text() == "—"
    panel.follow(3)
    panel.on_finished(3, replace(spec, draft_gain=1.234))
    assert panel.labels["spec"].text() == (
        "15/20 drafted tokens accepted (75%) · measured gain x1.23 on this model"
    )
    # Drafting measured slower: the loop drafted nothing, and the panel says what it measured.
    panel.follow(4)
    panel.on_finished(4, GenerationStats(gen_tokens=40, gen_tps=40.0, draft_gain=0.97))
    assert panel.labels["spec"].text() == "nothing drafted · measured gain x0.97 on this model"
