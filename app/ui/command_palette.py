"""The command palette (Ctrl+K): a popup with a filter box over the window's commands (its
QActions). Typing narrows the list (words in order, then letters in order), Up/Down choose,
Enter runs the command, Esc or a click outside closes it. Each row shows the command's
shortcut, so the palette also teaches the keys."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from PySide6.QtCore import QEvent, QObject, QPoint, Qt, Signal
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence, QPalette
from PySide6.QtWidgets import (
    QFrame,
    QHeaderView,
    QLineEdit,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

ActionSource = Callable[[], Iterable[QAction]]
ACTION_ROLE = Qt.ItemDataRole.UserRole


def command_name(action: QAction) -> str:
    """The action's text as a person reads it: no mnemonic ampersands."""
    return action.text().replace("&&", "\0").replace("&", "").replace("\0", "&").strip()


def match_score(query: str, name: str) -> int | None:
    """How well `name` matches `query` (lower is better; None: not at all). Case-insensitive:
    the name containing the query is best, earlier better; else the query's letters in
    order anywhere in the name (a fuzzy match), the tighter the better."""
    q, n = query.strip().lower(), name.lower()
    if not q:
        return 0
    at = n.find(q)
    if at >= 0:
        return at
    pos, first = -1, -1
    for ch in q:
        if ch == " ":
            continue
        pos = n.find(ch, pos + 1)
        if pos < 0:
            return None
        if first < 0:
            first = pos
    return 1000 + (pos - first)


def palette_actions(window: QWidget) -> list[QAction]:
    """The window's commands: its own list when it keeps one (`actions_for_palette`), with
    every other action that has a name and is in the window; each name once."""
    found: list[QAction] = []
    own = getattr(window, "actions_for_palette", None)
    if callable(own):
        found.extend(own())
    found.extend(window.findChildren(QAction))
    seen: set[str] = set()
    out = []
    for a in found:
        name = command_name(a)
        if not name or a.isSeparator() or a.menu() is not None or name in seen:
            continue
        seen.add(name)
        out.append(a)
    return out


class CommandPalette(QFrame):
    ran = Signal(str)  # the command's name, after it ran

    def __init__(self, source: ActionSource, parent: QWidget | None = None) -> None:
        super().__init__(parent, Qt.WindowType.Popup)
        self.setObjectName("commandPalette")
        self.setAccessibleName("Command palette")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self._source = source
        self._actions: list[QAction] = []
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Type a command…")
        self.filter.setAccessibleName("Filter commands")
        self.filter.setClearButtonEnabled(True)
        # Two columns: the command, and its keys on the right.
        self.list = QTreeWidget()
        self.list.setAccessibleName("Commands")
        self.list.setColumnCount(2)
        self.list.setHeaderHidden(True)
        self.list.setRootIsDecorated(False)
        self.list.setUniformRowHeights(True)
        self.list.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # the keys stay in the filter box
        header = self.list.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.filter)
        lay.addWidget(self.list)
        self.filter.textChanged.connect(self.refilter)
        self.filter.installEventFilter(self)
        self.list.itemActivated.connect(self._run_item)
        self.list.itemClicked.connect(self._run_item)
        self.resize(460, 360)

    def open(self) -> None:
        """Show the palette over the top of its window, with every command listed."""
        self._actions = [a for a in self._source() if a.isEnabled() and a.isVisible()]
        self.filter.clear()
        self.refilter()
        anchor = self.parentWidget()
        if anchor is not None:
            top = anchor.window()
            width = min(520, max(320, top.width() - 40))
            self.resize(width, min(380, max(200, top.height() - 80)))
            where = top.mapToGlobal(QPoint((top.width() - width) // 2, 48))
            self.move(where)
        self.show()
        self.filter.setFocus(Qt.FocusReason.PopupFocusReason)

    def names(self) -> list[str]:
        """The commands listed now, in order (tests read this)."""
        return [str(item.data(0, ACTION_ROLE + 1)) for item in self._items()]

    def _items(self) -> list[QTreeWidgetItem]:
        found = (self.list.topLevelItem(i) for i in range(self.list.topLevelItemCount()))
        return [item for item in found if item is not None]

    def refilter(self) -> None:
        query = self.filter.text()
        scored = []
        for i, a in enumerate(self._actions):
            name = command_name(a)
            score = match_score(query, name)
            if score is not None:
                scored.append((score, i, name, a))
        scored.sort(key=lambda t: (t[0], t[1]))
        self.list.clear()
        dim = self.palette().color(QPalette.ColorRole.PlaceholderText)
        for _score, _i, name, a in scored:
            keys = a.shortcut().toString(QKeySequence.SequenceFormat.NativeText)
            item = QTreeWidgetItem([name, keys])
            item.setData(0, ACTION_ROLE, a)
            item.setData(0, ACTION_ROLE + 1, name)
            item.setForeground(1, dim)
            item.setTextAlignment(1, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            tip = a.toolTip()
            if tip and tip != name:
                item.setToolTip(0, tip)
            self.list.addTopLevelItem(item)
        items = self._items()
        if items:
            self.list.setCurrentItem(items[0])

    def run_current(self) -> bool:
        item = self.list.currentItem()
        if item is None:
            return False
        self._run_item(item)
        return True

    def _run_item(self, item: QTreeWidgetItem, _column: int = 0) -> None:
        action = item.data(0, ACTION_ROLE)
        name = item.data(0, ACTION_ROLE + 1)
        self.close()  # first: the command may open a dialog or move the focus
        if isinstance(action, QAction):
            action.trigger()
            self.ran.emit(name)

    def _step(self, by: int) -> None:
        items = self._items()
        if items:
            current = self.list.currentItem()
            row = items.index(current) if current in items else 0
            self.list.setCurrentItem(items[(row + by) % len(items)])

    def eventFilter(self, watched: QObject, e: QEvent) -> bool:
        if watched is self.filter and e.type() == QEvent.Type.KeyPress:
            assert isinstance(e, QKeyEvent)
            key = e.key()
            if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
                self.run_current()
                return True
            if key == Qt.Key.Key_Escape:
                self.close()
                return True
            if key in (Qt.Key.Key_Down, Qt.Key.Key_Up):
                self._step(1 if key == Qt.Key.Key_Down else -1)
                return True
            if key in (Qt.Key.Key_PageDown, Qt.Key.Key_PageUp):
                self._step(5 if key == Qt.Key.Key_PageDown else -5)
                return True
        return super().eventFilter(watched, e)


__all__ = ["CommandPalette", "command_name", "match_score", "palette_actions"]
