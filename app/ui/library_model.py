"""The local model library as a Qt table model (one row per model file)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, QPersistentModelIndex, Qt

from app.services.library import LibraryEntry

ENTRY_ROLE = Qt.ItemDataRole.UserRole + 1
COLUMNS = ("Name", "Architecture", "Parameters", "Quantization", "Size", "Context")

Index = QModelIndex | QPersistentModelIndex


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class LibraryModel(QAbstractTableModel):
    def __init__(self, entries: Sequence[LibraryEntry] = (),
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._entries = list(entries)

    def set_entries(self, entries: Sequence[LibraryEntry]) -> None:
        self.beginResetModel()
        self._entries = list(entries)
        self.endResetModel()

    def entry(self, row: int) -> LibraryEntry:
        return self._entries[row]

    def row_of(self, entry_id: str) -> int:
        for i, e in enumerate(self._entries):
            if e.id == entry_id:
                return i
        return -1

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._entries)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if (orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole
                and 0 <= section < len(COLUMNS)):
            return COLUMNS[section]
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._entries):
            return None
        e = self._entries[index.row()]
        col = index.column()
        if role == ENTRY_ROLE:
            return e
        if role == Qt.ItemDataRole.ToolTipRole:
            return e.error or str(e.path)
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (2, 4, 5):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role not in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.AccessibleTextRole):
            return None
        f = e.facts
        if col == 0:
            name = e.name if e.id != "default" else f"{e.name} (default)"
            return name if e.error is None else f"{e.path.name} — unreadable"
        if f is None:
            return "—"
        if col == 1:
            return f.architecture
        if col == 2:
            return f.params_label
        if col == 3:
            return f.quantization
        if col == 4:
            return human_bytes(f.file_bytes)
        if col == 5:
            return f"{f.context_length:,}" if f.context_length else "—"
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
