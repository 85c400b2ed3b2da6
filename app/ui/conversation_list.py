"""The list of conversations: New chat, a search box (full-text, over every message), pinned
first then by last activity, and rename / pin / export / delete from a context menu.

Exporting one chat (as Markdown or JSON) asks where, then writes the file atomically; the
chat view's Export button comes here too (`export`), so there is one way it is done.

Deleting is immediate and undoable (the store deletes softly): an "Undo" bar stays until the
next delete or until the user dismisses it, so no confirmation dialog interrupts.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QPoint, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.services.chat_exchange import write_export
from app.services.chat_store import ChatStore, ChatStoreError
from app.ui.chat_dates import short_when

ID_ROLE = Qt.ItemDataRole.UserRole + 1
# fmt -> (the menu's word, the file dialog's filter)
EXPORT_FORMATS = {"md": ("Markdown", "Markdown (*.md)"), "json": ("JSON", "JSON (*.json)")}
_UNSAFE = re.compile(r'[\x00-\x1f<>:"/\\|?*]+')


def export_file_name(title: str, fmt: str) -> str:
    """A file name for a chat's export, from its title: characters no file system takes
    (and the ellipsis of a cut title) dropped, kept short."""
    stem = " ".join(_UNSAFE.sub(" ", title.replace("…", "")).split())[:60].strip(" .")
    return f"{stem or 'chat'}.{fmt}"


class _ElidingDelegate(QStyledItemDelegate):
    """Entries no wider than the list's view, so each line is drawn elided, not cut."""

    def __init__(self, view: QListWidget) -> None:
        super().__init__(view)
        self._view = view

    def sizeHint(
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> QSize:
        hint = super().sizeHint(option, index)
        room = self._view.viewport().width() - 2 * self._view.spacing()
        return QSize(min(hint.width(), max(room, 1)), hint.height())


class ConversationList(QWidget):
    conversation_selected = Signal(int)
    new_chat_requested = Signal()
    conversation_deleted = Signal(int)
    error = Signal(str)  # one line for the window's error banner (an export that failed)
    notice = Signal(str)  # status text ("Exported …")

    def __init__(
        self,
        store: ChatStore,
        parent: QWidget | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(parent)
        self.store = store
        self._clock = clock
        self._current: int | None = None
        self._deleted: int | None = None
        self.new_button = QPushButton("New chat")
        self.new_button.setAccessibleName("New chat")
        self.new_button.clicked.connect(self.new_chat_requested)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search all chats")
        self.search.setAccessibleName("Search chats")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.refresh)
        self.list = QListWidget()
        self.list.setAccessibleName("Conversations")
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.itemActivated.connect(self._activated)
        self.list.itemClicked.connect(self._activated)
        # A long title or preview is elided to the sidebar's width (the tooltip has it all):
        # a list that scrolls sideways hides the start of the next entry's line.
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setItemDelegate(_ElidingDelegate(self.list))
        self.list.setResizeMode(QListWidget.ResizeMode.Adjust)  # re-elided on a resize
        self.list.setSpacing(2)  # two-line entries told apart at a glance
        self.undo_bar = QWidget()
        self.undo_label = QLabel()
        self.undo_button = QToolButton()
        self.undo_button.setText("Undo")
        self.undo_button.setAccessibleName("Undo delete")
        self.undo_button.clicked.connect(self.undo_delete)
        bar = QHBoxLayout(self.undo_bar)
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(self.undo_label, 1)
        bar.addWidget(self.undo_button)
        self.undo_bar.hide()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.new_button)
        lay.addWidget(self.search)
        lay.addWidget(self.list, 1)
        lay.addWidget(self.undo_bar)
        self.refresh()

    # -- contents --------------------------------------------------------------------------

    def ids(self) -> list[int]:
        return [int(self.list.item(i).data(ID_ROLE)) for i in range(self.list.count())]

    def refresh(self) -> None:
        query = self.search.text().strip()
        self.list.clear()
        if query:
            seen: set[int] = set()
            for conv, _msg, snippet in self.store.search(query):
                if conv.id in seen:
                    continue
                seen.add(conv.id)
                self._add(conv.id, f"{conv.title}\n{snippet}", conv.pinned)
        else:
            # A second line tells apart chats with the same title: when, and how it ends.
            previews = self.store.previews()
            now = self._clock()
            for conv in self.store.conversations():
                line = short_when(conv.updated_at, now)
                if previews.get(conv.id):
                    line += f" · {previews[conv.id]}"
                self._add(conv.id, f"{conv.title}\n{line}", conv.pinned)
        self.set_current(self._current)

    def _add(self, cid: int, text: str, pinned: bool) -> None:
        item = QListWidgetItem(("\u2605 " if pinned else "") + text)
        item.setData(ID_ROLE, cid)
        item.setToolTip(text)
        self.list.addItem(item)

    def set_current(self, cid: int | None) -> None:
        """Highlight the conversation on screen (without emitting a selection)."""
        self._current = cid
        self.list.blockSignals(True)
        self.list.clearSelection()
        for i in range(self.list.count()):
            if self.list.item(i).data(ID_ROLE) == cid:
                self.list.setCurrentRow(i)
        self.list.blockSignals(False)

    def _activated(self, item: QListWidgetItem) -> None:
        cid = int(item.data(ID_ROLE))
        self._current = cid
        self.conversation_selected.emit(cid)

    # -- actions ---------------------------------------------------------------------------

    def _menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        menu = self.menu_for(int(item.data(ID_ROLE)))
        menu.exec(self.list.viewport().mapToGlobal(pos))
        menu.deleteLater()

    def menu_for(self, cid: int) -> QMenu:
        """The context menu of the chat `cid`."""
        pinned = self.store.conversation(cid).pinned
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self._ask_rename(cid))
        menu.addAction("Unpin" if pinned else "Pin", lambda: self.set_pinned(cid, not pinned))
        for fmt, (word, _filter) in EXPORT_FORMATS.items():
            menu.addAction(f"Export as {word}…", self._exporter(cid, fmt))
        menu.addAction("Delete", lambda: self.delete(cid))
        return menu

    def _exporter(self, cid: int, fmt: str) -> Callable[[], object]:
        # A closure, not a lambda with defaults: PySide would pass `checked` into a default.
        return lambda: self.export(cid, fmt)

    def export(self, cid: int, fmt: str) -> Path | None:
        """Ask where, then export the chat `cid` as `fmt` ('md' or 'json'); the written path,
        or None (cancelled, or failed: `error` says why, in one line)."""
        try:
            title = self.store.conversation(cid).title
        except ChatStoreError as e:
            self.error.emit(str(e))
            return None
        name, _ = QFileDialog.getSaveFileName(
            self, "Export chat", export_file_name(title, fmt), EXPORT_FORMATS[fmt][1]
        )
        if not name:
            return None
        path = Path(name)
        try:
            write_export(self.store, path, fmt, [cid])
        except OSError as e:
            self.error.emit(f"Could not export to {path}: {e.strerror or e}")
            return None
        self.notice.emit(f"Exported “{title}” to {path}")
        return path

    def _ask_rename(self, cid: int) -> None:
        title, ok = QInputDialog.getText(
            self, "Rename chat", "Title:", text=self.store.conversation(cid).title
        )
        if ok:
            self.rename(cid, title)

    def rename(self, cid: int, title: str) -> None:
        self.store.rename(cid, title)
        self.refresh()

    def set_pinned(self, cid: int, pinned: bool) -> None:
        self.store.set_pinned(cid, pinned)
        self.refresh()

    def delete(self, cid: int) -> None:
        title = self.store.conversation(cid).title
        self.store.delete(cid)
        self._deleted = cid
        self.undo_label.setText(f"Deleted “{title}”")
        self.undo_bar.show()
        if self._current == cid:
            self._current = None
        self.refresh()
        self.conversation_deleted.emit(cid)

    def undo_delete(self) -> None:
        if self._deleted is not None:
            self.store.undo_delete(self._deleted)
            self._deleted = None
        self.undo_bar.hide()
        self.refresh()
