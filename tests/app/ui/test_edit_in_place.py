"""Editing a message in place: Edit turns the message into a text box; Enter saves it as a
new version (a branch in the store) and answers it, Shift+Enter adds a line, Esc cancels and
changes nothing (the window's Esc, Stop, does not take the key)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.ui.chat_model import ChatModel
from app.ui.chat_view import ChatView
from app.ui.conversation import Conversation, Message
from app.ui.main_window import MainWindow
from app.ui.message_editor import MessageEditor
from engine.settings import SamplingParams

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = build_window(sampling=SamplingParams(temperature=0.0, max_tokens=8))
    w.show()
    qtbot.waitExposed(w)
    yield w
    w.close()
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def editor_of(view: ChatView, row: int) -> MessageEditor:
    editor = view.message_widgets[row].editor
    assert editor is not None
    return editor


@pytest.mark.model
def test_edit_in_place_saves_a_new_version_and_esc_changes_nothing(
    window: MainWindow, qtbot: QtBot
) -> None:
    store = window.store
    assert store is not None
    c = store.create_conversation()
    question = store.add_message(c.id, "user", "Name a fruit.")
    answer = store.add_message(c.id, "assistant", "Apple.")
    window.open_conversation(c.id)
    view = window.chat_view

    # Esc: the box closes, the message and the store are as they were.
    view.message_widgets[0].edit_button.click()
    box = editor_of(view, 0).box
    w0 = view.message_widgets[0]
    assert box.toPlainText() == "Name a fruit." and not w0.body.isVisibleTo(w0)
    assert not w0.edit_button.isVisibleTo(w0)  # the message's buttons wait for the edit
    qtbot.keyClicks(box, " And a vegetable.")
    qtbot.keyClick(box, Qt.Key.Key_Escape)
    w0 = view.message_widgets[0]
    assert w0.editor is None and w0.body.isVisibleTo(w0) and w0.edit_button.isVisibleTo(w0)
    assert [m.id for m in store.siblings(question.id)] == [question.id]
    assert [m.id for m in store.active_path(c.id)] == [question.id, answer.id]
    assert store.message(question.id).content == "Name a fruit."
    assert not window.controller.busy

    # Enter: a second version of the question, answered anew; Shift+Enter was a new line.
    view.message_widgets[0].edit_button.click()
    box = editor_of(view, 0).box
    box.selectAll()
    qtbot.keyClicks(box, "Name a vegetable.")
    qtbot.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(box, "Only one.")
    assert view.message_widgets[0].editor is not None
    qtbot.keyClick(box, Qt.Key.Key_Return)
    first, second = store.siblings(question.id)
    assert first.id == question.id and first.content == "Name a fruit."
    assert second.content == "Name a vegetable.\nOnly one."
    assert store.active_path(c.id)[0].id == second.id
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=120_000)
    shown = window.chat_model.conversation.messages
    assert shown[0].store_id == second.id and shown[0].branch == (2, 2)
    assert shown[1].state == "done" and shown[1].text
    new_answer = store.active_path(c.id)[1]
    assert new_answer.parent_id == second.id and new_answer.id != answer.id
    assert [m.id for m in store.children(question.id)] == [answer.id]  # the old one stays


@pytest.fixture
def view(qtbot: QtBot) -> ChatView:
    v = ChatView(ChatModel(Conversation([Message("user", "Hello"), Message("assistant", "Hi!")])))
    qtbot.addWidget(v)
    v.show()
    return v


def test_save_waits_for_the_reply_and_for_some_text(view: ChatView, qtbot: QtBot) -> None:
    saved: list[tuple[int, str]] = []
    view.edit_requested.connect(lambda row, text: saved.append((row, text)))
    assert not view.message_widgets[1].edit_button.isVisibleTo(view)  # answers: Regenerate
    editor = view.start_editing(0)
    view.set_busy(True)  # a reply streams: Save waits, the text stays
    assert not editor.save_button.isEnabled() and editor.save_button.toolTip()
    qtbot.keyClicks(editor.box, ", again")
    qtbot.keyClick(editor.box, Qt.Key.Key_Return)
    assert saved == [] and view.message_widgets[0].editor is editor
    view.set_busy(False)
    editor.box.clear()
    qtbot.keyClick(editor.box, Qt.Key.Key_Return)  # nothing to save
    assert saved == [] and view.message_widgets[0].editor is editor
    qtbot.keyClicks(editor.box, "  Hello there  ")
    qtbot.keyClick(editor.box, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert saved == [(0, "Hello there")] and view.message_widgets[0].editor is None


def test_one_edit_at_a_time_and_the_buttons(view: ChatView, qtbot: QtBot) -> None:
    view.model.append("user", "Second question")
    first = view.start_editing(0)
    view.start_editing(2)  # the first edit is dropped
    assert view.message_widgets[0].editor is None and first.isHidden()
    editor = editor_of(view, 2)
    saved: list[tuple[int, str]] = []
    view.edit_requested.connect(lambda row, text: saved.append((row, text)))
    qtbot.mouseClick(editor.cancel_button, Qt.MouseButton.LeftButton)
    assert view.message_widgets[2].editor is None and saved == []
    editor = view.start_editing(2)
    qtbot.keyClicks(editor.box, "!")
    qtbot.mouseClick(editor.save_button, Qt.MouseButton.LeftButton)
    assert saved == [(2, "Second question!")]
