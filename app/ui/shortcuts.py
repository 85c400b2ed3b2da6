"""The chat's keys, and the window facts the chat pane needs, installed on the main window
in one call (`install_shortcuts`).

Keys: Ctrl+K the command palette, Ctrl+N a new chat, Ctrl+Shift+F (and Ctrl+F) search the
chats, Ctrl+L or / the message box, Esc stop, Ctrl+R answer the last question again, Ctrl+M
choose another model, Ctrl+Shift+Space push-to-talk (held; a tap starts or ends a recording).
A key some action of the window already has is left to it: two actions on one key would make
Qt run neither.

Besides the keys: the composer's token count uses the loaded model's tokenizer (an
estimate without one), and the welcome of an empty chat names the model that will answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QComboBox, QLineEdit, QMainWindow, QWidget

from app.ui.chat_view import ChatView
from app.ui.command_palette import CommandPalette, palette_actions
from app.ui.composer import CountTokens
from engine.errors import EngineError
from engine.rag.grounding import approx_tokens


def _taken(window: QWidget) -> set[str]:
    keys: set[str] = set()
    for a in window.findChildren(QAction):
        for seq in a.shortcuts():
            if not seq.isEmpty():
                keys.add(seq.toString())
    return keys


def add_action(
    window: QWidget, text: str, keys: list[str], slot: Callable[[], object], tip: str = ""
) -> QAction:
    """A window-wide action on the keys no other action of the window has yet."""
    taken = _taken(window)
    a = QAction(text, window)
    a.setShortcuts([QKeySequence(k) for k in keys if QKeySequence(k).toString() not in taken])
    a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    if tip:
        a.setToolTip(tip)
    a.triggered.connect(slot)
    window.addAction(a)
    return a


def _has_key(window: QWidget, key: str) -> bool:
    return QKeySequence(key).toString() in _taken(window)


def draft_counter(controller: Any) -> CountTokens:
    """Counts a draft in the chat model's tokens: the model loaded on this computer when
    counting, else an estimate (a remote engine, or none loaded)."""

    def count(text: str) -> int:
        loaded = getattr(controller, "loaded", None)
        if loaded is None or getattr(loaded, "remote", None) is not None:
            return approx_tokens(text)
        try:
            host = controller.engine.worker.host
            model = host.get(loaded.host_key)
            return len(model.tokenize(text, add_special=False, parse_special=False))
        except (EngineError, AttributeError):  # unloaded meanwhile
            return approx_tokens(text)

    return count


def _focus_search(window: Any) -> None:
    chats = getattr(window, "conversation_list", None)
    search = getattr(chats, "search", None)
    if not isinstance(search, QLineEdit):
        return
    reveal = getattr(window, "reveal", None)
    if callable(reveal):
        reveal(search)
    else:
        tabs = getattr(window, "side_tabs", None)
        if tabs is not None and chats is not None:
            tabs.setCurrentWidget(chats)
    search.setFocus(Qt.FocusReason.ShortcutFocusReason)
    search.selectAll()


def _switch_model(window: Any) -> None:
    for holder in ("model_bar", "engine_picker"):
        combo = getattr(getattr(window, holder, None), "combo", None)
        if isinstance(combo, QComboBox) and combo.isVisible():
            combo.setFocus(Qt.FocusReason.ShortcutFocusReason)
            combo.showPopup()
            return
    library = getattr(window, "library_panel", None)
    if isinstance(library, QWidget):
        reveal = getattr(window, "reveal", None)
        if callable(reveal):
            reveal(library)
        library.setFocus(Qt.FocusReason.ShortcutFocusReason)


def _model_name(window: Any) -> str:
    loaded = getattr(window.controller, "loaded", None)
    if loaded is not None:
        return str(loaded.name)
    library = getattr(window, "library_panel", None)
    entry = library.selected_entry() if library is not None else None
    name = getattr(window, "model_name", None)
    path = getattr(entry, "path", None)
    if entry is not None and callable(name) and path is not None:
        return str(name(path) or getattr(entry, "name", ""))
    return str(getattr(entry, "name", "") or "")


def install_shortcuts(window: QMainWindow) -> CommandPalette:
    """The chat's keys and the command palette on `window` (a MainWindow: its `chat_view`
    and `controller`), plus the chat pane's token count and welcome."""
    w: Any = window
    view: ChatView = w.chat_view
    controller = w.controller
    palette = CommandPalette(lambda: palette_actions(window), window)
    w.command_palette = palette
    added = [
        add_action(window, "Command palette", ["Ctrl+K"], palette.open, "Find and run a command"),
        add_action(window, "Search chats", ["Ctrl+Shift+F", "Ctrl+F"], lambda: _focus_search(w)),
        add_action(window, "Regenerate last answer", ["Ctrl+R"], view.regenerate_last),
        add_action(window, "Switch model", ["Ctrl+M"], lambda: _switch_model(w)),
        # "/" reaches no action while a text box has the focus: text boxes take typed keys.
        add_action(window, "Focus message box", ["/"], view.focus_input),
        # Held: push-to-talk (its Space's release ends it); tapped: a toggle.
        add_action(window, "Push to talk", ["Ctrl+Shift+Space"], view.voice.shortcut),
    ]
    added[-1].setAutoRepeat(False)  # a held key starts one recording, not one per repeat
    if not _has_key(window, "Ctrl+N") and callable(getattr(w, "new_chat", None)):
        added.append(add_action(window, "New chat", ["Ctrl+N"], w.new_chat))
    if not _has_key(window, "Ctrl+L"):
        added.append(add_action(window, "Focus message box (Ctrl+L)", ["Ctrl+L"], view.focus_input))
    if not _has_key(window, "Esc"):
        added.append(add_action(window, "Stop", ["Esc"], controller.stop))
    w.shortcut_actions = added

    view.set_token_counter(draft_counter(controller))
    view.set_model_name(_model_name(w))
    controller.engine_changed.connect(lambda _info: view.set_model_name(_model_name(w)))
    library = getattr(w, "library_panel", None)
    if library is not None and hasattr(library, "selection_changed"):
        library.selection_changed.connect(lambda _entry: view.set_model_name(_model_name(w)))
    return palette


__all__ = ["add_action", "draft_counter", "install_shortcuts"]
