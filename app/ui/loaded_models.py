"""The Loaded models window: every model in the app's model host, the chat's and those API
requests loaded on demand, with their state, who uses them, their memory and when they
unload; pin one to keep it, eject one to free it.

The table is read from `ModelHost.hosted()` twice a second while the window is visible (the
countdowns move), and at once when the host says a model was loaded or unloaded. The host
says so on its own threads (a load thread, the keep-alive thread, the engine thread): that
callback only emits a queued signal, so widgets are touched on the GUI thread alone.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QItemSelection,
    QModelIndex,
    QPersistentModelIndex,
    Qt,
    QTimer,
    Signal,
    Slot,
)
from PySide6.QtGui import QHideEvent, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.services.model_catalog import CHAT_OWNER
from app.ui.library_model import human_bytes
from engine.errors import EngineError
from engine.host.host import ModelHost
from engine.host.host_entry import HostedModel
from engine.host.runtime import Model

REFRESH_MS = 500
OWNER_WORDS = {CHAT_OWNER: "chat", "server": "server"}
ON_DEMAND = "API (on demand)"
CHAT_EJECT_TIP = "The chat's model: eject it from the library"
Ctx = QModelIndex | QPersistentModelIndex
TitleFn = Callable[[HostedModel], str | None]


def used_by(h: HostedModel) -> str:
    who = ON_DEMAND if h.owner is None else OWNER_WORDS.get(h.owner, h.owner)
    if h.leased_by:  # the Local server's slots on the chat's model, a benchmark's run
        who += f" · {h.leased_by}"
    if h.in_flight > 0:
        who += f", {h.in_flight} request{'s' if h.in_flight != 1 else ''}"
    return who


def memory_text(memory: Mapping[str, int]) -> str:
    """ "RAM 212 MiB · VRAM 1.2 GiB": a single GPU is VRAM; several are named."""
    gpus = [d for d, n in memory.items() if d != "CPU" and n > 0]
    parts = []
    if memory.get("CPU", 0) > 0:
        parts.append(f"RAM {human_bytes(memory['CPU'])}")
    for d in sorted(gpus):
        parts.append(f"{'VRAM' if len(gpus) == 1 else d} {human_bytes(memory[d])}")
    return " · ".join(parts) or "—"


def clock(seconds: float) -> str:
    """4:32, or 1:04:32 past an hour (rounded up: 0:00 is the moment it goes)."""
    s = max(0, math.ceil(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def unloads_in(h: HostedModel) -> str:
    if h.state != "ready":
        return "—"
    if h.pinned:
        return "pinned"
    if h.owner is not None or h.keep_s is None:
        return "kept"
    if h.in_flight > 0:  # counting starts when its last request ends
        return "when idle" if h.keep_s == 0 else f"{clock(h.keep_s)} after idle"
    return clock(h.expires_in_s) if h.expires_in_s is not None else "kept"


def ejectable(h: HostedModel) -> bool:
    """Whether the host may be asked to unload it (the chat's model is the chat's)."""
    return h.owner is None and h.state == "ready"


class LoadedModelsModel(QAbstractTableModel):
    """One row per hosted model, by name; rows are updated in place, so the selection stays
    across refreshes. `pin_requested(name, pinned)`: the Pinned box was clicked."""

    COLUMNS = ("Model", "State", "Used by", "Memory", "Unloads in", "Pinned")
    PINNED = 5
    pin_requested = Signal(str, bool)

    def __init__(self, title: TitleFn | None = None, parent: Any = None) -> None:
        super().__init__(parent)
        self._title = title
        self._rows: list[HostedModel] = []

    def set_models(self, models: Sequence[HostedModel]) -> None:
        names = {h.name for h in models}
        for row in reversed(range(len(self._rows))):
            if self._rows[row].name not in names:
                self.beginRemoveRows(QModelIndex(), row, row)
                del self._rows[row]
                self.endRemoveRows()
        by_name = {h.name: h for h in models}
        self._rows = [by_name[h.name] for h in self._rows]
        if self._rows:
            self.dataChanged.emit(
                self.index(0, 0), self.index(len(self._rows) - 1, len(self.COLUMNS) - 1)
            )
        kept = {h.name for h in self._rows}
        new = [h for h in models if h.name not in kept]
        if new:
            first = len(self._rows)
            self.beginInsertRows(QModelIndex(), first, first + len(new) - 1)
            self._rows.extend(new)
            self.endInsertRows()

    def hosted(self, row: int) -> HostedModel:
        return self._rows[row]

    def row_of(self, name: str) -> int:
        return next((i for i, h in enumerate(self._rows) if h.name == name), -1)

    def title(self, h: HostedModel) -> str:
        return (self._title(h) if self._title is not None else None) or h.name

    def text(self, row: int, col: int) -> str:
        h = self._rows[row]
        cells = (self.title(h), h.state, used_by(h), memory_text(h.memory), unloads_in(h), "")
        return cells[col]

    def rowCount(self, parent: Ctx = QModelIndex()) -> int:  # noqa: B008 (Qt's signature)
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: Ctx = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if (
            role == Qt.ItemDataRole.DisplayRole
            and orientation == Qt.Orientation.Horizontal
            and 0 <= section < len(self.COLUMNS)
        ):
            return self.COLUMNS[section]
        return None

    def flags(self, index: Ctx) -> Qt.ItemFlag:
        f = super().flags(index)
        if index.isValid() and index.column() == self.PINNED and ejectable(self._rows[index.row()]):
            f |= Qt.ItemFlag.ItemIsUserCheckable
        return f

    def data(self, index: Ctx, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        h, col = self._rows[index.row()], index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self.text(index.row(), col)
        if role == Qt.ItemDataRole.CheckStateRole and col == self.PINNED and ejectable(h):
            return Qt.CheckState.Checked if h.pinned else Qt.CheckState.Unchecked
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tip(h, col)
        if role == Qt.ItemDataRole.TextAlignmentRole and col == 4:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def setData(self, index: Ctx, value: Any, role: int = Qt.ItemDataRole.EditRole) -> bool:
        if (
            role != Qt.ItemDataRole.CheckStateRole
            or not index.isValid()
            or index.column() != self.PINNED
            or not ejectable(self._rows[index.row()])
        ):
            return False
        checked = Qt.CheckState(value) == Qt.CheckState.Checked
        self.pin_requested.emit(self._rows[index.row()].name, checked)
        return True

    @staticmethod
    def _tip(h: HostedModel, col: int) -> str | None:
        if col == 0:
            file = f"\n{h.path.name}" if h.path is not None else ""
            return f"API model id: {h.name}{file}"
        if col == 3 and h.state != "ready":
            return "Estimated: the load is still in progress"
        if col in (4, LoadedModelsModel.PINNED) and h.owner is not None:
            return (
                f"The {OWNER_WORDS.get(h.owner, h.owner)}'s model stays loaded until it "
                "is unloaded there"
            )
        if col == 4 and h.state == "ready" and h.keep_s is not None and not h.pinned:
            return f"Unloaded {clock(h.keep_s)} after its last request"
        return None


class LoadedModelsView(QWidget):
    """`host`: the app's model host; `title`: a model's name for people (the library's);
    `eject_chat`: unloads the chat's model the way the library's Eject does (None: Eject is
    off for it)."""

    _host_changed = Signal()

    def __init__(
        self,
        host: ModelHost,
        *,
        title: TitleFn | None = None,
        eject_chat: Callable[[], object] | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Loaded models")
        self.host = host
        self._eject_chat = eject_chat
        self._ejecting: dict[str, str] = {}  # name -> title, until the host lets it go
        self.model = LoadedModelsModel(title, parent=self)
        self.model.pin_requested.connect(self._pin)

        self.table = QTableView()
        self.table.setAccessibleName("Loaded models")
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.selectionModel().selectionChanged.connect(self._on_selection)

        self.summary = QLabel()
        self.summary.setAccessibleName("Memory of the loaded models")
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.pin_button = QPushButton("Pin")
        self.pin_button.setToolTip("Keep the model loaded until you unpin it")
        self.pin_button.clicked.connect(self._toggle_pin)
        self.eject_button = QPushButton("Eject")
        self.eject_button.clicked.connect(lambda: self.eject())

        buttons = QHBoxLayout()
        buttons.addWidget(self.summary, 1)
        buttons.addWidget(self.pin_button)
        buttons.addWidget(self.eject_button)
        lay = QVBoxLayout(self)
        lay.addWidget(self.table, 1)
        lay.addLayout(buttons)
        lay.addWidget(self.status)

        self._timer = QTimer(self)
        self._timer.setInterval(REFRESH_MS)
        self._timer.timeout.connect(self.refresh)
        self._host_changed.connect(self.refresh, Qt.ConnectionType.QueuedConnection)
        self._unsubscribe: Callable[[], None] | None = host.on_change(self._on_host_change)
        self.resize(760, 260)
        self.refresh()

    # -- reading the host ------------------------------------------------------------------

    def _on_host_change(self, _name: str, _model: Model | None) -> None:
        """On the host's threads: only a queued signal (an error here would fail the load
        that called it, so a window already gone is ignored)."""
        with contextlib.suppress(RuntimeError):
            self._host_changed.emit()

    @Slot()
    def refresh(self) -> None:
        models = self.host.hosted()
        self.model.set_models(models)
        names = {h.name for h in models}
        for name, title in list(self._ejecting.items()):
            if name not in names:
                del self._ejecting[name]
                self.status.setText(f"Unloaded {title}")
        total: dict[str, int] = {}
        for h in models:
            for dev, n in h.memory.items():
                total[dev] = total.get(dev, 0) + n
        count = f"{len(models)} model{'s' if len(models) != 1 else ''}"
        self.summary.setText(f"{count} · {memory_text(total)}" if models else "No model loaded")
        self._sync_buttons()

    def selected(self) -> HostedModel | None:
        rows = self.table.selectionModel().selectedRows()
        return self.model.hosted(rows[0].row()) if rows else None

    def _on_selection(self, _sel: QItemSelection, _desel: QItemSelection) -> None:
        self._sync_buttons()

    def _sync_buttons(self) -> None:
        h = self.selected()
        self.pin_button.setText("Unpin" if h is not None and h.pinned else "Pin")
        self.pin_button.setEnabled(h is not None and ejectable(h))
        chat = h is not None and h.owner == CHAT_OWNER and h.state == "ready"
        self.eject_button.setEnabled(
            h is not None and (ejectable(h) or (chat and self._eject_chat is not None))
        )
        if h is not None and h.owner is not None and not self.eject_button.isEnabled():
            self.eject_button.setToolTip(
                CHAT_EJECT_TIP
                if h.owner == CHAT_OWNER
                else f"Held by the {OWNER_WORDS.get(h.owner, h.owner)}"
            )
        elif chat:
            self.eject_button.setToolTip("Unload the chat's model, as the library's Eject does")
        else:
            self.eject_button.setToolTip("Unload the model once its requests have ended")

    # -- actions ---------------------------------------------------------------------------

    def _select(self, name: str) -> bool:
        row = self.model.row_of(name)
        if row >= 0:
            self.table.selectRow(row)
        return row >= 0

    @Slot(str, bool)
    def _pin(self, name: str, pinned: bool) -> None:
        try:
            self.host.pin(name, pinned)
        except EngineError as e:  # it went meanwhile
            self.status.setText(str(e))
        self.refresh()

    def _toggle_pin(self) -> None:
        h = self.selected()
        if h is not None:
            self._pin(h.name, not h.pinned)

    def pin(self, name: str, pinned: bool = True) -> None:
        """Pin or unpin the model `name` (what its Pinned box does)."""
        self._pin(name, pinned)

    def eject(self, name: str | None = None) -> bool:
        """Unload the model `name` (default: the selected one). One the API loaded goes as
        soon as no request holds it: its keep-alive becomes 0, so the host's own keep-alive
        thread unloads it, never under a request. The chat's model goes the library's way.
        False if that model cannot be ejected here."""
        if name is not None and not self._select(name):
            return False
        h = self.selected()
        if h is None:
            return False
        if h.owner == CHAT_OWNER and h.state == "ready" and self._eject_chat is not None:
            self._eject_chat()
            self.status.setText("Unloading the chat's model…")
            return True
        if not ejectable(h):
            return False
        try:
            if h.pinned:
                self.host.pin(h.name, False)
            self.host.set_keep(h.name, 0)
        except EngineError as e:  # it went meanwhile, or a client took it
            self.status.setText(str(e))
            return False
        title = self.model.title(h)
        self._ejecting[h.name] = title
        self.status.setText(
            f"Unloading {title} when its requests end…" if h.in_flight else f"Unloading {title}…"
        )
        self.refresh()
        return True

    # -- lifecycle -------------------------------------------------------------------------

    def showEvent(self, e: QShowEvent) -> None:
        super().showEvent(e)
        self.refresh()
        self._timer.start()

    def hideEvent(self, e: QHideEvent) -> None:
        super().hideEvent(e)
        self._timer.stop()

    def shutdown(self) -> None:
        """Stop refreshing and listening to the host (the app is quitting). Idempotent."""
        self._timer.stop()
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()


__all__ = ["LoadedModelsModel", "LoadedModelsView", "clock", "memory_text", "unloads_in", "used_by"]
