"""The command palette (Ctrl+K): a popup with a filter box over the window's commands (its
QActions). Typing narrows the list (words in order, then letters in order), Up/Down choose,
Enter runs the command, Esc or a click outside closes it. Each row shows the command's
shortcut, so the palette also teaches the keys."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from PySide6.QtCore import QEvent, QObject, QPoint, Qt, Signal
from PySide6.QtGui import QAction, QKeyEvent
from PySide6.QtWidgets import (
    QFrame,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
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
        self.list = QListWidget()
        self.list.setAccessibleName("Commands")
        self.list.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # the keys stay in the filter box
        self.list.setUniformItemSizes(True)
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
        return [self.list.item(i).data(ACTION_ROLE + 1) for i in range(self.list.count())]

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
        for _score, _i, name, a in scored:
            keys = a.shortcut().toString(a.shortcut().SequenceFormat.NativeText)
            item = QListWidgetItem(f"{name}\t{keys}" if keys else name)
            item.setData(ACTION_ROLE, a)
            item.setData(ACTION_ROLE + 1, name)
            item.setToolTip(a.toolTip() if a.toolTip() != a.text() else "")
            self.list.addItem(item)
        if self.list.count():
            self.list.setCurrentRow(0)

    def run_current(self) -> bool:
        item = self.list.currentItem()
        if item is None:
            return False
        self._run_item(item)
        return True

    def _run_item(self, item: QListWidgetItem) -> None:
        action = item.data(ACTION_ROLE)
        name = item.data(ACTION_ROLE + 1)
        self.close()  # first: the command may open a dialog or move the focus
        if isinstance(action, QAction):
            action.trigger()
            self.ran.emit(name)

    def _step(self, by: int) -> None:
        n = self.list.count()
        if n:
            self.list.setCurrentRow((self.list.currentRow() + by) % n)

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
