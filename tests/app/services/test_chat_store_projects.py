"""Projects in the chat store: the migration from schema 6, CRUD, moving chats, deleting a
project (its chats stay), and what a new chat in a project starts with."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services.chat_settings import ChatSettings
from app.services.chat_store import MIGRATIONS, SCHEMA_VERSION, ChatStore, ChatStoreError
from app.services.projects import new_chat_in_project, project_settings


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    s = ChatStore(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def test_opens_a_schema_6_database(tmp_path: Path) -> None:
    # The database as the previous version left it: its migrations only, and a chat.
    path = tmp_path / "v6.sqlite3"
    db = sqlite3.connect(path)
    for sql, _fixup in MIGRATIONS[:6]:
        db.executescript(sql)
    db.executescript(
        """
        INSERT INTO conversations(id, title, created_at, updated_at, settings)
        VALUES (1, 'Old chat', 1.0, 2.0, '{"system_prompt": "Be brief."}');
        INSERT INTO messages(id, conversation_id, role, content, created_at)
        VALUES (1, 1, 'user', 'hello lighthouse', 1.0);
        PRAGMA user_version = 6;
        """
    )
    db.close()
    with ChatStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION >= 7
        old = s.conversation(1)
        assert old.project_id is None and old.settings == {"system_prompt": "Be brief."}
        assert s.projects() == []
        p = s.create_project("Work")
        s.move_to_project(1, p.id)
        assert s.conversation(1).project_id == p.id
        assert [c.id for c, _m, _s in s.search("lighthouse")] == [1]


def test_project_crud(store: ChatStore) -> None:
    b = store.create_project("  beta   notes ", "Answer in French.", ["papers", "notes"])
    a = store.create_project("Alpha")
    assert b.name == "beta notes"
    assert b.system_prompt == "Answer in French." and b.collections == ("papers", "notes")
    assert [p.name for p in store.projects()] == ["Alpha", "beta notes"]  # by name, any case
    changed = store.update_project(a.id, name="Zeta", collections=["papers"])
    assert changed.name == "Zeta" and changed.collections == ("papers",)
    assert changed.system_prompt == ""
    assert store.update_project(a.id, system_prompt="Cite.").collections == ("papers",)
    with pytest.raises(ChatStoreError, match="needs a name"):
        store.create_project("   ")
    with pytest.raises(ChatStoreError, match="no project"):
        store.update_project(999, name="x")
    with pytest.raises(ChatStoreError, match="no project"):
        store.project(999)


def test_moving_chats_in_and_out(store: ChatStore) -> None:
    p = store.create_project("Work")
    c = store.create_conversation("Loose")
    before = store.conversation(c.id).updated_at
    store.move_to_project(c.id, p.id)
    moved = store.conversation(c.id)
    assert moved.project_id == p.id and moved.updated_at == before
    store.move_to_project(c.id, None)
    assert store.conversation(c.id).project_id is None
    with pytest.raises(ChatStoreError, match="no project"):
        store.move_to_project(c.id, 999)


def test_deleting_a_project_keeps_its_chats(store: ChatStore) -> None:
    p = store.create_project("Work")
    keep = store.create_in_project(p.id, title="Kept")
    gone = store.create_in_project(p.id, title="Soft-deleted")
    store.add_message(keep.id, "user", "still here")
    store.delete(gone.id)
    assert store.delete_project(p.id) == 2
    assert store.projects() == []
    assert store.conversation(keep.id).project_id is None
    assert [m.content for m in store.active_path(keep.id)] == ["still here"]
    store.undo_delete(gone.id)  # an undone delete brings it back loose, not into nothing
    assert store.conversation(gone.id).project_id is None


def test_a_new_chat_in_a_project_starts_with_its_prompt_and_collections(
    store: ChatStore,
) -> None:
    p = store.create_project("Research", "You are a careful reviewer.", ["papers"])
    conv = new_chat_in_project(store, p.id)
    assert conv.project_id == p.id
    assert conv.settings == {
        "system_prompt": "You are a careful reviewer.",
        "collections": ["papers"],
    }
    settings = ChatSettings.from_stored(store.conversation(conv.id).settings)
    assert settings.system_prompt == "You are a careful reviewer."
    assert settings.collections == ("papers",)
    # Other settings of the base survive; an empty project prompt leaves the base's.
    base = ChatSettings(system_prompt="Base.", docs_k=9)
    bare = store.create_project("Bare")
    assert project_settings(bare, base).system_prompt == "Base."
    assert project_settings(p, base).docs_k == 9


def test_search_finds_chats_inside_projects(store: ChatStore) -> None:
    p = store.create_project("Work")
    c = store.create_in_project(p.id)
    store.add_message(c.id, "user", "the quarterly lighthouse report")
    hits = store.search("lighthouse")
    assert [(h[0].id, h[0].project_id) for h in hits] == [(c.id, p.id)]


def test_an_empty_chat_in_the_project_is_taken_again(store: ChatStore) -> None:
    p = store.create_project("Research", "Cite.", ["papers"])
    first = new_chat_in_project(store, p.id)
    store.update_project(p.id, system_prompt="Cite twice.")
    again = new_chat_in_project(store, p.id)
    assert again.id == first.id and again.settings["system_prompt"] == "Cite twice."
    store.add_message(first.id, "user", "A question")
    third = new_chat_in_project(store, p.id)
    assert third.id != first.id
    assert [c.id for c in store.conversations() if c.project_id == p.id] == [third.id, first.id]
