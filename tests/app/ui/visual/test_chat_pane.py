"""The chat pane as the screen shows it, on a real X server: after a long answer streamed
through the engine thread, after opening a long chat from the conversations sidebar and after
opening a search hit, the end of the conversation must be painted in the viewport (checked
from the X server's pixels and from the widgets' geometry against the viewport, not from the
model); a thinking block folded and opened, and a structured answer's highlighted JSON, are painted.

Run by test_xserver_tier.py on Xvfb; see conftest.py."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QPoint, QPointF, QRect, Qt
from PySide6.QtGui import QColor, QCursor, QEnterEvent, QGuiApplication, QImage, QPalette
from PySide6.QtWidgets import QApplication, QListWidget, QWidget
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.chat_store import ChatStore
from app.ui.chat_view import CodeBlock, MessageWidget, TableBlock
from app.ui.controller import RemoteChoice
from app.ui.main_window import MainWindow
from app.ui.worker import RemoteTarget
from tests.app.ui.visual.painted import (
    MIN_INK_SHARE,
    end_of_chat_problems,
    grab_screen,
    ink_mask,
    ink_share,
)
from tests.app.ui.visual.scripted_engine import ScriptedEngine, story

pytestmark = pytest.mark.xserver
PARAGRAPH = (
    "The river ran past the mill and the old stone bridge, under the willows and "
    "along the fields, until it reached the grey sea at the end of the valley. "
) * 3


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    assert QGuiApplication.platformName() == "xcb", "this tier draws on a real X server"
    w = build_window()
    w.setGeometry(0, 0, 1400, 900)
    w.chat_page.set_wish("perf", False)  # a wide chat column, as on a desktop screen
    w.show()
    qtbot.waitExposed(w)
    yield w
    w.close()
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def long_chat(store: ChatStore, title: str, turns: int = 6, word: str = "") -> int:
    """A stored chat of long Markdown answers; `word` goes into the second answer only."""
    c = store.create_conversation(title)
    for i in range(turns):
        store.add_message(c.id, "user", f"Question {i}: tell me about the river")
        extra = f" A {word} flew over it." if word and i == 1 else ""
        paras = [f"Part {j} of answer {i}. {PARAGRAPH}{extra}" for j in range(8)]
        store.add_message(c.id, "assistant", "\n\n".join([*paras, f"The end of answer {i}."]))
    return c.id


def settle(qtbot: QtBot) -> None:
    """Let posted layout requests, scroll updates and the repaint reach the X server."""
    qtbot.wait(150)
    QApplication.sync()


def click_item(qtbot: QtBot, lst: QListWidget, cid: int) -> None:
    from app.ui.conversation_list import ID_ROLE

    rows = [i for i in range(lst.count()) if lst.item(i).data(ID_ROLE) == cid]
    assert rows, f"chat {cid} is not in the list"
    rect = lst.visualItemRect(lst.item(rows[0]))
    qtbot.mouseClick(lst.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def use_scripted_engine(qtbot: QtBot, w: MainWindow, text: str) -> None:
    """Answer this chat from a `ScriptedEngine` in the engine thread, bound to the chat as a
    remote engine would be, so sending does not switch back to the library's model."""
    target = RemoteTarget("scripted", "story")
    w.controller.set_engine({"connection": target.connection, "model": target.model})
    assert w.controller.use(RemoteChoice(target, make=lambda: ScriptedEngine(text)))
    qtbot.waitUntil(
        lambda: w.controller.loaded is not None and w.controller.loaded.remote == target
    )


def test_long_streamed_answer_ends_in_view(
    window: MainWindow, qtbot: QtBot, tmp_path: Path
) -> None:
    view = window.chat_view
    vp = view.scroll_area.viewport()
    # Long enough to be over twice the viewport's height in the 780 px chat column.
    use_scripted_engine(qtbot, window, story(paragraphs=24))
    qtbot.keyClicks(view.input, "Write a 500-word story about a lighthouse keeper.")
    qtbot.keyClick(view.input, Qt.Key.Key_Return)

    def answer_overflows() -> bool:
        ws = view.message_widgets
        return len(ws) == 2 and ws[1].height() > vp.height()

    # While it streams: once the answer is taller than the viewport, its end follows.
    qtbot.waitUntil(lambda: answer_overflows() or not window.controller.busy, timeout=30_000)
    assert window.controller.busy, "the answer ended before it filled the viewport"
    assert not end_of_chat_problems(view, tmp_path / "streaming.png")
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=30_000)
    settle(qtbot)
    reply = view.message_widgets[-1]
    assert reply.footer.isVisible() and "tokens" in reply.footer.text()  # it has ended
    assert reply.height() > 2 * vp.height()
    assert not end_of_chat_problems(view, tmp_path / "finished.png")


def test_long_chat_opened_from_the_chats_tab_ends_in_view(
    window: MainWindow, qtbot: QtBot, tmp_path: Path
) -> None:
    assert window.store is not None and window.conversation_list is not None
    cid = long_chat(window.store, "Rivers")
    chats = window.conversation_list
    chats.refresh()
    window.reveal(chats)
    click_item(qtbot, chats.list, cid)
    qtbot.waitUntil(lambda: window.controller.conversation_id == cid)
    settle(qtbot)
    assert len(window.chat_view.message_widgets) == 12
    assert not end_of_chat_problems(window.chat_view, tmp_path / "opened.png")


def test_search_hit_opens_with_its_end_in_view(
    window: MainWindow, qtbot: QtBot, tmp_path: Path
) -> None:
    assert window.store is not None and window.conversation_list is not None
    first = long_chat(window.store, "Rivers")
    hit = long_chat(window.store, "More rivers", word="heron")
    chats = window.conversation_list
    chats.refresh()
    window.reveal(chats)
    # Read the first chat and scroll up in it, then look for a word of the other one.
    click_item(qtbot, chats.list, first)
    settle(qtbot)
    bar = window.chat_view.scroll_area.verticalScrollBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=QPoint(bar.width() // 2, 30))
    settle(qtbot)
    assert bar.value() < bar.maximum()
    qtbot.keyClicks(chats.search, "heron")
    assert chats.ids() == [hit]
    click_item(qtbot, chats.list, hit)
    qtbot.waitUntil(lambda: window.controller.conversation_id == hit)
    settle(qtbot)
    assert not end_of_chat_problems(window.chat_view, tmp_path / "search-hit.png")


THINKING = (
    "The user asks for the capital of France. France's capital is Paris; it has been the seat "
    "of government for centuries.\n\n"
    "I should answer in one sentence and put the city in bold, then offer a little context "
    "about its size without going on too long."
)
CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "country": {"type": "string"},
        "population": {"type": "integer"},
    },
    "required": ["city", "country", "population"],
    "additionalProperties": False,
}


def thinking_chat(store: ChatStore) -> int:
    """A stored chat: an answer with a thinking block, then a structured (JSON) answer."""
    c = store.create_conversation("Thinking and JSON")
    store.add_message(c.id, "user", "What is the capital of France?")
    store.add_message(
        c.id,
        "assistant",
        "The capital of France is **Paris**.",
        thinking=THINKING,
        model="DeepSeek-R1-Distill",
        stats={
            "ttft_s": 0.21,
            "gen_tps": 43.5,
            "gen_tokens": 152,
            "thinking_tokens": 140,
            "thinking_s": 3.2,
            "total_s": 3.7,
        },
    )
    store.add_message(c.id, "user", "The same as JSON, with its population.")
    store.add_message(
        c.id,
        "assistant",
        '{"city":"Paris","country":"France","population":2102650}',
        sampling={"temperature": 0.8, "json_schema": CITY_SCHEMA},
        stats={"ttft_s": 0.18, "gen_tps": 51.0, "gen_tokens": 21, "total_s": 0.6},
    )
    return c.id


def docs_shots(tmp_path: Path) -> Path:
    """Where the window's grab goes: docs/screenshots when CANDLEWICK_SCREENSHOTS names it."""
    return Path(os.environ.get("CANDLEWICK_SCREENSHOTS") or tmp_path)


def ink_in(view_img_of: QWidget, w: QWidget) -> float:
    """Share of ink the X server shows where `w` is, within `view_img_of`'s grab."""
    img = grab_screen(view_img_of)
    r = QRect(w.mapTo(view_img_of, QPoint(0, 0)), w.size()).intersected(view_img_of.rect())
    return ink_share(ink_mask(img), r)


def test_thinking_block_folds_and_a_structured_answer_is_highlighted(
    window: MainWindow, qtbot: QtBot, tmp_path: Path
) -> None:
    assert window.store is not None
    cid = thinking_chat(window.store)
    window.open_conversation(cid)
    settle(qtbot)
    view = window.chat_view
    vp = view.scroll_area.viewport()
    answer, structured = view.message_widgets[1], view.message_widgets[3]
    block = answer.thinking
    out = tmp_path

    # Folded: one painted line of figures above the answer; the thinking takes no room.
    assert block.isVisible() and not block.expanded and not block.body.isVisible()
    assert block.summary == "Thought for 3.2 s · 140 tokens"
    assert block.toggle.height() < 3 * block.toggle.fontMetrics().height()
    assert ink_in(vp, block.toggle) > MIN_INK_SHARE
    folded_height = answer.height()
    view.grab().save(str(out / "thinking-collapsed.png"))

    # Opened with a click: the thinking is painted under its line, above the answer.
    qtbot.mouseClick(block.toggle, Qt.MouseButton.LeftButton)
    settle(qtbot)
    assert block.expanded and block.body.isVisible()
    assert answer.height() > folded_height + 2 * block.toggle.fontMetrics().height()
    paragraphs = block.body.widgets
    assert len(paragraphs) == 2
    assert (
        paragraphs[0].mapTo(answer, QPoint(0, 0)).y() < answer.body.mapTo(answer, QPoint(0, 0)).y()
    )
    view.scroll_area.ensureWidgetVisible(block, 0, 0)
    settle(qtbot)
    for p in paragraphs:
        assert ink_in(vp, p) > MIN_INK_SHARE, "the thinking is not painted"
    # Set apart from the answer: its text is dimmer (the palette's placeholder colour).
    dim = paragraphs[0].palette().color(paragraphs[0].foregroundRole())
    normal = answer.body.widgets[0].palette().color(answer.body.widgets[0].foregroundRole())
    assert dim != normal
    view.grab().save(str(out / "thinking-expanded.png"))

    # The structured answer: pretty-printed in a JSON code block, highlighted (more colours
    # than text on a background).
    (code,) = structured.body.widgets
    assert isinstance(code, CodeBlock) and code.lang_label.text() == "json"
    assert code.code == json.dumps(
        {"city": "Paris", "country": "France", "population": 2102650}, indent=2
    )
    view.scroll_area.ensureWidgetVisible(code, 0, 0)
    settle(qtbot)
    img = grab_screen(code.editor.viewport())
    px = img.convertToFormat(QImage.Format.Format_RGB32)
    colours = {px.pixel(x, y) for x in range(0, px.width(), 2) for y in range(0, px.height(), 2)}
    assert ink_share(ink_mask(img), img.rect()) > MIN_INK_SHARE
    assert len(colours) > 8, "the JSON is not highlighted"
    structured.grab().save(str(out / "structured-answer.png"))
    # The whole window as a user sees it, the thinking open (for the docs).
    window.grab().save(str(docs_shots(tmp_path) / "thinking.png"))


TEA_TABLE = (
    "Here is a short comparison:\n\n"
    "| Drink | Caffeine (per cup) | Taste |\n|---|---:|---|\n"
    "| Tea | 40 mg | grassy |\n| Coffee | 95 mg | roasted |\n\nEnjoy!"
)


def test_bubbles_a_table_and_actions_on_hover_are_painted(
    window: MainWindow, qtbot: QtBot, tmp_path: Path
) -> None:
    assert window.store is not None
    c = window.store.create_conversation("Tea or coffee")
    window.store.add_message(c.id, "user", "Compare tea and coffee in a table.")
    window.store.add_message(c.id, "assistant", TEA_TABLE)
    QCursor.setPos(window.mapToGlobal(QPoint(2, 2)))  # over no message
    window.open_conversation(c.id)
    settle(qtbot)
    view = window.chat_view
    vp = view.scroll_area.viewport()
    question, answer = view.message_widgets
    img = grab_screen(vp).convertToFormat(QImage.Format.Format_RGB32)

    # The question: a bubble on the right, filled with the highlight mixed into the base.
    bubble = question.bubble
    assert bubble is not None
    r = QRect(bubble.mapTo(vp, QPoint(0, 0)), bubble.size())
    assert r.left() > vp.width() // 3 and r.right() > vp.width() - 40
    pal = bubble.palette()
    base, hi = pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Highlight)
    fill = QColor(img.pixel(r.right() - 5, r.center().y()))
    for got, a, b in (
        (fill.red(), base.red(), hi.red()),
        (fill.green(), base.green(), hi.green()),
        (fill.blue(), base.blue(), hi.blue()),
    ):
        assert abs(got - round(a + (b - a) * 0.16)) <= 2, (fill.name(), base.name(), hi.name())
    assert fill != QColor(img.pixel(4, r.center().y()))  # the conversation's base beside it

    # The answer's actions: not painted until the answer is hovered, painted then.
    assert ink_in(vp, answer.tools) == 0.0
    QApplication.sendEvent(answer, QEnterEvent(QPointF(5, 5), QPointF(5, 5), QPointF(5, 5)))
    settle(qtbot)
    assert ink_in(vp, answer.tools) > MIN_INK_SHARE

    # The table: a grid of cells, painted.
    (table,) = [w for w in answer.body.widgets if isinstance(w, TableBlock)]
    (grid,) = table.tables()
    assert (grid.rows(), grid.columns()) == (3, 3)
    assert ink_in(vp, table) > MIN_INK_SHARE
    assert not view.scroll_area.horizontalScrollBar().isVisible()
    window.grab().save(str(tmp_path / "chat-bubbles.png"))

    # The mouse still, the messages scrolled under it: the one under it shows its actions.
    window.open_conversation(long_chat(window.store, "River"))
    settle(qtbot)
    QCursor.setPos(vp.mapToGlobal(vp.rect().center()))
    settle(qtbot)

    def under_mouse() -> MessageWidget | None:
        at = vp.mapFromGlobal(QCursor.pos())
        widgets = view.message_widgets
        hits = [w for w in widgets if QRect(w.mapTo(vp, QPoint(0, 0)), w.size()).contains(at)]
        return hits[0] if hits else None

    first = under_mouse()
    assert first is not None and first.actions_shown
    bar = view.scroll_area.verticalScrollBar()
    bar.setValue(bar.value() - 3 * vp.height())
    settle(qtbot)
    now = under_mouse()
    assert now is not None and now is not first
    assert now.actions_shown and not first.actions_shown
    assert [w for w in view.message_widgets if w.actions_shown] == [now]
