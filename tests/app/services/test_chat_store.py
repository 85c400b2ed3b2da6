"""The chat store on real SQLite: migrations, branches, search, export/import, concurrency."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest

from app.services.chat_exchange import export_all, export_markdown, import_data
from app.services.chat_store import (
    DEFAULT_TITLE,
    SCHEMA_VERSION,
    ChatStore,
    ChatStoreError,
    StreamWriter,
    auto_title,
)


@pytest.fixture
def store(tmp_path: Path) -> ChatStore:
    s = ChatStore(tmp_path / "chats.sqlite3")
    yield s  # type: ignore[misc]
    s.close()


def _exchange(store: ChatStore, cid: int, q: str, a: str) -> tuple[int, int]:
    u = store.add_message(cid, "user", q)
    b = store.add_message(
        cid,
        "assistant",
        a,
        model="default",
        stats={"ttft_s": 0.1, "gen_tps": 80.0, "gen_tokens": 5},
        sampling={"temperature": 0.7},
    )
    return u.id, b.id


def test_fresh_database_is_at_current_schema(store: ChatStore) -> None:
    assert store.schema_version == SCHEMA_VERSION
    mode = store._db.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_migrates_a_version_1_database(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL,
            created_at REAL NOT NULL, updated_at REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL
            REFERENCES conversations(id) ON DELETE CASCADE, role TEXT NOT NULL,
            content TEXT NOT NULL, created_at REAL NOT NULL);
        INSERT INTO conversations VALUES (1, 'Old chat', 1.0, 2.0);
        INSERT INTO messages VALUES (1, 1, 'user', 'hello lighthouse', 1.0);
        INSERT INTO messages VALUES (2, 1, 'assistant', 'hi keeper', 1.5);
        INSERT INTO messages VALUES (3, 1, 'user', 'how tall?', 2.0);
        PRAGMA user_version = 1;
        """
    )
    db.close()
    with ChatStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        path_msgs = s.active_path(1)
        assert [m.content for m in path_msgs] == ["hello lighthouse", "hi keeper", "how tall?"]
        assert [m.parent_id for m in path_msgs] == [None, 1, 2]
        # Old messages are searchable after the upgrade.
        assert [m.id for _, m, _ in s.search("lighthouse")] == [1]


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.sqlite3"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(ChatStoreError, match="newer Candlewick"):
        ChatStore(path)


def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.sqlite3"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ChatStoreError, match="cannot be opened"):
        ChatStore(path)


def test_auto_title_rename_pin_sort(store: ChatStore) -> None:
    a = store.create_conversation()
    assert a.title == DEFAULT_TITLE
    _exchange(store, a.id, "How do lighthouses work at night?", "With a lamp.")
    assert store.conversation(a.id).title == "How do lighthouses work at night?"
    b = store.create_conversation()
    _exchange(store, b.id, "Second", "ok")
    assert [c.id for c in store.conversations()] == [b.id, a.id]
    store.set_pinned(a.id, True)
    assert [c.id for c in store.conversations()] == [a.id, b.id]
    store.rename(b.id, "  Renamed   chat ")
    assert store.conversation(b.id).title == "Renamed chat"
    assert auto_title("word " * 40).endswith("…")


def test_delete_undo_purge(store: ChatStore) -> None:
    c = store.create_conversation()
    _exchange(store, c.id, "keep me", "kept")
    store.delete(c.id)
    assert store.conversations() == []
    assert store.search("keep") == []
    store.undo_delete(c.id)
    assert [x.id for x in store.conversations()] == [c.id]
    store.delete(c.id)
    assert store.purge_deleted() == 1
    store.undo_delete(c.id)
    assert store.conversations() == []
    assert store._db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0


def test_branching_edit_and_regenerate(store: ChatStore) -> None:
    c = store.create_conversation()
    u1, a1 = _exchange(store, c.id, "Name a color", "Red")
    # Regenerate: a sibling answer under the same user message.
    a2 = store.add_message(c.id, "assistant", "Blue", parent_id=u1)
    assert store.branch_position(a2.id) == (2, 2)
    assert [m.content for m in store.active_path(c.id)] == ["Name a color", "Blue"]
    # Navigate back to the first alternative.
    assert [m.content for m in store.switch_branch(a1)] == ["Name a color", "Red"]
    assert store.branch_position(a1) == (1, 2)
    # Edit the user message: a new root-level sibling with its own answer.
    u2 = store.add_message(c.id, "user", "Name a fruit", parent_id=None)
    store.add_message(c.id, "assistant", "Apple")
    assert [m.content for m in store.active_path(c.id)] == ["Name a fruit", "Apple"]
    assert [m.id for m in store.siblings(u2.id)] == [u1, u2.id]
    # Switching to the old question follows its newest answer.
    assert [m.content for m in store.switch_branch(u1)] == ["Name a color", "Blue"]


def test_delete_message_moves_active_branch(store: ChatStore) -> None:
    c = store.create_conversation()
    u1, a1 = _exchange(store, c.id, "q", "a")
    store.delete_message(a1)
    assert [m.id for m in store.active_path(c.id)] == [u1]


def test_stats_and_settings_round_trip(store: ChatStore) -> None:
    c = store.create_conversation(settings={"system_prompt": "Be brief."})
    _, a = _exchange(store, c.id, "q", "a")
    m = store.message(a)
    assert m.stats["gen_tps"] == 80.0 and m.model == "default"
    assert m.sampling == {"temperature": 0.7}
    s = store.update_settings(c.id, temperature=0.2, max_tokens=64)
    assert s == {"system_prompt": "Be brief.", "temperature": 0.2, "max_tokens": 64}
    store.save_preset("Precise", {"temperature": 0.0})
    assert store.presets() == {"Precise": {"temperature": 0.0}}
    store.delete_preset("Precise")
    assert store.presets() == {}


def test_full_text_search(store: ChatStore) -> None:
    a = store.create_conversation()
    _exchange(store, a.id, "Tell me about lighthouses", "The Pharos of Alexandria was one.")
    b = store.create_conversation()
    _exchange(store, b.id, "Recipe for bread?", "Flour, water, salt and yeast.")
    hits = store.search("pharos")
    assert [(c.id, m.role) for c, m, _ in hits] == [(a.id, "assistant")]
    assert "[Pharos]" in hits[0][2]
    assert [c.id for c, _, _ in store.search("yea")] == [b.id]  # prefix match
    # FTS syntax in user input is treated as text, not as a query language.
    assert store.search('bread" OR "x') == store.search("bread x") == []
    assert store.search("   ") == []
    # Edits are re-indexed.
    store.update_message(hits[0][1].id, content="Now about Eddystone.")
    assert store.search("pharos") == [] and len(store.search("eddystone")) == 1


def test_export_import_round_trip_keeps_branches(store: ChatStore, tmp_path: Path) -> None:
    c = store.create_conversation(settings={"system_prompt": "S"})
    u1, _ = _exchange(store, c.id, "Name a color", "Red")
    store.add_message(c.id, "assistant", "Blue", parent_id=u1)
    store.set_pinned(c.id, True)
    exported = export_all(store)
    text = json.dumps(exported)
    other = ChatStore(tmp_path / "other.sqlite3")
    try:
        [new_id] = import_data(other, json.loads(text))
        again = export_all(other)["conversations"][0]
        orig = exported["conversations"][0]
        for key in ("title", "pinned", "settings", "created_at", "updated_at"):
            assert again[key] == orig[key]
        strip = [
            {k: v for k, v in m.items() if k not in ("id", "parent_id")} for m in orig["messages"]
        ]
        assert [
            {k: v for k, v in m.items() if k not in ("id", "parent_id")} for m in again["messages"]
        ] == strip
        assert len(again["tree"]) == len(orig["tree"]) == 3
        # The other branch came along.
        first_answer = other.children(other.active_path(new_id)[0].id)
        assert [m.content for m in first_answer] == ["Red", "Blue"]
    finally:
        other.close()


def test_import_rejects_garbage_atomically(store: ChatStore) -> None:
    with pytest.raises(ChatStoreError, match="message #1"):
        import_data(
            store,
            [
                {"title": "ok", "messages": [{"role": "user", "content": "fine"}]},
                {"title": "bad", "messages": [{"role": "wizard"}]},
            ],
        )
    assert store.conversations() == []  # nothing half-imported
    with pytest.raises(ChatStoreError, match="not a Candlewick chat export"):
        import_data(store, {"hello": 1})


def test_markdown_export(store: ChatStore) -> None:
    c = store.create_conversation(settings={"system_prompt": "Be kind."})
    _exchange(store, c.id, "Hi", "Hello!")
    md = export_markdown(export_all(store)["conversations"])
    assert md.startswith("# Hi\n")
    assert "**You**:\n\nHi" in md and "**Assistant**:\n\nHello!" in md
    assert "80.0 tok/s" in md and "Be kind." in md


def test_stream_writer_flushes_about_once_a_second(store: ChatStore) -> None:
    now = [0.0]
    c = store.create_conversation()
    store.add_message(c.id, "user", "q")
    m = store.add_message(c.id, "assistant", "", status="streaming")
    w = StreamWriter(store, m.id, clock=lambda: now[0])
    for i in range(30):
        now[0] = i * 0.1
        w.append(f"t{i} ")
    # 3 s of tokens: flushed at 1.0, 2.0 s; what is on disk lags by under a second.
    on_disk = store.message(m.id).content
    assert on_disk.startswith("t0 ") and on_disk.endswith("t20 ")
    assert store.message(m.id).status == "streaming"
    assert store.recover_interrupted()[0].id == m.id
    assert store.message(m.id).status == "interrupted"
    w.finish(stats={"gen_tokens": 30})
    final = store.message(m.id)
    assert final.status == "complete" and final.content.endswith("t29 ")


def test_concurrent_read_while_writing(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    writer = ChatStore(path)
    c = writer.create_conversation()
    errors: list[BaseException] = []
    counts: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            with ChatStore(path) as r:
                while not stop.is_set():
                    counts.append(len(r.active_path(c.id)))
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(200):
            writer.add_message(c.id, "user" if i % 2 == 0 else "assistant", f"m{i}")
    finally:
        stop.set()
        t.join()
        writer.close()
    assert not errors
    assert counts and counts == sorted(counts)  # readers see a growing, consistent history
