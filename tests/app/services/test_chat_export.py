"""Exports say how an answer ended (stopped by the user, cut at the length limit, interrupted,
failed) and carry the chat's system prompt; an export file is written whole or not at all."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services.atomic_write import write_text_atomic
from app.services.chat_exchange import export_all, export_markdown, import_data, write_export
from app.services.chat_store import ChatStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    s = ChatStore(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def answers(store: ChatStore) -> int:
    c = store.create_conversation(
        "Endings",
        settings={"system_prompt": "You are a lighthouse keeper.\n\nAnswer in one sentence."},
    )
    for text, status, reason in (
        ("Done.", "complete", "stop"),
        ("I was saying", "complete", "cancelled"),
        ("A long", "complete", "length"),
        ("Half an", "interrupted", None),
        ("", "error", None),
    ):
        store.add_message(c.id, "user", f"Q: {text}")
        stats = (
            {"gen_tokens": 3, "gen_tps": 9.0, "stop_reason": reason}
            if reason
            else ({"error": "the model file was deleted"} if status == "error" else {})
        )
        store.add_message(c.id, "assistant", text, status=status, stats=stats)
    return c.id


def test_json_export_marks_how_each_answer_ended(store: ChatStore) -> None:
    cid = answers(store)
    (conv,) = export_all(store, [cid])["conversations"]
    assert conv["settings"]["system_prompt"].startswith("You are a lighthouse keeper.")
    assert [m["ended"] for m in conv["messages"] if m["role"] == "assistant"] == [
        None,
        "stopped",
        "length",
        "interrupted",
        "error",
    ]
    assert {m["ended"] for m in conv["messages"] if m["role"] == "user"} == {None}
    assert [m["ended"] for m in conv["tree"]] == [m["ended"] for m in conv["messages"]]


def test_markdown_export_marks_how_each_answer_ended(store: ChatStore) -> None:
    md = export_markdown(export_all(store, [answers(store)])["conversations"])
    # A system prompt of two paragraphs stays one quote.
    assert "> System prompt: You are a lighthouse keeper.\n>\n> Answer in one sentence.\n" in md
    assert "**Assistant**:\n\nDone." in md
    assert "**Assistant** (stopped by the user):\n\nI was saying" in md
    assert "**Assistant** (cut off at the length limit):\n\nA long" in md
    assert "**Assistant** (interrupted):\n\nHalf an" in md
    assert "**Assistant** (failed):" in md and "*the model file was deleted*" in md
    assert md.count("(stopped by the user)") == 1  # only that answer is marked


def test_an_older_export_without_endings_still_marks_interrupted_answers() -> None:
    md = export_markdown(
        [
            {
                "title": "Old",
                "messages": [{"role": "assistant", "content": "Half", "status": "interrupted"}],
            }
        ]
    )
    assert "**Assistant** (interrupted):" in md


def test_write_export_writes_exactly_the_chats_asked_for(store: ChatStore, tmp_path: Path) -> None:
    wanted = answers(store)
    other = store.create_conversation("Another chat")
    store.add_message(other.id, "user", "Not this one")
    assert write_export(store, tmp_path / "one.json", "json", [wanted]) == 1
    data = json.loads((tmp_path / "one.json").read_text(encoding="utf-8"))
    assert [c["id"] for c in data["conversations"]] == [wanted]
    assert write_export(store, tmp_path / "one.md", "md", [wanted]) == 1
    md = (tmp_path / "one.md").read_text(encoding="utf-8")
    assert md.startswith("# Endings\n") and "Another chat" not in md
    assert write_export(store, tmp_path / "all.json", "json") == 2
    # An importable export: the store reads it back.
    assert len(import_data(store, data)) == 1


def test_atomic_write_replaces_a_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "chat.md"
    target.write_text("old", encoding="utf-8")
    write_text_atomic(target, "new ✓")
    assert target.read_text(encoding="utf-8") == "new ✓"
    assert os.listdir(tmp_path) == ["chat.md"]
    umask = os.umask(0)
    os.umask(umask)
    if os.name == "posix":  # the permissions of a plain write, not a temp file's 0600
        assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "chat.md"
    target.write_text("the export from yesterday", encoding="utf-8")

    def disk_full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)  # the flush to the disk, before the rename
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(target, "a much longer export " * 1000)
    assert target.read_text(encoding="utf-8") == "the export from yesterday"
    assert os.listdir(tmp_path) == ["chat.md"]


def test_a_write_into_a_missing_folder_fails_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_text_atomic(tmp_path / "gone" / "chat.md", "text")
    assert os.listdir(tmp_path) == []
