"""Load settings changed while the selected model is loaded say that they apply after a
reload (on the real SmolLM2), and stop saying so once they match again or after the reload."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.ui.main_window import MainWindow
from engine.settings import SamplingParams
from tests.app.ui.test_ui_window import close_window, open_window

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = open_window(qtbot, SamplingParams())
    w.show_page("models")  # the library and its load settings
    yield w
    close_window(w)


def load_as_set(qtbot: QtBot, w: MainWindow, n_ctx: int) -> None:
    lp = w.library_panel
    lp.set_context_length(n_ctx)
    qtbot.mouseClick(lp.load_button, Qt.MouseButton.LeftButton)
    # The panel's own record of the load, which the hint compares with: the window sets it
    # from the engine's `loaded` after the controller has taken it.
    qtbot.waitUntil(
        lambda: (
            w.controller.loaded is not None
            and w.controller.loaded.n_ctx == n_ctx
            and lp.loaded is not None
            and lp.loaded.n_ctx == n_ctx
        ),
        timeout=60_000,
    )


@pytest.mark.model
def test_changed_load_settings_say_reload_to_apply(window: MainWindow, qtbot: QtBot) -> None:
    lp = window.library_panel
    assert not lp.reload_hint.isVisible()
    load_as_set(qtbot, window, 2048)
    assert not lp.reload_hint.isVisible() and lp.load_button.text() == "Load"
    lp.set_context_length(4096)
    assert lp.reload_hint.isVisible()
    assert "(context 2,048)" in lp.reload_hint.text() and lp.load_button.text() == "Reload"
    lp.set_context_length(2048)  # back to what is loaded
    assert not lp.reload_hint.isVisible()
    lp.type_k.setCurrentText("q8_0")
    assert lp.reload_hint.isVisible() and "context" not in lp.reload_hint.text()
    lp.type_k.setCurrentText("f16")
    lp.set_context_length(4096)
    load_as_set(qtbot, window, 4096)
    assert not lp.reload_hint.isVisible() and lp.load_button.text() == "Load"
