"""The passages a grounded answer was given, kept with it (schema 5): an older database opens
with its answers ungrounded, the passages come back as they were stored, and exports carry
them (Markdown lists the Sources, JSON round-trips them through an import)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.services.chat_exchange import export_all, export_text, import_data, write_export
from app.services.chat_store import SCHEMA_VERSION, ChatStore, ChatStoreError
from engine.rag.grounding import Grounding, Source

SOURCES = (
    Source(1, "/docs/guide.pdf", 4, None, 120, 260, None, "The lamp needs oil.\nFill it daily."),
    Source(2, "/docs/notes.md", None, "Keeping", 0, 40, 7, "Keepers log every night."),
)
GROUNDING = Grounding(
    sources=SOURCES, text="", tokens=84, budget=512, offered=3, collections=("lighthouse",)
)


def grounded(store: ChatStore) -> tuple[int, int]:
    c = store.create_conversation(settings={"collections": ["lighthouse"]})
    store.add_message(c.id, "user", "How is the lamp kept?")
    a = store.add_message(
        c.id, "assistant", "With oil [1], logged nightly [2].", grounding=GROUNDING.to_dict()
    )
    return c.id, a.id


@pytest.fixture
def store(tmp_path: Path) -> ChatStore:
    return ChatStore(tmp_path / "chats.sqlite3")


def test_schema_5_migrates_a_version_4_database(tmp_path: Path) -> None:
    path = tmp_path / "v4.sqlite3"
    with ChatStore(path) as s:
        c = s.create_conversation("Old chat")
        s.add_message(c.id, "user", "old question")
        old = s.add_message(c.id, "assistant", "old answer", stats={"gen_tokens": 2})
    db = sqlite3.connect(path)
    db.executescript(
        "ALTER TABLE messages DROP COLUMN attachments; "  # schema 6's
        "ALTER TABLE messages DROP COLUMN grounding; PRAGMA user_version = 4;"
    )
    db.close()
    with ChatStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION >= 5
        answer = s.message(old.id)
        assert (answer.content, answer.stats, answer.grounding) == (
            "old answer",
            {"gen_tokens": 2},
            {},
        )
        # Grounded answers are stored from then on.
        a = s.add_message(c.id, "assistant", "new", grounding=GROUNDING.to_dict())
        assert Grounding.from_dict(s.message(a.id).grounding).sources == SOURCES


def test_the_passages_come_back_as_stored(store: ChatStore, tmp_path: Path) -> None:
    cid, aid = grounded(store)
    store.close()
    with ChatStore(tmp_path / "chats.sqlite3") as again:
        back = Grounding.from_dict(again.message(aid).grounding)
        assert back == Grounding.from_dict(GROUNDING.to_dict())
        assert back.sources == SOURCES and back.tokens == 84 and back.budget == 512
        assert "[2] notes.md, § Keeping\nKeepers log every night." in back.text
        assert again.active_path(cid)[0].grounding == {}  # the question is not grounded


def test_an_answer_gets_its_passages_later_and_bad_ones_are_refused(store: ChatStore) -> None:
    c = store.create_conversation()
    a = store.add_message(c.id, "assistant", "streaming…", status="streaming")
    store.update_message(a.id, grounding=GROUNDING.to_dict())
    assert Grounding.from_dict(store.message(a.id).grounding).sources == SOURCES
    with pytest.raises(ChatStoreError, match="bad sources: a source needs a path"):
        store.update_message(a.id, grounding={"sources": [{"number": 1, "start": 0, "end": 1}]})
    with pytest.raises(ChatStoreError, match="bad sources"):
        store.add_message(c.id, "assistant", "x", grounding={"sources": 3})


def test_markdown_export_lists_the_sources_with_their_passages(store: ChatStore) -> None:
    cid, _ = grounded(store)
    md = export_text(export_all(store, [cid]), "md")
    head, sources = md.split("**Sources**:\n", 1)
    assert "With oil [1], logged nightly [2]." in head
    assert "- [1] guide.pdf, p. 4 (`/docs/guide.pdf`, characters 120 to 260)" in sources
    assert "  > The lamp needs oil.\n  > Fill it daily." in sources
    assert "- [2] notes.md, § Keeping (`/docs/notes.md`, characters 0 to 40)" in sources
    assert "  > Keepers log every night." in sources
    assert md.count("**Sources**") == 1  # the question has none


def test_json_export_round_trips_the_passages_through_an_import(
    store: ChatStore, tmp_path: Path
) -> None:
    cid, aid = grounded(store)
    out = tmp_path / "chats.json"
    assert write_export(store, out, "json", [cid]) == 1
    data = json.loads(out.read_text(encoding="utf-8"))
    (answer,) = [m for m in data["conversations"][0]["messages"] if m["role"] == "assistant"]
    assert answer["grounding"]["sources"][0]["path"] == "/docs/guide.pdf"
    with ChatStore(tmp_path / "other.sqlite3") as other:
        (new_cid,) = import_data(other, data)
        (_, imported) = other.active_path(new_cid)
        assert imported.grounding == store.message(aid).grounding
        assert Grounding.from_dict(imported.grounding).sources == SOURCES
        assert other.conversation(new_cid).settings == {"collections": ["lighthouse"]}


def test_an_import_with_broken_sources_names_the_message(store: ChatStore) -> None:
    data = {
        "conversations": [
            {
                "title": "t",
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a", "grounding": {"sources": [{}]}},
                ],
            }
        ]
    }
    with pytest.raises(ChatStoreError, match=r"conversation #1, message #2: bad sources"):
        import_data(store, data)
    assert store.conversations() == []  # all or nothing
