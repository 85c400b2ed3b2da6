"""The tray icon while the Local server serves, and the window hidden to it.

The icon (QSystemTrayIcon) shows while the server runs, or while the window is hidden to the
tray. Its menu: Show window, the Local server on or off (the Local server page's own Start and
Stop), the models loaded in the app's host (each can be unloaded, as in Tools → Loaded
models), "Keep serving when the window is closed" (the same setting as the Local server page's
box) and Quit.

With that setting on, closing the window (its close button) while the server runs hides the
window instead, and the server goes on answering; Quit in the menu, like File → Quit, quits
(asking first, since the server would stop). Where the desktop has no system tray (some Wayland and
bare X sessions; Qt says so), no icon is made, the setting is turned off and greyed out with
the reason, and closing the window quits as always: a hidden window could not be found again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QIcon
from PySide6.QtWidgets import QApplication, QMenu, QStyle, QSystemTrayIcon, QWidget

from app.services.model_catalog import CHAT_OWNER
from app.ui.server_panel import ServerPanel
from engine.host.host import ModelHost
from engine.host.host_entry import HostedModel
from engine.host.runtime import Model

ICON = Path(__file__).resolve().parents[2] / "resources" / "icons" / "candlewick-32.png"
NO_TRAY_TIP = (
    "This desktop has no system tray: closing the window quits, since a hidden window "
    "could not be shown again"
)
HIDDEN_MESSAGE = "Candlewick keeps serving in the background. Quit from this icon's menu."
Unload = Callable[[str], bool]  # unloads a model by its host name; False: it cannot be


def tray_icon() -> QIcon:
    """The app's icon (resources/icons, in the bundle too), or the platform's computer icon."""
    if ICON.is_file():
        return QIcon(str(ICON))
    return QApplication.style().standardIcon(QStyle.StandardPixmap.SP_ComputerIcon)


def model_title(h: HostedModel, title: str) -> str:
    """A model's line in the menu: its name and what it is doing."""
    if h.state != "ready":
        return f"{title} (loading)"
    if h.in_flight:
        return f"{title} ({h.in_flight} in flight)"
    if h.owner == CHAT_OWNER:
        return f"{title} (chat)"
    return f"{title} ({'pinned' if h.pinned else 'idle'})"


def unloadable(h: HostedModel) -> bool:
    """The chat's model (ejected as the library does) or one API requests loaded; not one
    another part of the app holds (the documents' embedding model)."""
    return h.state == "ready" and h.owner in (None, CHAT_OWNER)


class ServerTray(QObject):
    """The tray icon and its menu over the main window and its Local server page.
    `available`: whether the desktop has a system tray (default: Qt's answer)."""

    _host_changed = Signal()

    def __init__(
        self,
        window: QWidget,
        panel: ServerPanel,
        host: ModelHost,
        *,
        unload: Unload,
        title: Callable[[HostedModel], str] = lambda h: h.name,
        quit_app: Callable[[], None] = QApplication.quit,
        available: bool | None = None,
    ) -> None:
        super().__init__(window)
        self.window = window
        self.panel = panel
        self.host = host
        self._unload = unload
        self._title = title
        self.quit_app = quit_app  # ends the application once the window closed
        self.available = QSystemTrayIcon.isSystemTrayAvailable() if available is None else available
        self.hidden_to_tray = False
        self._quitting = False
        self._told = False  # the "keeps serving" message, once a session

        self.menu = QMenu(window)
        self.show_action = self.menu.addAction("Show window")
        self.show_action.triggered.connect(self.show_window)
        self.server_action = self.menu.addAction("Local server")
        self.server_action.setCheckable(True)
        self.server_action.triggered.connect(self._toggle_server)
        self.menu.addSeparator()
        self.models_menu = self.menu.addMenu("Loaded models")
        self.menu.addSeparator()
        self.keep_action = self.menu.addAction("Keep serving when the window is closed")
        self.keep_action.setCheckable(True)
        self.keep_action.setChecked(panel.keep_serving.isChecked())
        self.keep_action.toggled.connect(panel.keep_serving.setChecked)
        panel.keep_serving.toggled.connect(self.keep_action.setChecked)
        self.menu.addSeparator()
        self.quit_action = self.menu.addAction("Quit Candlewick")
        self.quit_action.triggered.connect(self.quit)
        self.menu.aboutToShow.connect(self.refresh)

        self.icon: QSystemTrayIcon | None = None
        if self.available:
            self.icon = QSystemTrayIcon(tray_icon(), self)
            self.icon.setToolTip("Candlewick")
            self.icon.setContextMenu(self.menu)
            self.icon.activated.connect(self._on_activated)
        else:  # the setting is kept for a session that has a tray
            panel.keep_serving.setEnabled(False)
            panel.keep_serving.setToolTip(NO_TRAY_TIP)
            self.keep_action.setEnabled(False)
            self.keep_action.setToolTip(NO_TRAY_TIP)
        panel.running_changed.connect(lambda _running: self.refresh())
        self._host_changed.connect(self.refresh, Qt.ConnectionType.QueuedConnection)
        self._unsubscribe: Callable[[], None] | None = host.on_change(self._on_host_change)
        window.installEventFilter(self)
        self.refresh()

    # -- state -------------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        return self.panel.phase in ("starting", "running")

    @property
    def keeps_serving(self) -> bool:
        """Whether closing the window now hides it (and the server goes on)."""
        return self.icon is not None and self.keep_action.isChecked() and self.serving

    def _on_host_change(self, _name: str, _model: Model | None) -> None:
        """On the host's threads: only a queued signal."""
        with contextlib.suppress(RuntimeError):  # the tray is gone (the window closed)
            self._host_changed.emit()

    def refresh(self) -> None:
        """The menu and the icon as things are: the server's state, the loaded models."""
        phase = self.panel.phase
        self.server_action.setChecked(self.serving)
        self.server_action.setText(
            {
                "starting": "Local server (starting…)",
                "stopping": "Local server (stopping…)",
            }.get(phase, "Local server")
        )
        problem = self.panel.start_button.toolTip() if phase == "stopped" else ""
        self.server_action.setEnabled(self.panel.start_button.isEnabled())
        self.server_action.setToolTip(problem)
        self._fill_models()
        if self.icon is not None:
            self.icon.setVisible(self.serving or self.hidden_to_tray)
            self.icon.setToolTip(
                f"Candlewick: serving at {self.panel.url.text()}"
                if phase == "running" and self.panel.url.text()
                else "Candlewick"
            )

    def _fill_models(self) -> None:
        self.models_menu.clear()
        hosted = self.host.hosted()
        if not hosted:
            none = self.models_menu.addAction("No model loaded")
            none.setEnabled(False)
            return
        for h in hosted:
            sub = self.models_menu.addMenu(model_title(h, self._title(h)))
            unload = sub.addAction("Unload")
            unload.setEnabled(unloadable(h))
            unload.triggered.connect(lambda _c=False, name=h.name: self._unload(name))

    def model_actions(self) -> dict[str, QAction]:
        """Each listed model's Unload action, by the model's line in the menu."""
        out: dict[str, QAction] = {}
        for a in self.models_menu.actions():
            sub = a.menu()
            if isinstance(sub, QMenu):
                out[a.text()] = sub.actions()[0]
        return out

    # -- actions -----------------------------------------------------------------------------

    def _toggle_server(self, on: bool) -> None:
        if on:
            self.panel.start()
        else:
            self.panel.stop()
        self.refresh()

    def _on_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (
            QSystemTrayIcon.ActivationReason.Trigger,
            QSystemTrayIcon.ActivationReason.DoubleClick,
        ):
            self.show_window()

    def show_window(self) -> None:
        self.hidden_to_tray = False
        self.window.showNormal()
        self.window.raise_()
        self.window.activateWindow()
        self.refresh()

    def quit(self) -> None:
        """Quit as the window's own close does (its questions included), then end the app."""
        self._quitting = True
        if self.window.close():
            self.quit_app()
        else:  # the user chose to stay (the server would stop)
            self._quitting = False

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        # Only a close the user asked of the window system (its close button, Alt+F4) hides
        # it: File → Quit and this menu's Quit close it from the program, and quit.
        if (
            watched is self.window
            and event.type() == QEvent.Type.Close
            and event.spontaneous()
            and not self._quitting
            and self.keeps_serving
        ):
            assert isinstance(event, QCloseEvent)
            event.ignore()  # not closed: hidden, and the app goes on
            self.hidden_to_tray = True
            self.window.hide()
            self.refresh()
            if self.icon is not None and not self._told:
                self._told = True
                self.icon.showMessage("Candlewick", HIDDEN_MESSAGE, tray_icon(), 5000)
            return True
        return super().eventFilter(watched, event)

    def shutdown(self) -> None:
        """Stop listening to the host; the icon goes."""
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        self.window.removeEventFilter(self)
        if self.icon is not None:
            self.icon.hide()
