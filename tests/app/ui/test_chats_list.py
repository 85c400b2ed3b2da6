"""The chats list shows when each chat was last active and how it ends, so chats with the
same title can be told apart; and the dates read as a person says them."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from pytestqt.qtbot import QtBot

from app.services.chat_store import ChatStore
from app.ui.chat_dates import short_when
from app.ui.conversation_list import ConversationList


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_short_dates() -> None:
    now = ts("2026-11-12 18:30")
    assert short_when(ts("2026-11-12 09:05"), now) == "09:05"
    assert short_when(ts("2026-11-11 23:59"), now) == "Yesterday 23:59"
    assert short_when(ts("2026-11-09 08:00"), now) == "Mon 08:00"
    assert short_when(ts("2026-03-02 08:00"), now) == "2 Mar"
    assert short_when(ts("2025-12-31 08:00"), now) == "31 Dec 2025"


def test_three_chats_with_the_same_title_are_told_apart(qtbot: QtBot, tmp_path: Path) -> None:
    clock = [ts("2026-11-10 10:00")]
    store = ChatStore(tmp_path / "chats.sqlite3", clock=lambda: clock[0])
    try:
        endings = [
            "The keeper lit the lamp one last time.",
            "A storm came, and the light held.",
            "She sailed away at dawn " + "and never looked back " * 6,
        ]
        for hours, ending in enumerate(endings):
            clock[0] = ts("2026-11-10 10:00") + hours * 3600
            c = store.create_conversation("Write a 200-word story…")
            store.add_message(c.id, "user", "Write a 200-word story about a lighthouse.")
            store.add_message(c.id, "assistant", ending)
        cl = ConversationList(store, clock=lambda: ts("2026-11-10 18:00"))
        qtbot.addWidget(cl)
        texts = [cl.list.item(i).text() for i in range(cl.list.count())]
        assert len(set(texts)) == 3
        assert [t.split("\n")[0] for t in texts] == ["Write a 200-word story…"] * 3
        assert texts[0].split("\n")[1].startswith("12:00 · She sailed away at dawn")
        assert texts[0].endswith("…") and len(texts[0].split("\n")[1]) <= len("12:00 · ") + 80
        assert texts[2].split("\n")[1] == "10:00 · The keeper lit the lamp one last time."
    finally:
        store.close()


def test_a_chat_without_messages_shows_only_its_date(qtbot: QtBot, tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.sqlite3")
    try:
        store.create_conversation("Empty")
        cl = ConversationList(store, clock=time.time)
        qtbot.addWidget(cl)
        title, when = cl.list.item(0).text().split("\n")
        assert title == "Empty" and " · " not in when and ":" in when
    finally:
        store.close()
