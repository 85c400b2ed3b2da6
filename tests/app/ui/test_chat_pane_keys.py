"""The chat pane as chat-app users expect it: message actions shown on hover or keyboard
focus and reachable by keys, tables rendered as tables, a welcome with examples for an empty
chat, Stop in Send's place while answering, a live token count of the draft, the command
palette, and the streamed paragraph's text for screen readers."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from PySide6.QtCore import QEvent, QPointF, Qt
from PySide6.QtGui import QAction, QCursor, QEnterEvent, QGuiApplication, QKeySequence
from PySide6.QtWidgets import QApplication, QMainWindow, QWidget
from pytestqt.qtbot import QtBot

from app.ui.chat_model import ChatModel
from app.ui.chat_view import ChatView, MarkdownBody, MessageWidget, TableBlock, split_markdown
from app.ui.command_palette import CommandPalette, match_score, palette_actions
from app.ui.conversation import Conversation, Message
from app.ui.shortcuts import add_action, draft_counter
from app.ui.streaming_prose import StreamingProse
from app.ui.welcome import EXAMPLES

# Offscreen, a top-level window's layout and a popup (the palette, a menu) say these.
pytestmark = pytest.mark.qt_log_ignore(
    "This plugin does not support propagateSizeHints",
    "This plugin does not support grabbing the keyboard",
    "This plugin does not support raise",
)

TABLE = "| Drink | Caffeine |\n|---|---:|\n| Tea | 40 mg |\n| Coffee | 95 mg |"


def conversation(*pairs: tuple[str, str]) -> Conversation:
    c = Conversation()
    for role, text in pairs:
        c.messages.append(Message(role, text, state="done"))
    return c


@pytest.fixture
def view(qtbot: QtBot) -> Iterator[ChatView]:
    model = ChatModel()
    v = ChatView(model)
    qtbot.addWidget(v)
    v.resize(700, 600)
    QCursor.setPos(5000, 5000)  # not over a message: no hover unless a test makes one
    v.show()
    qtbot.waitExposed(v)
    v.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is v)
    yield v
    v.close()


def filled(view: ChatView) -> ChatView:
    view.model.set_conversation(
        conversation(("user", "Name a fruit."), ("assistant", "Apple."), ("user", "Another?"))
    )
    return view


def hover(w: QWidget, inside: bool) -> None:
    if inside:
        QApplication.sendEvent(w, QEnterEvent(QPointF(5, 5), QPointF(5, 5), QPointF(5, 5)))
    else:
        QApplication.sendEvent(w, QEvent(QEvent.Type.Leave))


def test_a_messages_actions_are_hidden_until_it_is_hovered_or_focused(
    view: ChatView, qtbot: QtBot
) -> None:
    filled(view)
    first, answer, _ = view.message_widgets
    assert not first.actions_shown and not answer.actions_shown
    # Hidden by a fade, not taken out: they keep their place and still work when clicked.
    assert first.edit_button.isVisibleTo(first) and answer.regenerate_button.isVisibleTo(answer)
    hover(answer, True)
    assert answer.actions_shown and not first.actions_shown
    hover(answer, False)
    assert not answer.actions_shown
    first.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(lambda: first.actions_shown)
    assert first.hasFocus()
    # Focus on one of its buttons counts as focus on the message.
    first.copy_message_button.setFocus(Qt.FocusReason.TabFocusReason)
    assert first.actions_shown
    view.input.setFocus()
    qtbot.waitUntil(lambda: not first.actions_shown)


def test_the_speakers_look_different(view: ChatView) -> None:
    filled(view)
    user, answer, _ = view.message_widgets
    assert user.bubble is not None and answer.bubble is None
    assert user.body.parentWidget() is user.bubble
    assert user.bubble.geometry().right() > user.width() - 20  # on the right
    assert user.bubble.width() <= 0.75 * user.width() + 1
    assert answer.avatar.isVisibleTo(answer) and answer.title.isVisibleTo(answer)
    assert answer.body.width() > 0.85 * answer.width()  # full width
    assert view.scroll_area.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff


def test_messages_are_reached_and_used_by_keys(view: ChatView, qtbot: QtBot) -> None:
    filled(view)
    user, answer, last = view.message_widgets
    # Up in the empty message box: the last message; Up/Down walk; Down at the end: the box.
    view.input.setFocus()
    qtbot.keyClick(view.input, Qt.Key.Key_Up)
    assert last.hasFocus()
    qtbot.keyClick(last, Qt.Key.Key_Up)
    assert answer.hasFocus() and answer.actions_shown
    qtbot.keyClick(answer, Qt.Key.Key_Up)
    assert user.hasFocus()
    qtbot.keyClick(user, Qt.Key.Key_Down)
    qtbot.keyClick(answer, Qt.Key.Key_Down)
    qtbot.keyClick(last, Qt.Key.Key_Down)
    assert view.input.hasFocus()

    actions: list[tuple[str, int]] = []
    view.message_action.connect(lambda name, row: actions.append((name, row)))
    answer.setFocus()
    qtbot.keyClick(answer, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert QGuiApplication.clipboard().text() == "Apple."
    qtbot.keyClick(answer, Qt.Key.Key_R)
    qtbot.keyClick(answer, Qt.Key.Key_E)  # an answer has no Edit: nothing
    qtbot.keyClick(answer, Qt.Key.Key_Delete)
    assert actions == [("regenerate", 1), ("delete", 1)]
    # E on a question edits it in place.
    user.setFocus()
    qtbot.keyClick(user, Qt.Key.Key_E)
    assert user.editor is not None and user.editor.box.hasFocus()
    user.stop_editing()


def test_enter_on_a_message_opens_its_actions_as_a_menu(view: ChatView, qtbot: QtBot) -> None:
    filled(view)
    answer = view.message_widgets[1]
    answer.setFocus()
    qtbot.keyClick(answer, Qt.Key.Key_Return)
    menu = answer.actions_menu
    assert menu is not None and menu.isVisible()
    names = [a.text() for a in menu.actions()]
    assert names == [
        "Answer again (a new version)",
        "Copy the message",
        "Read this answer aloud",
        names[-1],
    ]
    assert names[-1].startswith("Delete")
    assert answer.actions_shown  # while its menu is open
    QGuiApplication.clipboard().clear()
    menu.actions()[1].trigger()
    assert QGuiApplication.clipboard().text() == "Apple."
    menu.close()


def test_every_action_button_has_an_accessible_name(view: ChatView) -> None:
    filled(view)
    for w in view.message_widgets:
        assert w.accessibleName()
        assert all(b.accessibleName() for b in w.action_buttons)
    for b in (view.send_button, view.stop_button, view.attacher.button, view.input):
        assert b.accessibleName()
    assert view.message_widgets[1].accessibleDescription() == "Apple."


def test_a_markdown_table_is_rendered_as_a_table(qtbot: QtBot) -> None:
    text = f"Here they are:\n{TABLE}\nThat is all."
    segs = split_markdown(text)
    assert [s.kind for s in segs] == ["text", "table", "text"]
    assert segs[1].text == TABLE
    # A pipe in prose is not a table; a fence's pipes stay code.
    assert [s.kind for s in split_markdown("a | b\nno rule")] == ["text"]
    assert [s.kind for s in split_markdown(f"```\n{TABLE}\n```")] == ["code"]

    body = MarkdownBody()
    qtbot.addWidget(body)
    body.resize(600, 400)
    body.show()
    body.set_markdown(text)
    blocks = [w for w in body.widgets if isinstance(w, TableBlock)]
    assert len(blocks) == 1
    qtbot.waitUntil(lambda: blocks[0].height() >= 3 * blocks[0].fontMetrics().height())
    tables = blocks[0].tables()
    assert len(tables) == 1 and (tables[0].rows(), tables[0].columns()) == (3, 2)
    assert tables[0].cellAt(2, 0).firstCursorPosition().block().text() == "Coffee"
    # A table streaming in: the same widget takes the new rows.
    body.set_markdown(f"{TABLE}\n| Cocoa | 12 mg |", streaming=True)
    block = body.widgets[0]
    assert isinstance(block, TableBlock) and block.tables()[0].rows() == 4


def test_an_empty_chat_welcomes_and_an_example_fills_the_message_box(
    view: ChatView, qtbot: QtBot
) -> None:
    assert view.welcome.isVisible() and not view.scroll_area.isVisible()
    assert "No model" in view.welcome.model_line.text()
    view.set_model_name("SmolLM2 135M Instruct · Q4_1")
    assert "SmolLM2 135M Instruct · Q4_1" in view.welcome.model_line.text()
    buttons = view.welcome.example_buttons
    assert 3 <= len(buttons) <= 4 and all(b.accessibleName() for b in buttons)
    sent: list[str] = []
    view.send_requested.connect(sent.append)
    qtbot.mouseClick(buttons[2], Qt.MouseButton.LeftButton)
    assert view.input.toPlainText() == EXAMPLES[2][1]
    assert view.input.hasFocus() and sent == []  # filled, not sent
    filled(view)
    assert not view.welcome.isVisible() and view.scroll_area.isVisible()
    view.model.set_conversation(Conversation())
    assert view.welcome.isVisible()


def test_send_turns_into_stop_while_answering(view: ChatView, qtbot: QtBot) -> None:
    assert view.send_button.isVisible() and not view.stop_button.isVisible()
    view.send_button.setFocus()
    view.set_busy(True)
    assert view.stop_button.isVisible() and view.stop_button.isEnabled()
    assert view.stop_button.hasFocus()  # the keyboard stays where Send was
    assert not view.send_button.isVisible() and not view.send_button.isEnabled()
    # In the same place: the row keeps its height and the button its side.
    stopped: list[bool] = []
    view.stop_requested.connect(lambda: stopped.append(True))
    qtbot.mouseClick(view.stop_button, Qt.MouseButton.LeftButton)
    assert stopped == [True]
    view.stop_button.setFocus()
    view.set_busy(False)
    assert view.send_button.isVisible() and not view.stop_button.isVisible()
    assert view.send_button.hasFocus()
    view.set_busy(False, "The benchmark is running")
    assert view.send_button.isVisible() and not view.send_button.isEnabled()
    assert view.send_button.toolTip() == "The benchmark is running"


def test_the_draft_shows_its_token_count(view: ChatView, qtbot: QtBot) -> None:
    calls: list[str] = []

    def count(text: str) -> int:
        calls.append(text)
        return len(text.split())

    view.set_token_counter(count)
    qtbot.keyClicks(view.input, "three small words")
    assert calls == []  # counted after typing pauses, not per key
    qtbot.waitUntil(lambda: view.composer.token_label.text() == "~3 tokens")
    assert calls == ["three small words"]
    view.input.setPlainText("one")
    assert view.composer.count_now() == 1
    assert view.composer.token_label.text() == "~1 token"
    view.input.clear()
    assert view.composer.token_label.text() == ""


@pytest.mark.model
def test_the_token_count_is_the_loaded_models(smollm2: Any) -> None:
    host = SimpleNamespace(get=lambda key: smollm2 if key == "smol" else None)
    controller = SimpleNamespace(
        loaded=SimpleNamespace(remote=None, host_key="smol"),
        engine=SimpleNamespace(worker=SimpleNamespace(host=host)),
    )
    count = draft_counter(controller)
    text = "Explain how a lighthouse works, in three short paragraphs."
    assert count(text) == len(smollm2.tokenize(text, add_special=False, parse_special=False))
    controller.loaded = None  # nothing loaded: an estimate
    assert count(text) == -(-len(text) * 2 // 7)


def test_the_streamed_paragraph_tells_screen_readers_what_it_says(qtbot: QtBot) -> None:
    prose = StreamingProse()
    qtbot.addWidget(prose)
    prose.resize(400, 100)
    prose.show()
    qtbot.waitExposed(prose)
    assert prose.accessibleName()
    prose.setText("The keeper")
    prose.setText("The keeper climbed")
    assert prose.accessibleDescription() == ""  # coalesced: not per update
    qtbot.waitUntil(lambda: prose.accessibleDescription() == "The keeper climbed")
    prose.setText("The keeper climbed the **stairs**.")
    prose.tell_readers()
    assert prose.accessibleDescription() == "The keeper climbed the stairs."
    prose.setText("The keeper climbed the **stairs**. Again")
    prose.hide()  # a paragraph that is finished says what it had
    assert prose.accessibleDescription().endswith("Again")


def test_match_score_prefers_words_then_letters_in_order() -> None:
    assert match_score("", "New chat") == 0
    assert match_score("chat", "New chat") == 4
    assert match_score("nc", "New chat") is not None
    assert match_score("xyz", "New chat") is None
    fuzzy = match_score("nwct", "New chat")
    assert fuzzy is not None and fuzzy > 4


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[QMainWindow]:
    w = QMainWindow()
    w.setCentralWidget(QWidget())
    qtbot.addWidget(w)
    w.resize(800, 600)
    w.show()
    qtbot.waitExposed(w)
    yield w
    w.close()


def test_the_palette_filters_the_windows_actions_and_runs_one(
    window: QMainWindow, qtbot: QtBot
) -> None:
    ran: list[str] = []
    add_action(window, "New chat", ["Ctrl+N"], lambda: ran.append("new"))
    add_action(window, "Search chats", ["Ctrl+Shift+F"], lambda: ran.append("search"))
    add_action(window, "&Quit", ["Ctrl+Q"], lambda: ran.append("quit"))
    palette = CommandPalette(lambda: palette_actions(window), window)
    palette.open()
    assert palette.isVisible() and palette.filter.hasFocus()
    assert palette.names() == ["New chat", "Search chats", "Quit"]
    assert palette.accessibleName() and palette.filter.accessibleName()
    qtbot.keyClicks(palette.filter, "chat")
    assert palette.names() == ["New chat", "Search chats"]
    qtbot.keyClick(palette.filter, Qt.Key.Key_Down)
    qtbot.keyClick(palette.filter, Qt.Key.Key_Return)
    assert ran == ["search"] and not palette.isVisible()
    palette.open()
    qtbot.keyClicks(palette.filter, "qt")  # letters in order
    assert palette.names() == ["Quit"]
    qtbot.keyClick(palette.filter, Qt.Key.Key_Escape)
    assert not palette.isVisible() and ran == ["search"]


def test_a_key_another_action_has_is_left_to_it(window: QMainWindow) -> None:
    first = add_action(window, "Stop", ["Esc"], lambda: None)
    second = add_action(window, "Close palette", ["Esc", "Ctrl+W"], lambda: None)
    assert first.shortcuts() == [QKeySequence("Esc")]
    assert second.shortcuts() == [QKeySequence("Ctrl+W")]
    assert isinstance(first, QAction)


def test_the_message_widget_offers_only_what_it_shows(qtbot: QtBot) -> None:
    w = MessageWidget(Message("assistant", "Done.", state="stopped"))
    qtbot.addWidget(w)
    offered = [b.accessibleName() for b in w.offered_actions()]
    assert offered == [
        "Continue this answer",
        "Answer again (a new version)",
        "Copy the message",
        "Read this answer aloud",
        "Delete this message and what follows",
    ]


@pytest.fixture
def app_window(qtbot: QtBot) -> Iterator[Any]:
    from app.main import build_window

    w = build_window()
    w.resize(1200, 800)
    w.show()
    qtbot.waitExposed(w)
    w.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w)
    yield w
    w.close()
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def test_the_window_has_the_chat_keys_and_the_palette(app_window: Any, qtbot: QtBot) -> None:
    w = app_window
    view: ChatView = w.chat_view
    view.focus_input()
    # Ctrl+K from the message box (where a text box could take it for itself).
    qtbot.keyClick(view.input, Qt.Key.Key_K, Qt.KeyboardModifier.ControlModifier)
    palette: CommandPalette = w.command_palette
    assert palette.isVisible()
    names = palette.names()
    for name in ("New chat", "Search chats", "Regenerate last answer", "Switch model"):
        assert name in names
    (talk,) = [a for a in w.shortcut_actions if a.text() == "Push to talk"]
    assert "Push to talk" in names and talk.shortcut().toString() == "Ctrl+Shift+Space"
    assert not talk.autoRepeat()  # a held key starts one recording
    qtbot.keyClicks(palette.filter, "search ch")
    assert palette.names()[0] == "Search chats"
    qtbot.keyClick(palette.filter, Qt.Key.Key_Return)
    assert not palette.isVisible()
    search = w.conversation_list.search
    qtbot.waitUntil(search.hasFocus)
    # "/" goes to the message box from elsewhere; typed into a text box it is a character.
    qtbot.keyClick(search, Qt.Key.Key_Slash)
    assert search.text() == "/"
    search.clear()
    example = view.welcome.example_buttons[0]
    example.setFocus()
    qtbot.keyClick(example, Qt.Key.Key_Slash)
    assert view.input.hasFocus() and view.input.toPlainText() == ""
    view.set_busy(False)
    w.conversation_list.setFocus()
    qtbot.keyClick(w.conversation_list, Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier)
    assert view.input.hasFocus()
    # The welcome names the model that will answer: the bundled one on a fresh profile.
    assert "SmolLM2" in view.welcome.model_line.text()
