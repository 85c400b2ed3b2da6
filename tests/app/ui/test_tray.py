"""The tray's menu offscreen, where Qt has no system tray: no icon is made, closing the window
quits as always, the "Keep serving" setting is greyed out with the reason, and every menu
action still does its work. The icon itself, hiding to it and the running server are the
X-server tier's (tests/app/ui/visual/test_tray_icon.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import QSystemTrayIcon, QWidget
from pytestqt.qtbot import QtBot

from app.services.paths import AppPaths
from app.services.secrets import SecretStore
from app.ui.server_panel import KEEP_SERVING, NO_MODEL_TIP, ServerPanel
from app.ui.tray import NO_TRAY_TIP, ServerTray
from engine.host.host import ModelHost
from tests.memory_keyring import MemoryKeyring

# Offscreen, Show window's raise() is a no-op Qt warns about.
pytestmark = pytest.mark.qt_log_ignore("This plugin does not support raise")


class Window(QWidget):
    """A main window that may refuse to close (as when the user answers Cancel)."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = False

    def closeEvent(self, e: QCloseEvent) -> None:
        if self.refuse:
            e.ignore()
        else:
            super().closeEvent(e)


@pytest.fixture
def parts(qtbot: QtBot) -> Iterator[tuple[Window, ServerPanel, ServerTray, QSettings, list[str]]]:
    paths = AppPaths.default().ensure()
    settings = QSettings(str(paths.config / "window.ini"), QSettings.Format.IniFormat)
    host = ModelHost()
    window = Window()
    qtbot.addWidget(window)
    panel = ServerPanel(
        loaded=lambda: None, secrets=SecretStore(MemoryKeyring()), settings=settings, parent=window
    )
    unloaded: list[str] = []
    tray = ServerTray(window, panel, host, unload=lambda name: unloaded.append(name) or True)
    yield window, panel, tray, settings, unloaded
    tray.shutdown()
    panel.shutdown()
    host.close()


def test_without_a_system_tray_there_is_no_icon_and_closing_quits(
    parts: tuple[Window, ServerPanel, ServerTray, QSettings, list[str]], qtbot: QtBot
) -> None:
    window, panel, tray, _, _ = parts
    assert not QSystemTrayIcon.isSystemTrayAvailable()  # offscreen: Qt says so
    assert tray.icon is None and not tray.available
    assert not panel.keep_serving.isEnabled() and panel.keep_serving.toolTip() == NO_TRAY_TIP
    assert not tray.keep_action.isEnabled() and tray.keep_action.toolTip() == NO_TRAY_TIP
    panel.keep_serving.setChecked(True)  # a setting saved on a desktop with a tray
    window.show()
    qtbot.waitExposed(window)
    assert window.close()  # nothing to hide it to: it closes
    assert not window.isVisible() and not tray.hidden_to_tray


def test_each_menu_action_does_its_work(
    parts: tuple[Window, ServerPanel, ServerTray, QSettings, list[str]], qtbot: QtBot
) -> None:
    window, panel, tray, settings, _ = parts
    titles = [a.text() for a in tray.menu.actions() if not a.isSeparator()]
    assert titles == [
        "Show window",
        "Local server",
        "Loaded models",
        "Keep serving when the window is closed",
        "Quit Candlewick",
    ]
    # Show window: a hidden window comes back.
    assert not window.isVisible()
    tray.show_action.trigger()
    qtbot.waitUntil(window.isVisible)
    # The server's toggle is the page's Start: off, with its reason, while no model is loaded.
    tray.menu.aboutToShow.emit()
    assert not tray.server_action.isEnabled() and not tray.server_action.isChecked()
    assert tray.server_action.toolTip() == NO_MODEL_TIP
    # The loaded models: none.
    listed = tray.models_menu.actions()
    assert [(a.text(), a.isEnabled()) for a in listed] == [("No model loaded", False)]
    # Keep serving: the page's box and the saved setting follow the menu, and back.
    panel.keep_serving.setEnabled(True)
    tray.keep_action.setEnabled(True)
    tray.keep_action.trigger()
    assert panel.keep_serving.isChecked()
    assert QSettings(settings.fileName(), settings.format()).value(KEEP_SERVING) == "true"
    panel.keep_serving.setChecked(False)
    assert not tray.keep_action.isChecked()
    assert QSettings(settings.fileName(), settings.format()).value(KEEP_SERVING) == "false"


def test_quit_closes_the_window_first_and_stays_when_it_refuses(
    parts: tuple[Window, ServerPanel, ServerTray, QSettings, list[str]], qtbot: QtBot
) -> None:
    window, _, tray, _, _ = parts
    quits: list[bool] = []
    tray.quit_app = lambda: quits.append(True)
    window.show()
    qtbot.waitExposed(window)
    window.refuse = True  # "Cancel" in the window's own question
    tray.quit_action.trigger()
    assert window.isVisible() and quits == []
    window.refuse = False
    tray.quit_action.trigger()
    assert not window.isVisible() and quits == [True]
