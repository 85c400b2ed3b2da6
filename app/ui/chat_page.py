"""The Chat page: the conversations sidebar (left), the chat with its model bar on top
(centre), the chat settings drawer and the performance panel (right).

The sidebar, the drawer and the performance panel each fold with a toolbar button; what the
user chose is kept (`state`, `set_state`: the window stores it in its QSettings). Panels
never toggled show while there is room; in a narrow window the chat keeps its width and the
panels give way (`app.ui.side_panels.fit_panels`).
"""

from __future__ import annotations

import json

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtGui import QResizeEvent, QShowEvent
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.services.chat_settings import ChatSettings, EngineBinding
from app.ui.chat_settings import ChatSettingsPanel
from app.ui.conversation_list import ConversationList
from app.ui.engine_picker import EnginePicker
from app.ui.nav_rail import ICON, rail_icon
from app.ui.side_panels import content_width, fit_panels, scrolled

# The panels' widths when their content asks for less.
WIDTHS = {"sidebar": 250, "drawer": 330, "perf": 290}
# Who shows first while there is room, unless the user opened another since.
DEFAULT_ORDER = ("sidebar", "perf", "drawer")
LABELS = {"sidebar": "Chats", "drawer": "Settings", "perf": "Performance"}
TIPS = {
    "sidebar": "Show or hide the conversations",
    "drawer": "Show or hide this chat's settings (system prompt, sampling, documents)",
    "perf": "Show or hide the performance panel",
}


class PanelToggle(QToolButton):
    """A toolbar button that shows or hides a panel: an icon (text would not leave the
    engine row room at 1000 px), its name in the tooltip and for screen readers."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.setText(LABELS[key])
        self.setAccessibleName(f"{LABELS[key]} panel")
        self.setToolTip(TIPS[key])
        self.setCheckable(True)
        self.setAutoRaise(True)
        self.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        self.setIconSize(QSize(ICON, ICON))
        self._paint()

    def _paint(self) -> None:
        colour = self.palette().color(self.foregroundRole())
        self.setIcon(rail_icon(self.key, colour, self.devicePixelRatioF()))

    def changeEvent(self, e: QEvent) -> None:
        if e.type() == QEvent.Type.PaletteChange:
            self._paint()
        super().changeEvent(e)


class ChatPage(QWidget):
    panels_changed = Signal()  # a panel was shown or hidden by the user

    def __init__(
        self,
        chat: QWidget,
        top: QWidget,
        perf: QWidget,
        *,
        sidebar: QWidget | None = None,
        drawer: QWidget | None = None,
        engine_row: QWidget | None = None,
        parent: QWidget | None = None,
    ) -> None:
        """`chat`: the chat view; `top`: the model bar; `engine_row`: the engine picker
        under it; `sidebar`: the conversations; `drawer`: the chat settings."""
        super().__init__(parent)
        self.setObjectName("chatPage")
        self.chat = chat
        self.areas: dict[str, QScrollArea] = {}
        self.toggles: dict[str, PanelToggle] = {}
        self.wishes: dict[str, bool | None] = {}
        self.order: list[str] = list(DEFAULT_ORDER)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(6)

        if sidebar is not None:
            if isinstance(sidebar, ConversationList) and isinstance(drawer, ChatSettingsPanel):
                # The project dialog offers the collections the drawer offers, read when it
                # opens (the documents index is set on the drawer after the window is built).
                sidebar.set_collections(drawer.collection_names)
            if isinstance(sidebar, ConversationList) and isinstance(engine_row, EnginePicker):
                # A new chat in a project keeps the engine in use, as New chat does.
                sidebar.base_settings = lambda: ChatSettings(
                    engine=EngineBinding.from_stored(engine_row.binding())
                )
            self._panel("sidebar", sidebar)
            lay.addWidget(self.areas["sidebar"])

        centre = QWidget()
        centre.setObjectName("chatColumn")
        col = QVBoxLayout(centre)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(4)
        col.addWidget(top)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        if engine_row is not None:
            # Its combo's own least width leaves no room for the panel toggles beside it.
            for combo in engine_row.findChildren(QComboBox):
                combo.setMinimumContentsLength(min(combo.minimumContentsLength(), 16))
            row.addWidget(engine_row, 1)
        else:
            row.addStretch(1)
        col.addLayout(row)
        col.addWidget(chat, 1)
        self.centre = centre
        lay.addWidget(centre, 1)

        if drawer is not None:
            box = QWidget()
            box_lay = QVBoxLayout(box)
            box_lay.setContentsMargins(0, 0, 0, 0)
            title = QLabel("<b>Chat settings</b>")
            box_lay.addWidget(title)
            box_lay.addWidget(drawer, 1)
            self._panel("drawer", box)
            self.areas["drawer"].setAccessibleName("Chat settings drawer")
            lay.addWidget(self.areas["drawer"])
        self._panel("perf", perf)
        lay.addWidget(self.areas["perf"])
        for key in ("sidebar", "drawer", "perf"):
            if key in self.toggles:
                row.addWidget(self.toggles[key])

    def _panel(self, key: str, widget: QWidget) -> None:
        area = scrolled(widget)
        area.setFrameShape(QFrame.Shape.NoFrame)
        self.areas[key] = area
        self.wishes[key] = None
        b = PanelToggle(key)
        b.clicked.connect(lambda checked, k=key: self.set_wish(k, checked))
        self.toggles[key] = b

    # -- the user's choices ------------------------------------------------------------------

    def set_wish(self, key: str, shown: bool) -> None:
        """Show or hide a panel as the user asked; an opened one goes first."""
        if key not in self.areas:
            return
        self.wishes[key] = shown
        if shown:
            self.order = [key, *(k for k in self.order if k != key)]
        self.refit()
        self.panels_changed.emit()

    def shown(self, key: str) -> bool:
        area = self.areas.get(key)
        return area is not None and not area.isHidden()

    def state(self) -> str:
        return json.dumps({"wishes": self.wishes, "order": self.order})

    def set_state(self, text: str) -> None:
        try:
            data = json.loads(text)
            wishes, order = data["wishes"], data["order"]
        except (ValueError, TypeError, KeyError):
            return  # nothing saved yet (or something else): the defaults
        if isinstance(wishes, dict):
            for key in self.wishes:
                if wishes.get(key) in (True, False, None):
                    self.wishes[key] = wishes.get(key)
        if isinstance(order, list) and sorted(order) == sorted(DEFAULT_ORDER):
            self.order = [str(k) for k in order]
        self.refit()

    # -- layout ------------------------------------------------------------------------------

    def width_of(self, key: str) -> int:
        return max(WIDTHS[key], content_width(self.areas[key]))

    def refit(self) -> None:
        lay = self.layout()
        if lay is None or self.width() <= 0:
            return
        widths = {k: self.width_of(k) for k in self.areas}
        spacing = lay.spacing() if lay.spacing() >= 0 else 6
        room = self.width() - spacing * len(self.areas)
        least = self.centre.minimumSizeHint().width()
        show = fit_panels(room, widths, self.wishes, self.order, least)
        for key, area in self.areas.items():
            area.setFixedWidth(widths[key])
            area.setVisible(key in show)
            toggle = self.toggles[key]
            toggle.setChecked(key in show)

    def minimumSizeHint(self) -> QSize:
        # The panels fold on a resize (`refit`): only the chat column limits the window.
        return QSize(self.centre.minimumSizeHint().width(), super().minimumSizeHint().height())

    def resizeEvent(self, e: QResizeEvent) -> None:
        super().resizeEvent(e)
        self.refit()

    def showEvent(self, e: QShowEvent) -> None:
        super().showEvent(e)
        self.refit()

    def focus_chat(self) -> None:
        self.chat.setFocus(Qt.FocusReason.OtherFocusReason)
