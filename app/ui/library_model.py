"""The local model library as a Qt table model (one row per model file)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    Signal,
)

from app.services.library import DEFAULT_MODEL_ID, LibraryEntry
from app.services.projectors import ProjectorInfo

ENTRY_ROLE = Qt.ItemDataRole.UserRole + 1
# Short headers: the name needs the room. Its quantization is part of it ("· Q4_1"), and in
# the tooltip.
COLUMNS = ("Name", "Arch", "Params", "Size", "Context")
HEADER_TIPS = (
    "The model's name: yours (double-click or F2 to rename; empty: back to the "
    "derived one), else made from its file name and metadata",
    "Architecture",
    "Parameters",
    "File size",
    "Trained context",
)

Index = QModelIndex | QPersistentModelIndex

# How the library marks a sentence-embedding model (its file says how it pools): it turns text
# into vectors for the Documents tab and cannot chat, so it must not look like a chat model.
EMBEDDING_TAG = "embedding"
EMBEDDING_TIP = "An embedding model: it makes your documents searchable (the Documents tab)"
# A reranker pools too (by rank): it scores passages for a question, neither chats nor embeds.
RERANKER_TAG = "reranker"
RERANKER_TIP = (
    "A reranker: it re-sorts the passages a chat's documents search finds "
    "(Chat settings → Rerank with)"
)


def is_embedding(entry: LibraryEntry) -> bool:
    """A model that pools instead of generating (an embedding model or a reranker): it cannot
    chat nor draft. `embeds` says which of them can index a collection."""
    return entry.facts is not None and entry.facts.embedding_only


def is_reranker(entry: LibraryEntry) -> bool:
    return entry.facts is not None and entry.facts.is_reranker


def embeds(entry: LibraryEntry) -> bool:
    """A sentence-embedding model: one a collection can be indexed with."""
    return is_embedding(entry) and not is_reranker(entry)


def tagged_name(entry: LibraryEntry) -> str:
    """The name as the lists show it: an embedding model or a reranker says so, and a
    model paired with a projector says what else it reads ("vision", "audio")."""
    if entry.capabilities:
        return f"{entry.name} ({', '.join(entry.capabilities)})"
    if is_reranker(entry):
        return f"{entry.name} ({RERANKER_TAG})"
    return f"{entry.name} ({EMBEDDING_TAG})" if is_embedding(entry) else entry.name


def projector_tip(p: ProjectorInfo) -> str:
    """The tooltip's line about a model's projector."""
    if p.error is not None:
        return f"Its projector {p.path.name} cannot be used: {p.error}"
    return f"Reads {' and '.join(p.capabilities)} with its projector {p.path.name}"


def not_for_chat(entry: LibraryEntry) -> str:
    """Why an embedding model or a reranker is not loaded as the chat's model, in one line."""
    if is_reranker(entry):
        return (
            f"{entry.name} is a reranker: it cannot chat; it re-sorts the passages a chat's "
            "documents search finds (Chat settings → Rerank with)"
        )
    return (
        f"{entry.name} is an embedding model: it is for your documents (the Documents tab), "
        "not for chat"
    )


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class LibraryModel(QAbstractTableModel):
    """Rows of library entries. Editing a name does not write anything: it asks for the
    rename (`rename_requested(id, name)`), and the window applies it to the library."""

    rename_requested = Signal(str, str)  # entry id, new name ('' = back to the derived one)

    def __init__(self, entries: Sequence[LibraryEntry] = (), parent: QObject | None = None) -> None:
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

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if orientation != Qt.Orientation.Horizontal or not 0 <= section < len(COLUMNS):
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        if role == Qt.ItemDataRole.ToolTipRole:
            return HEADER_TIPS[section]
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._entries):
            return None
        e = self._entries[index.row()]
        col = index.column()
        if role == ENTRY_ROLE:
            return e
        if role == Qt.ItemDataRole.EditRole:
            return e.name if col == 0 else None
        if role == Qt.ItemDataRole.ToolTipRole:
            if e.error:
                return e.error
            if col != 0:
                return str(e.path)
            lines = [e.name]
            if e.custom_name:
                lines.append(f"Your name for {e.derived_name}")
            if e.facts is not None:
                lines.append(f"Quantization {e.facts.quantization}")
            if e.projector is not None:
                lines.append(projector_tip(e.projector))
            if is_reranker(e):
                lines.append(RERANKER_TIP)
            elif is_embedding(e):
                lines.append(EMBEDDING_TIP)
            if e.id == DEFAULT_MODEL_ID:
                lines.append("The bundled default model")
            return "\n".join([*lines, str(e.path)])
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (2, 3, 4):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role not in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.AccessibleTextRole):
            return None
        f = e.facts
        if col == 0:
            return tagged_name(e) if e.error is None else f"{e.path.name} — unreadable"
        if f is None:
            return "—"
        if col == 1:
            return f.architecture
        if col == 2:
            return f.params_label
        if col == 3:
            return human_bytes(f.file_bytes)
        if col == 4:
            return f"{f.context_length:,}" if f.context_length else "—"
        return None

    def setData(self, index: Index, value: Any, role: int = Qt.ItemDataRole.EditRole) -> bool:
        if (
            role != Qt.ItemDataRole.EditRole
            or not index.isValid()
            or index.column() != 0
            or not 0 <= index.row() < len(self._entries)
        ):
            return False
        e = self._entries[index.row()]
        name = " ".join(str(value or "").split())
        if name == e.name:
            return False
        self.rename_requested.emit(e.id, name)
        return True

    def flags(self, index: Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        flags = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        if (
            index.column() == 0
            and 0 <= index.row() < len(self._entries)
            and self._entries[index.row()].error is None
        ):
            flags |= Qt.ItemFlag.ItemIsEditable
        return flags
