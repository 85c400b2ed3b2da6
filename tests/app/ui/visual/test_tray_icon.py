"""The tray icon on a real X server, with a system tray (tray_manager.py owns the X tray
selection as a desktop's tray does) and without one (a bare Xvfb, where Qt says there is no
tray): the real window, the chat's SmolLM2 served by the Local server from the tray's menu,
the window's close button (as a window manager sends it) hiding it to the tray while the server
answers, shown again, the chat's model unloaded from the menu, the server turned off, and Quit;
File → Quit quits while the tray would keep serving; without a tray, no icon and closing quits.

Run by test_xserver_tier.py on Xvfb; see conftest.py."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QSystemTrayIcon
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.ui.main_window import MainWindow
from app.ui.server_panel import ServerPanel
from app.ui.tray import ServerTray
from engine.settings import LoadParams
from tests.app.ui.visual.tray_manager import ask_to_close, system_tray

pytestmark = pytest.mark.xserver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    assert QGuiApplication.platformName() == "xcb", "this tier draws on a real X server"
    w = build_window()
    w.ask_quit = lambda _parent, _warnings: True  # "Quit" in the window's own question
    w.show()
    qtbot.waitExposed(w)
    yield w
    w.close()
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def parts(w: MainWindow) -> tuple[ServerTray, ServerPanel]:
    tray = w.findChild(ServerTray)
    panel = w.page("server")
    assert isinstance(tray, ServerTray) and isinstance(panel, ServerPanel)
    return tray, panel


def health(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        answer: dict[str, object] = json.loads(r.read())
    return answer


@pytest.fixture
def tray_on_screen(qtbot: QtBot) -> Iterator[None]:
    with system_tray():
        qtbot.waitUntil(QSystemTrayIcon.isSystemTrayAvailable)
        yield


def test_the_tray_serves_with_the_window_hidden(
    tray_on_screen: None, window: MainWindow, qtbot: QtBot, smollm2_path: Path
) -> None:
    tray, panel = parts(window)
    assert tray.available and tray.icon is not None
    assert not tray.icon.isVisible()  # nothing served yet
    assert panel.keep_serving.isEnabled()
    assert window.controller.load(smollm2_path, LoadParams(n_ctx=1024, n_threads=2))
    qtbot.waitUntil(lambda: window.controller.loaded is not None, timeout=120_000)
    panel.port.setValue(free_port())
    panel.require_key.setChecked(False)

    # Server on, from the menu.
    tray.menu.aboutToShow.emit()
    assert tray.server_action.isEnabled() and not tray.server_action.isChecked()
    tray.server_action.trigger()
    qtbot.waitUntil(lambda: panel.phase == "running", timeout=120_000)
    assert tray.icon.isVisible() and tray.server_action.isChecked()
    url = panel.url.text()
    assert tray.icon.toolTip() == f"Candlewick: serving at {url}"
    tray.menu.aboutToShow.emit()
    unloads = tray.model_actions()
    [chat_line] = [line for line in unloads if line.endswith("(chat)")]
    assert unloads[chat_line].isEnabled()

    # Keep serving, then the window's close button: hidden, the server still answers.
    tray.keep_action.trigger()
    assert panel.keep_serving.isChecked()
    ask_to_close(int(window.winId()))
    qtbot.waitUntil(lambda: not window.isVisible())
    assert tray.hidden_to_tray and tray.icon.isVisible() and panel.phase == "running"
    assert health(url)["status"] == "ok"

    tray.show_action.trigger()
    qtbot.waitExposed(window)
    assert window.isVisible() and not tray.hidden_to_tray

    # The chat's model unloaded from the menu, the server goes on; then off from the menu.
    unloads[chat_line].trigger()
    qtbot.waitUntil(lambda: window.controller.loaded is None, timeout=60_000)
    assert panel.phase == "running"
    tray.server_action.trigger()
    qtbot.waitUntil(lambda: panel.phase == "stopped", timeout=60_000)
    assert not tray.icon.isVisible() and not tray.server_action.isChecked()

    # Quit: the window closes (not hidden), then the application ends.
    quits: list[bool] = []
    tray.quit_app = lambda: quits.append(True)
    tray.quit_action.trigger()
    assert quits == [True] and not window.isVisible()


def test_file_quit_quits_while_the_tray_keeps_serving(
    tray_on_screen: None, window: MainWindow, qtbot: QtBot, smollm2_path: Path
) -> None:
    tray, panel = parts(window)
    assert window.controller.load(smollm2_path, LoadParams(n_ctx=1024, n_threads=2))
    qtbot.waitUntil(lambda: window.controller.loaded is not None, timeout=120_000)
    panel.port.setValue(free_port())
    panel.require_key.setChecked(False)
    panel.keep_serving.setChecked(True)
    assert panel.start()
    qtbot.waitUntil(lambda: panel.phase == "running", timeout=120_000)
    assert tray.keeps_serving
    window.quit_action.trigger()  # File → Quit: asked (answered Quit), and closed
    assert not window.isVisible() and not tray.hidden_to_tray


@pytest.fixture
def no_tray(qtbot: QtBot) -> None:
    """A bare Xvfb has no tray (one a former test started goes with its owner)."""
    qtbot.waitUntil(lambda: not QSystemTrayIcon.isSystemTrayAvailable())


def test_without_a_tray_there_is_no_icon_and_closing_quits(
    no_tray: None, window: MainWindow
) -> None:
    tray, panel = parts(window)
    assert not tray.available and tray.icon is None
    assert not panel.keep_serving.isEnabled() and not tray.keep_action.isEnabled()
    panel.keep_serving.setChecked(True)
    assert window.close()
    assert not window.isVisible() and not tray.hidden_to_tray
