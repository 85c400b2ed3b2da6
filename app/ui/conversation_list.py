"""The list of conversations: New chat, a search box (full-text, over every message), pinned
first then by last activity, and rename / pin / move / export / delete from a context menu.

Projects (folders) come first, each a header that folds its chats (pinned first within);
the loose chats follow. A project's menu starts a new chat in it (with the project's system
prompt and collections), edits, renames or deletes it: deleting asks first and moves its chats
out, never deletes them. A search lists every match, a chat in a project with its name.

Exporting one chat (as Markdown or JSON) asks where, then writes the file atomically; the
chat view's Export button comes here too (`export`), so there is one way it is done.

Deleting is immediate and undoable (the store deletes softly): an "Undo" bar stays until the
next delete or until the user dismisses it, so no confirmation dialog interrupts.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QPoint, QSize, Qt, Signal
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.services.chat_exchange import write_export
from app.services.chat_settings import ChatSettings
from app.services.chat_store import ChatStore, ChatStoreError, Project, StoredConversation
from app.services.projects import new_chat_in_project
from app.ui.chat_dates import short_when
from app.ui.project_dialog import ProjectDialog

ID_ROLE = Qt.ItemDataRole.UserRole + 1  # a chat's id (None on a project's header)
PROJECT_ROLE = Qt.ItemDataRole.UserRole + 2  # a project header's id
INDENT_ROLE = Qt.ItemDataRole.UserRole + 3  # a chat shown inside its project
INDENT = 14
FOLDED, UNFOLDED = "\u25b8", "\u25be"  # the header's arrow
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
        if index.data(INDENT_ROLE):
            room -= INDENT
        return QSize(min(hint.width(), max(room, 1)), hint.height())

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        if index.data(INDENT_ROLE):  # a chat in a project: under its header, like a tree
            option = QStyleOptionViewItem(option)
            option.rect = option.rect.adjusted(INDENT, 0, 0, 0)
        super().paint(painter, option, index)


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
        collections: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        """`collections`: those of the documents index, for the project dialog."""
        super().__init__(parent)
        self.store = store
        self._clock = clock
        self._collections = collections or list
        # What a new chat in a project starts from before the project's own settings (the
        # window's: the engine in use, as New chat keeps it); None: the defaults.
        self.base_settings: Callable[[], ChatSettings | None] = lambda: None
        self._current: int | None = None
        self._deleted: int | None = None
        # Projects shown unfolded; the one holding the chat on screen unfolds when opened.
        self.expanded: set[int] = set()
        self._toggled: tuple[int, float] | None = None  # a header's last toggle by a click
        self.new_button = QPushButton("New chat")
        self.new_button.setAccessibleName("New chat")
        self.new_button.clicked.connect(self.new_chat_requested)
        self.new_project_button = QToolButton()
        self.new_project_button.setText("New project…")
        self.new_project_button.setAccessibleName("New project")
        self.new_project_button.setToolTip(
            "A folder of chats with its own system prompt and document collections"
        )
        self.new_project_button.clicked.connect(lambda: self.project_dialog(None))
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
        self.list.itemClicked.connect(self._clicked)
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
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.new_button, 1)
        top.addWidget(self.new_project_button)
        lay.addLayout(top)
        lay.addWidget(self.search)
        lay.addWidget(self.list, 1)
        lay.addWidget(self.undo_bar)
        self.refresh()

    def set_collections(self, names: Callable[[], Sequence[str]]) -> None:
        """Where the project dialog's collections come from (the documents index)."""
        self._collections = names

    # -- contents --------------------------------------------------------------------------

    def ids(self) -> list[int]:
        """The chats listed, top to bottom (a folded project's are not)."""
        out = []
        for i in range(self.list.count()):
            cid = self.list.item(i).data(ID_ROLE)
            if cid is not None:
                out.append(int(cid))
        return out

    def project_ids(self) -> list[int]:
        """The projects' headers, top to bottom."""
        out = []
        for i in range(self.list.count()):
            pid = self.list.item(i).data(PROJECT_ROLE)
            if pid is not None:
                out.append(int(pid))
        return out

    def refresh(self) -> None:
        query = self.search.text().strip()
        self.list.clear()
        projects = {p.id: p for p in self.store.projects()}
        if query:
            seen: set[int] = set()
            for conv, _msg, snippet in self.store.search(query):
                if conv.id in seen:
                    continue
                seen.add(conv.id)
                p = projects.get(conv.project_id) if conv.project_id is not None else None
                where = f"{p.name} · " if p is not None else ""
                self._add(conv.id, f"{conv.title}\n{where}{snippet}", conv.pinned)
        else:
            # A second line tells apart chats with the same title: when, and how it ends.
            previews = self.store.previews()
            now = self._clock()
            inside: dict[int, list[StoredConversation]] = {pid: [] for pid in projects}
            loose: list[StoredConversation] = []
            for conv in self.store.conversations():  # pinned first, in each group too
                if conv.project_id in inside:
                    inside[conv.project_id].append(conv)
                else:
                    loose.append(conv)
            for pid, p in projects.items():
                self._add_project(p, len(inside[pid]))
                if pid in self.expanded:
                    for conv in inside[pid]:
                        self._add_chat(conv, previews, now, indent=True)
            if projects and loose:
                # Below the folders, the loose chats under a label of their own: a folded
                # project's header would otherwise seem to hold them.
                label = QListWidgetItem("Chats")
                label.setFlags(Qt.ItemFlag.NoItemFlags)
                font = label.font()
                font.setBold(True)
                label.setFont(font)
                self.list.addItem(label)
            for conv in loose:
                self._add_chat(conv, previews, now)
        self.set_current(self._current)

    def _add_chat(
        self,
        conv: StoredConversation,
        previews: dict[int, str],
        now: float,
        *,
        indent: bool = False,
    ) -> None:
        line = short_when(conv.updated_at, now)
        if previews.get(conv.id):
            line += f" · {previews[conv.id]}"
        self._add(conv.id, f"{conv.title}\n{line}", conv.pinned, indent=indent)

    def _add(self, cid: int, text: str, pinned: bool, *, indent: bool = False) -> None:
        item = QListWidgetItem(("\u2605 " if pinned else "") + text)
        item.setData(ID_ROLE, cid)
        item.setData(INDENT_ROLE, indent)
        item.setToolTip(text)
        self.list.addItem(item)

    def _add_project(self, p: Project, chats: int) -> None:
        arrow = UNFOLDED if p.id in self.expanded else FOLDED
        item = QListWidgetItem(f"{arrow} {p.name}  ({chats})")
        item.setData(PROJECT_ROLE, p.id)
        font = item.font()
        font.setBold(True)
        item.setFont(font)
        tip = [f"Project: {p.name}, {chats} chat{'s' if chats != 1 else ''}"]
        if p.system_prompt:
            tip.append(f"System prompt: {p.system_prompt[:200]}")
        if p.collections:
            tip.append(f"Documents: {', '.join(p.collections)}")
        item.setToolTip("\n".join(tip))
        item.setData(
            Qt.ItemDataRole.AccessibleDescriptionRole,
            "project, " + ("unfolded" if p.id in self.expanded else "folded"),
        )
        self.list.addItem(item)

    def set_current(self, cid: int | None) -> None:
        """Highlight the conversation on screen (without emitting a selection); a chat in a
        folded project unfolds it the first time it is shown."""
        if cid is not None and cid != self._current:
            try:
                pid = self.store.conversation(cid).project_id
            except ChatStoreError:
                pid = None
            if pid is not None and pid not in self.expanded:
                self.expanded.add(pid)
                self._current = cid
                self.refresh()
                return
        self._current = cid
        self.list.blockSignals(True)
        self.list.clearSelection()
        for i in range(self.list.count()):
            if cid is not None and self.list.item(i).data(ID_ROLE) == cid:
                self.list.setCurrentRow(i)
        self.list.blockSignals(False)

    def _clicked(self, item: QListWidgetItem) -> None:
        pid = item.data(PROJECT_ROLE)
        if pid is not None:
            self._toggled = (int(pid), time.monotonic())
            self.toggle_project(int(pid))
            return
        self._activated(item)

    def _activated(self, item: QListWidgetItem) -> None:
        pid = item.data(PROJECT_ROLE)
        if pid is not None:
            # Enter folds or unfolds it; a double click's activation follows the click that
            # already did.
            t = self._toggled
            interval = QApplication.doubleClickInterval() / 1000
            if t is None or t[0] != pid or time.monotonic() - t[1] > interval:
                self.toggle_project(int(pid))
            return
        if item.data(ID_ROLE) is None:
            return  # the loose chats' label
        cid = int(item.data(ID_ROLE))
        self._current = cid
        self.conversation_selected.emit(cid)

    def toggle_project(self, pid: int) -> None:
        self.expanded ^= {pid}
        self.refresh()
        for i in range(self.list.count()):  # the header stays the current row for the keys
            if self.list.item(i).data(PROJECT_ROLE) == pid:
                self.list.blockSignals(True)
                self.list.setCurrentRow(i)
                self.list.blockSignals(False)

    # -- actions ---------------------------------------------------------------------------

    def _menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is None or (item.data(ID_ROLE) is None and item.data(PROJECT_ROLE) is None):
            menu = QMenu(self)
            menu.addAction("New project…", lambda: self.project_dialog(None))
        elif item.data(PROJECT_ROLE) is not None:
            menu = self.project_menu(int(item.data(PROJECT_ROLE)))
        else:
            menu = self.menu_for(int(item.data(ID_ROLE)))
        menu.exec(self.list.viewport().mapToGlobal(pos))
        menu.deleteLater()

    def menu_for(self, cid: int) -> QMenu:
        """The context menu of the chat `cid`."""
        conv = self.store.conversation(cid)
        pinned = conv.pinned
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self._ask_rename(cid))
        menu.addAction("Unpin" if pinned else "Pin", lambda: self.set_pinned(cid, not pinned))
        move = menu.addMenu("Move to project")
        for p in self.store.projects():
            act = move.addAction(p.name, self._mover(cid, p.id))
            act.setCheckable(True)
            act.setChecked(conv.project_id == p.id)
        if conv.project_id is not None:
            move.addSeparator()
            move.addAction("Out of the project", self._mover(cid, None))
        move.addSeparator()
        move.addAction("New project…", lambda: self.project_dialog(None, move=cid))
        for fmt, (word, _filter) in EXPORT_FORMATS.items():
            menu.addAction(f"Export as {word}…", self._exporter(cid, fmt))
        menu.addAction("Delete", lambda: self.delete(cid))
        return menu

    def project_menu(self, pid: int) -> QMenu:
        """The context menu of the project `pid`."""
        menu = QMenu(self)
        menu.addAction("New chat in project", lambda: self.new_chat_in(pid))
        menu.addAction("Edit project…", lambda: self.project_dialog(pid))
        menu.addAction("Rename…", lambda: self._ask_rename_project(pid))
        menu.addSeparator()
        menu.addAction("Delete project…", lambda: self.ask_delete_project(pid))
        return menu

    def _mover(self, cid: int, pid: int | None) -> Callable[[], object]:
        return lambda: self.move_to_project(cid, pid)

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

    # -- projects --------------------------------------------------------------------------

    def project_dialog(self, pid: int | None, *, move: int | None = None) -> ProjectDialog:
        """Open the dialog that creates (`pid` None) or edits a project; on OK it is saved,
        and the chat `move` (if any) goes into the new project."""
        p = self.store.project(pid) if pid is not None else None
        dialog = ProjectDialog(
            list(self._collections()),
            self,
            name=p.name if p else "",
            system_prompt=p.system_prompt if p else "",
            ticked=p.collections if p else (),
        )
        dialog.accepted.connect(lambda: self._saved(dialog, pid, move))
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    def _saved(self, dialog: ProjectDialog, pid: int | None, move: int | None) -> None:
        name, prompt, collections = dialog.values()
        try:
            if pid is None:
                pid = self.new_project(name, prompt, collections).id
                if move is not None:
                    self.move_to_project(move, pid)
            else:
                self.store.update_project(
                    pid, name=name, system_prompt=prompt, collections=collections
                )
                self.refresh()
        except ChatStoreError as e:
            self.error.emit(str(e))

    def new_project(
        self, name: str, system_prompt: str = "", collections: Sequence[str] = ()
    ) -> Project:
        p = self.store.create_project(name, system_prompt, collections)
        self.expanded.add(p.id)
        self.refresh()
        return p

    def _ask_rename_project(self, pid: int) -> None:
        name, ok = QInputDialog.getText(
            self, "Rename project", "Name:", text=self.store.project(pid).name
        )
        if ok:
            self.rename_project(pid, name)

    def rename_project(self, pid: int, name: str) -> None:
        try:
            self.store.update_project(pid, name=name)
        except ChatStoreError as e:
            self.error.emit(str(e))
        self.refresh()

    def ask_delete_project(self, pid: int) -> QMessageBox:
        """Ask before deleting a project, saying what becomes of its chats."""
        p = self.store.project(pid)
        n = sum(1 for c in self.store.conversations() if c.project_id == pid)
        chats = (
            "It has no chats."
            if n == 0
            else (
                f"Its {n} chat{'s' if n != 1 else ''} move{'s' if n == 1 else ''} out of it, "
                "to the chats below the projects: none is deleted."
            )
        )
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Delete project",
            f"Delete the project “{p.name}”?\n\n{chats}",
            QMessageBox.StandardButton.Cancel,
            self,
        )
        delete = box.addButton("Delete project", QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.buttonClicked.connect(
            lambda button: self.delete_project(pid) if button is delete else None
        )
        box.finished.connect(box.deleteLater)
        box.open()
        return box

    def delete_project(self, pid: int) -> int:
        """Delete the project; its chats become loose chats. How many moved out."""
        moved = self.store.delete_project(pid)
        self.expanded.discard(pid)
        self.refresh()
        return moved

    def move_to_project(self, cid: int, pid: int | None) -> None:
        try:
            self.store.move_to_project(cid, pid)
        except ChatStoreError as e:
            self.error.emit(str(e))
            return
        if pid is not None:
            self.expanded.add(pid)  # the chat is seen where it went
        self.refresh()

    def new_chat_in(self, pid: int) -> int | None:
        """Start a chat in the project, with its system prompt and collections, and open
        it; its id (None: the store refused, `error` says why)."""
        try:
            conv = new_chat_in_project(self.store, pid, self.base_settings())
        except ChatStoreError as e:
            self.error.emit(str(e))
            return None
        self.expanded.add(pid)
        self._current = conv.id
        self.refresh()
        self.conversation_selected.emit(conv.id)
        return conv.id
