"""A reasoning model's thinking in the chat store: its own column (schema 3, migrated from 2),
written as it streams, kept apart from the answer's text (and so out of search), exported,
imported and shown in the Markdown export."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services.chat_exchange import export_all, export_markdown, import_data
from app.services.chat_store import SCHEMA_VERSION, ChatStore, StreamWriter


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    s = ChatStore(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def test_schema_3_adds_the_thinking_column(store: ChatStore) -> None:
    assert store.schema_version == SCHEMA_VERSION >= 3
    cols = {r[1]: r for r in store._db.execute("PRAGMA table_info(messages)")}
    assert "thinking" in cols and cols["thinking"][3] == 1  # NOT NULL, default ''


def test_migrates_a_version_2_database(tmp_path: Path) -> None:
    """A database written by the previous version (schema 2) opens with its messages as they
    were, each without thinking, and takes thinking from then on."""
    path = tmp_path / "v2.sqlite3"
    with ChatStore(path) as s:  # build the current schema, then take it back to version 2
        c = s.create_conversation()
        s.add_message(c.id, "user", "old question")
        s.add_message(c.id, "assistant", "old answer", stats={"gen_tokens": 2})
    db = sqlite3.connect(path)
    db.executescript(
        "ALTER TABLE messages DROP COLUMN attachments; "  # schema 6's
        "ALTER TABLE messages DROP COLUMN grounding; "  # schema 5's
        "ALTER TABLE messages DROP COLUMN tool_calls; "  # schema 4's
        "ALTER TABLE messages DROP COLUMN tool_call_id; "
        "ALTER TABLE messages DROP COLUMN tool_name; "
        "ALTER TABLE messages DROP COLUMN thinking; PRAGMA user_version = 2;"
    )
    db.close()
    with ChatStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        user, answer = s.active_path(c.id)
        assert (user.content, answer.content, answer.thinking) == ("old question", "old answer", "")
        assert answer.stats == {"gen_tokens": 2}
        new = s.add_message(c.id, "assistant", "Paris.", thinking="It is large.")
        assert s.message(new.id).thinking == "It is large."


def test_stream_writer_keeps_thinking_and_text_apart(store: ChatStore) -> None:
    now = [0.0]
    c = store.create_conversation()
    store.add_message(c.id, "user", "q")
    m = store.add_message(c.id, "assistant", "", status="streaming")
    w = StreamWriter(store, m.id, clock=lambda: now[0])
    w.append_thinking("Paris ")
    w.flush()  # the first words are on disk at once (the controller flushes them)
    assert (store.message(m.id).thinking, store.message(m.id).content) == ("Paris ", "")
    for i, piece in enumerate(["is ", "large."]):
        now[0] = 0.6 * (i + 1)
        w.append_thinking(piece)
    # Flushed once a second: after 1.2 s the thinking on disk is whole.
    assert store.message(m.id).thinking == "Paris is large."
    now[0] = 1.5
    w.append("Paris.")
    assert store.message(m.id).content == ""  # less than a second since the last flush
    # A crash now: the thinking is kept, the message is an interrupted answer.
    assert [r.thinking for r in store.recover_interrupted()] == ["Paris is large."]
    w.finish(stats={"thinking_tokens": 7, "gen_tokens": 11})
    done = store.message(m.id)
    assert (done.thinking, done.content, done.status) == ("Paris is large.", "Paris.", "complete")
    assert (w.thinking, w.text) == ("Paris is large.", "Paris.")


def test_thinking_is_not_searched(store: ChatStore) -> None:
    c = store.create_conversation()
    store.add_message(c.id, "user", "Capital of France?")
    store.add_message(c.id, "assistant", "Paris.", thinking="Lutetia was its Roman name.")
    assert store.search("Lutetia") == []
    assert [m.content for _, m, _ in store.search("Paris")] == ["Paris."]


def test_export_import_and_markdown_carry_thinking(store: ChatStore) -> None:
    c = store.create_conversation()
    store.add_message(c.id, "user", "Capital of France?")
    store.add_message(
        c.id,
        "assistant",
        "Paris.",
        thinking="It is large.",
        stats={"gen_tokens": 11, "thinking_tokens": 7, "thinking_s": 0.5},
    )
    data = export_all(store)
    exported = data["conversations"][0]["messages"][1]
    assert (exported["thinking"], exported["content"]) == ("It is large.", "Paris.")
    (new_id,) = import_data(store, json.loads(json.dumps(data)))
    assert [m.thinking for m in store.active_path(new_id)] == ["", "It is large."]
    # An export from before thinking existed (no field) imports with none.
    old = [
        {k: v for k, v in m.items() if k != "thinking"} for m in data["conversations"][0]["tree"]
    ]
    (old_id,) = import_data(store, {"title": "old", "tree": old, "messages": []})
    assert [m.thinking for m in store.active_path(old_id)] == ["", ""]
    md = export_markdown(export_all(store, [c.id])["conversations"])
    assert (
        "**Assistant**:\n\n<details><summary>Thinking</summary>\n\nIt is large.\n\n"
        "</details>\n\nParis.\n"
    ) in md
    assert "**You**:\n\nCapital of France?\n" in md
