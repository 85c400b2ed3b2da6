"""Conversations in the window, on the real SmolLM2 and a real SQLite store: every exchange
saved with its stats, the conversation list (search, pin, rename, delete + undo, opening one),
branches (regenerate, edit, "< 1/2 >"), per-chat settings applied to generation, the context
policy when a conversation outgrows the context, and export/import from the menu."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.chat_store import ChatStore
from app.ui.main_window import MainWindow
from engine.host.runtime import Model
from engine.settings import LoadParams, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = build_window(sampling=GREEDY)
    w.show()
    qtbot.waitExposed(w)
    yield w
    w.close()
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def store_of(w: MainWindow) -> ChatStore:
    assert w.store is not None
    return w.store


def send(qtbot: QtBot, w: MainWindow, text: str) -> None:
    qtbot.keyClicks(w.chat_view.input, text)
    qtbot.keyClick(w.chat_view.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=120_000)


def record(signal: Any) -> list[Any]:
    got: list[Any] = []
    signal.connect(lambda *args: got.append(args[0] if len(args) == 1 else args))
    return got


@pytest.mark.model
def test_exchange_is_stored_with_stats_model_and_sampling(window: MainWindow, qtbot: QtBot) -> None:
    send(qtbot, window, "What is the capital of France?")
    store = store_of(window)
    (conv,) = store.conversations()
    assert conv.title == "What is the capital of France?"
    user, answer = store.active_path(conv.id)
    shown = window.chat_model.message(1)
    assert (user.role, user.content) == ("user", "What is the capital of France?")
    assert answer.status == "complete" and answer.content == shown.text != ""
    # As stored: JSON (a tuple comes back as a list).
    assert shown.stats is not None
    assert answer.stats == json.loads(json.dumps(shown.stats.to_dict()))
    assert window.controller.loaded is not None
    assert answer.model == window.controller.loaded.name
    assert answer.sampling["max_tokens"] == GREEDY.max_tokens
    assert answer.sampling["temperature"] == 0.0
    # The list shows it, and the context line counts this conversation's tokens.
    cl = window.conversation_list
    assert cl is not None and cl.ids() == [conv.id]
    used = shown.stats.prompt_tokens + shown.stats.gen_tokens
    assert window.chat_view.context_label.text().startswith(f"Context: {used:,} / ")


@pytest.mark.model
def test_signal_sequence_of_a_first_exchange(window: MainWindow, qtbot: QtBot) -> None:
    c = window.controller
    events: list[str] = []
    for name in (
        "busy_changed",
        "conversations_changed",
        "context_changed",
        "context_note",
        "error",
    ):
        getattr(c, name).connect(
            lambda *args, n=name: events.append(f"{n}{list(args)}" if n == "busy_changed" else n)
        )
    send(qtbot, window, "Hi")
    squeezed = [e for i, e in enumerate(events) if i == 0 or events[i - 1] != e]
    # User message saved; the model loads (the context line shows its size); the answer row
    # saved as streaming; the prompt's size, then the answer's as it grows; the finished
    # answer saved; its final context use; idle.
    assert squeezed == [
        "conversations_changed",
        "busy_changed[True]",
        "context_changed",
        "conversations_changed",
        "busy_changed[True]",
        "context_changed",
        "conversations_changed",
        "context_changed",
        "busy_changed[False]",
    ]


def test_conversation_list_search_pin_rename_delete_undo(window: MainWindow, qtbot: QtBot) -> None:
    store = store_of(window)
    cl = window.conversation_list
    assert cl is not None
    window.reveal(cl)
    ids = []
    for question, answer in (
        ("How do dragons cook?", "With fire, carefully."),
        ("Best bread recipe", "Flour, water, salt, yeast."),
        ("Why is the sky blue?", "Rayleigh scattering of sunlight."),
    ):
        c = store.create_conversation()
        store.add_message(c.id, "user", question)
        store.add_message(c.id, "assistant", answer)
        ids.append(c.id)
    cl.refresh()
    assert cl.ids() == ids[::-1]  # latest activity first

    qtbot.keyClicks(cl.search, "scatter")
    assert cl.ids() == [ids[2]]
    assert "[scattering]" in cl.list.item(0).text()
    cl.search.clear()
    qtbot.keyClicks(cl.search, "flour")
    assert cl.ids() == [ids[1]]
    cl.search.clear()

    cl.set_pinned(ids[0], True)
    assert cl.ids() == [ids[0], ids[2], ids[1]]
    cl.rename(ids[0], "  Dragon   cooking ")
    assert store.conversation(ids[0]).title == "Dragon cooking"
    assert cl.list.item(0).text().split("\n")[0] == "\u2605 Dragon cooking"

    # Selecting one shows its active path in the chat.
    with qtbot.waitSignal(cl.conversation_selected) as blocker:
        qtbot.mouseClick(
            cl.list.viewport(),
            Qt.MouseButton.LeftButton,
            pos=cl.list.visualItemRect(cl.list.item(1)).center(),
        )
    assert blocker.args == [ids[2]]
    assert window.controller.conversation_id == ids[2]
    assert [window.chat_model.message(r).text for r in range(2)] == [
        "Why is the sky blue?",
        "Rayleigh scattering of sunlight.",
    ]

    # Deleting the open one clears the chat; Undo brings it back.
    with qtbot.waitSignal(cl.conversation_deleted) as deleted:
        cl.delete(ids[2])
    assert deleted.args == [ids[2]]
    assert ids[2] not in cl.ids() and cl.undo_bar.isVisible()
    assert window.chat_model.rowCount() == 0 and window.controller.conversation_id is None
    qtbot.mouseClick(cl.undo_button, Qt.MouseButton.LeftButton)
    assert cl.ids() == [ids[0], ids[2], ids[1]] and not cl.undo_bar.isVisible()


@pytest.mark.model
def test_regenerate_edit_and_branch_navigation(window: MainWindow, qtbot: QtBot) -> None:
    send(qtbot, window, "Name a fruit.")
    store = store_of(window)
    first = window.chat_model.message(1)
    busy = record(window.controller.busy_changed)

    window.chat_view.message_widgets[1].regenerate_button.click()
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=120_000)
    assert busy == [True, False]
    second = window.chat_model.message(1)
    assert second.store_id != first.store_id and second.branch == (2, 2)
    assert [s.id for s in store.siblings(first.store_id or 0)] == [first.store_id, second.store_id]
    w1 = window.chat_view.message_widgets[1]
    assert w1.branch_label.text() == "2/2" and w1.prev_button.isEnabled()
    assert not w1.next_button.isEnabled()

    w1.prev_button.click()
    shown = window.chat_model.message(1)
    assert shown.store_id == first.store_id and shown.branch == (1, 2)
    assert window.chat_view.message_widgets[1].branch_label.text() == "1/2"
    window.chat_view.message_widgets[1].next_button.click()
    assert window.chat_model.message(1).store_id == second.store_id

    # Editing the question makes a second version of it, answered anew.
    busy.clear()
    assert window.controller.edit(0, "Name a vegetable.")
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=120_000)
    assert busy == [True, False]
    assert window.chat_model.message(0).text == "Name a vegetable."
    assert window.chat_model.message(0).branch == (2, 2)
    assert window.chat_model.message(1).state == "done"
    window.chat_view.message_widgets[0].prev_button.click()
    # Back on the first question: its newest answer (the regenerated one) is shown.
    assert [m.store_id for m in window.chat_model.conversation.messages] == [
        store.message(first.store_id or 0).parent_id,
        second.store_id,
    ]

    # Copy puts the message on the clipboard; Delete removes it and what follows.
    window.chat_view.message_widgets[1].copy_message_button.click()
    assert QApplication.clipboard().text() == window.chat_model.message(1).text
    window.chat_view.message_widgets[1].delete_button.click()
    # The other version of the answer takes its place.
    assert [s.id for s in store.siblings(first.store_id or 0)] == [first.store_id]
    assert window.chat_model.message(1).store_id == first.store_id
    assert window.chat_model.message(1).branch == (1, 1)
    window.chat_view.message_widgets[1].delete_button.click()
    assert window.chat_model.rowCount() == 1


def test_chat_settings_are_applied_to_generation(
    window: MainWindow, qtbot: QtBot, smollm2: Model
) -> None:
    panel = window.chat_settings
    assert panel is not None
    changes = record(panel.changed)
    panel.system_prompt.setPlainText("You only answer in French.")
    panel.max_tokens.setValue(3)
    assert changes[-1] == {"system_prompt": "You only answer in French.", "max_tokens": 3}
    # A question whose answer is surely longer than 3 tokens, so max_tokens is what ends it.
    question = "Write a long story about the sea, with many details."
    send(qtbot, window, question)
    reply = window.chat_model.message(1)
    assert reply.stats is not None
    assert (reply.stats.gen_tokens, reply.stats.stop_reason) == (3, "length")
    # The prompt was exactly the system prompt plus the question, through the template.
    expected = smollm2.chat_tokens(
        [
            {"role": "system", "content": "You only answer in French."},
            {"role": "user", "content": question},
        ]
    )
    assert reply.stats.prompt_tokens == len(expected)
    store = store_of(window)
    cid = window.controller.conversation_id
    assert cid is not None
    assert store.conversation(cid).settings == changes[-1]
    assert store.active_path(cid)[1].sampling["max_tokens"] == 3

    # A preset saved here applies to a new chat; the drawer shows each chat's own settings.
    panel.save_preset("Short French")
    window.new_chat()
    assert panel.settings() == {}
    panel.apply_preset("Short French")
    assert window.controller.chat_settings == changes[-1]
    window.open_conversation(cid)
    assert panel.system_prompt.toPlainText() == "You only answer in French."


def long_history(store: ChatStore, turns: int) -> int:
    c = store.create_conversation("Long chat")
    for i in range(turns):
        store.add_message(c.id, "user", f"Question {i}: " + "tell me about rivers " * 12)
        store.add_message(c.id, "assistant", f"Answer {i}: " + "rivers flow to the sea " * 12)
    return c.id


def test_context_overflow_drops_oldest_or_stops_and_says_so(
    window: MainWindow, qtbot: QtBot, smollm2_path: Path
) -> None:
    loaded = record(window.engine.worker.loaded)
    window._load(smollm2_path, LoadParams(n_ctx=512))
    qtbot.waitUntil(lambda: bool(loaded), timeout=60_000)
    store = store_of(window)
    cid = long_history(store, 8)  # about 800 tokens: more than the context holds
    window.open_conversation(cid)
    notes = record(window.controller.context_note)
    send(qtbot, window, "And lakes?")
    assert len(notes) == 1 and "old messages left out" in notes[0]
    assert window.chat_view.context_note.isVisible()
    reply = window.chat_model.message(window.chat_model.rowCount() - 1)
    assert reply.state == "done" and reply.stats is not None
    assert reply.stats.prompt_tokens + GREEDY.max_tokens <= 512

    # Policy "stop": nothing is generated, and the window says why.
    assert window.chat_settings is not None
    window.chat_settings.policy.setCurrentIndex(1)
    assert window.controller.chat_settings["context_policy"] == "stop"
    errors = record(window.controller.error)
    send(qtbot, window, "And oceans?")
    assert len(errors) == 1 and "the context holds 512" in errors[0]
    assert window.banner.isVisible()
    assert window.chat_model.message(window.chat_model.rowCount() - 1).state == "error"


def test_export_and_import_round_trip(window: MainWindow, qtbot: QtBot, tmp_path: Path) -> None:
    store = store_of(window)
    a = store.create_conversation()
    store.add_message(a.id, "user", "Ping?")
    store.add_message(a.id, "assistant", "Pong.", stats={"gen_tokens": 2, "gen_tps": 50.0})
    store.update_settings(a.id, system_prompt="Be brief.")
    window.export_chats(tmp_path / "chats.json", "json")
    window.export_chats(tmp_path / "chats.md", "md")
    md = (tmp_path / "chats.md").read_text(encoding="utf-8")
    assert "# Ping?" in md and "Pong." in md and "System prompt: Be brief." in md
    data = json.loads((tmp_path / "chats.json").read_text(encoding="utf-8"))
    assert [c["title"] for c in data["conversations"]] == ["Ping?"]

    store.delete(a.id)
    store.purge_deleted()
    ids = window.import_chats(tmp_path / "chats.json")
    (b,) = store.conversations()
    assert ids == [b.id] and b.title == "Ping?" and b.settings == {"system_prompt": "Be brief."}
    assert [(m.role, m.content) for m in store.active_path(b.id)] == [
        ("user", "Ping?"),
        ("assistant", "Pong."),
    ]
    assert window.conversation_list is not None and window.conversation_list.ids() == [b.id]

    # A broken file: one readable line in the window, nothing imported.
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    assert window.import_chats(tmp_path / "bad.json") == []
    assert window.banner.isVisible() and "bad.json is not JSON" in window.banner.label.text()
    (tmp_path / "odd.json").write_text(
        '{"conversations": [{"messages": [{"role": 1}]}]}', encoding="utf-8"
    )
    assert window.import_chats(tmp_path / "odd.json") == []
    assert "needs a role and text content" in window.banner.label.text()
    assert len(store.conversations()) == 1


@pytest.mark.model
def test_regenerate_in_an_opened_chat_loads_the_model_first(
    window: MainWindow, qtbot: QtBot
) -> None:
    store = store_of(window)
    c = store.create_conversation()
    store.add_message(c.id, "user", "Say hello.")
    old = store.add_message(c.id, "assistant", "An answer from an earlier session.")
    window.open_conversation(c.id)
    assert window.controller.loaded is None
    busy = record(window.controller.busy_changed)
    window.chat_view.message_widgets[1].regenerate_button.click()
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=120_000)
    assert busy == [True, True, False]  # loading, answering, done
    new = window.chat_model.message(1)
    assert new.state == "done" and new.branch == (2, 2) and new.store_id != old.id
    assert [s.id for s in store.siblings(old.id)] == [old.id, new.store_id]
