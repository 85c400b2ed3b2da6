"""The window's rail, the model bar and the colour scheme: pages reached by the keyboard and
by name, the model bar's badges (fit, vision/audio) and its buttons following the load, and
View → Appearance switching the palette and remembering it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.library import LibraryEntry
from app.services.projectors import ProjectorInfo
from app.ui.estimate import EstimateView
from app.ui.library_model import LibraryModel
from app.ui.main_window import MainWindow
from app.ui.model_bar import ModelBar, fit_badge
from engine.settings import LoadParams
from tests.app.ui.test_ui_window import close_window

pytestmark = pytest.mark.qt_log_ignore(
    "This plugin does not support propagateSizeHints", "This plugin does not support raise"
)


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = build_window(model_manager=True)
    w.show()
    qtbot.waitExposed(w)
    yield w
    close_window(w)


def test_the_rail_pages_are_named_and_reached_by_keyboard(window: MainWindow, qtbot: QtBot) -> None:
    w = window
    rail = w.rail
    labels = [rail.buttons[k].accessibleName() for k in w.page_keys()]
    assert labels == ["Chat", "Models", "Downloads", "Documents", "Local server", "Benchmark"]
    assert w.current_page() == "chat" and rail.buttons["chat"].isChecked()
    # Down from Chat to Models, then Space shows it.
    rail.buttons["chat"].setFocus()
    qtbot.keyClick(rail.buttons["chat"], Qt.Key.Key_Down)
    assert rail.buttons["models"].hasFocus()
    qtbot.keyClick(rail.buttons["models"], Qt.Key.Key_Space)
    assert w.current_page() == "models"
    assert w.pages.currentWidget() is w.library_panel.parentWidget().parentWidget().parentWidget()
    # The model bar's "Load settings…" goes to the same page; Ctrl+1 back to the chat.
    w.show_page("chat")
    w.model_bar.settings_button.click()
    assert w.current_page() == "models"
    go = {a.text(): a for a in w.actions_for_palette()}
    assert {"New chat", "Chat", "Models", "Local server", "Benchmark", "Dark"} <= set(go)
    go["Chat"].trigger()
    assert w.current_page() == "chat"
    # Revealing the chat settings opens the drawer on the Chat page.
    assert w.chat_settings is not None
    w.show_page("server")
    assert w.reveal(w.chat_settings)
    assert w.current_page() == "chat" and w.chat_page.shown("drawer")


def test_a_first_start_shows_the_chat_with_the_bundled_model_ready(window: MainWindow) -> None:
    w = window
    assert w.current_page() == "chat"
    assert w.chat_page.shown("sidebar")
    bar = w.model_bar
    assert bar.combo.currentText() == "SmolLM2 135M Instruct · Q4_1"
    assert bar.fit.isVisibleTo(bar) and bar.fit.text() == "fits"
    assert not bar.capabilities.isVisibleTo(bar)  # a text model
    assert bar.state.text() == "Not loaded"
    assert bar.load_button.isVisibleTo(bar) and bar.load_button.isEnabled()
    assert not bar.eject_button.isVisibleTo(bar) and not bar.progress.isVisibleTo(bar)


@pytest.mark.model
def test_the_model_bar_loads_and_ejects(window: MainWindow, qtbot: QtBot) -> None:
    w = window
    bar = w.model_bar
    bar.load_button.click()
    assert bar.progress.isVisibleTo(bar) and bar.cancel_button.isVisibleTo(bar)
    assert bar.state.text() == "Loading…"
    qtbot.waitUntil(lambda: bar.state.text().startswith("Loaded · ctx"), timeout=120_000)
    assert bar.eject_button.isVisibleTo(bar) and not bar.load_button.isVisibleTo(bar)
    bar.eject_button.click()
    qtbot.waitUntil(lambda: w.controller.loaded is None, timeout=60_000)
    qtbot.waitUntil(lambda: bar.state.text() == "Not loaded", timeout=5_000)
    assert bar.load_button.isVisibleTo(bar) and not bar.eject_button.isVisibleTo(bar)


def estimate(verdict: str, ram: int, free: int) -> EstimateView:
    return EstimateView(ram, 0, 0, 0, ram, 0, free, None, 0, verdict, "")


def test_fit_badges_and_capabilities(qtbot: QtBot, tmp_path: Path) -> None:
    assert fit_badge(None) is None
    assert fit_badge(estimate("fits", 100, 1000)) == "fits"
    assert fit_badge(estimate("fits", 900, 1000)) == "tight"
    assert fit_badge(estimate("partial", 100, 1000)) == "tight"
    assert fit_badge(estimate("no", 100, 1000)) == "no"
    seen = ProjectorInfo(tmp_path / "mmproj-f16.gguf", vision=True, audio=True)
    entries = [
        LibraryEntry("a", tmp_path / "a.gguf", "imported", projector=seen),
        LibraryEntry("b", tmp_path / "b.gguf", "imported", error="not a GGUF file"),
    ]
    model = LibraryModel(entries)
    bar = ModelBar(model, lambda _p, _params: estimate("no", 10, 5), LoadParams)
    qtbot.addWidget(bar)
    assert bar.combo.count() == 2
    bar.set_selected(entries[0])
    assert bar.fit.text() == "won't fit"
    assert "vision" in bar.capabilities.text() and "audio" in bar.capabilities.text()
    chosen: list[str] = []
    bar.model_chosen.connect(chosen.append)
    bar.combo.activated.emit(1)
    assert chosen == ["b"]


def test_appearance_switches_the_palette_and_is_remembered(qtbot: QtBot) -> None:
    def dark() -> bool:
        pal = QApplication.palette()
        return pal.color(QPalette.ColorRole.Window).lightness() < 128

    w = build_window()
    try:
        assert not dark()
        w.scheme_actions["dark"].trigger()
        assert dark() and w.scheme_actions["dark"].isChecked()
    finally:
        close_window(w)
    w2 = build_window()
    try:
        assert dark() and w2.scheme_actions["dark"].isChecked()
        w2.scheme_actions["light"].trigger()
        assert not dark()
        w2.scheme_actions["system"].trigger()
        assert not dark()
    finally:
        close_window(w2)
