"""Quitting asks first while the Local server would be stopped, and the app reopens on the
conversation that was on screen (the window closed and built again on the same profile)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.ui.conversation_list import ID_ROLE
from app.ui.main_window import MainWindow
from app.ui.server_panel import ServerPanel

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def dispose(w: MainWindow) -> None:
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def test_quit_while_the_server_runs_asks_and_cancel_keeps_the_window(qtbot: QtBot) -> None:
    w = build_window()
    asked: list[list[str]] = []
    answer = [False]

    def ask(parent: QWidget, warnings: Sequence[str]) -> bool:
        assert parent is w
        asked.append(list(warnings))
        return answer[0]

    w.ask_quit = ask
    try:
        w.show()
        qtbot.waitExposed(w)
        w.close()  # nothing running: no question
        assert asked == [] and not w.isVisible()
        w.show()
        panel = w.findChild(ServerPanel)
        assert panel is not None
        panel.phase = "starting"  # what Start sets while the server's model loads
        w.quit_action.trigger()
        assert asked == [["The Local server is starting. Quitting stops it."]]
        assert w.isVisible()  # Cancel: still open, still serving
        answer[0] = True
        w.quit_action.trigger()
        assert len(asked) == 2 and not w.isVisible()
        panel.phase = "stopped"
    finally:
        dispose(w)


def test_the_app_reopens_on_the_last_conversation(qtbot: QtBot) -> None:
    w = build_window()
    store = w.store
    assert store is not None
    older = store.create_conversation("Older chat")
    store.add_message(older.id, "user", "First question")
    last = store.create_conversation("Last chat")
    store.add_message(last.id, "user", "What is a lighthouse?")
    store.add_message(last.id, "assistant", "A tower with a light.")
    w.open_conversation(last.id)
    w.open_conversation(older.id)
    w.open_conversation(last.id)
    w.new_chat()  # an empty new chat does not replace it
    w.close()
    dispose(w)

    again = build_window()
    try:
        assert again.controller.conversation_id == last.id
        assert [again.chat_model.message(r).text for r in range(2)] == [
            "What is a lighthouse?",
            "A tower with a light.",
        ]
        cl = again.conversation_list
        assert cl is not None and cl.list.currentItem().data(ID_ROLE) == last.id
    finally:
        again.close()
        dispose(again)
