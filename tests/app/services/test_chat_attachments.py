"""Attachments in the chat store: content-addressed files beside the database, written before
the message refers to them, removed with the last message that does, carried by export and
import, and a crash's leftover swept."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from app.services.attachments import Attachment, AttachmentFiles, kind_of
from app.services.chat_exchange import export_all, export_markdown, import_data
from app.services.chat_store import SCHEMA_VERSION, ChatStore, ChatStoreError

PNG = b"\x89PNG\r\n\x1a\n" + b"picture" * 10
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"sound" * 10


def test_kinds_come_from_the_bytes_or_the_name() -> None:
    assert kind_of("", PNG) == "image"
    assert kind_of("clip", WAV) == "audio"
    assert kind_of("photo.JPG") == "image"
    assert kind_of("a.webp", b"RIFF\0\0\0\0WEBPVP8 ") == "image"
    assert kind_of("notes.txt", b"hello") is None


def test_a_file_is_kept_once_by_its_hash_beside_the_database(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.sqlite3") as store:
        assert store.schema_version == SCHEMA_VERSION
        a = store.save_attachment(PNG, "photo.png", "image")
        b = store.save_attachment(PNG, "same.png", "image")
        assert a.sha256 == b.sha256 == hashlib.sha256(PNG).hexdigest()
        assert store.files is not None
        assert store.files.folder == tmp_path / "chats-attachments"
        files = [p for p in store.files.folder.rglob("*") if p.is_file()]
        assert files == [store.files.path(a.sha256)]  # no temporary file left either
        cid = store.create_conversation().id
        m = store.add_message(cid, "user", "What is this?", attachments=[a])
    with ChatStore(tmp_path / "chats.sqlite3") as store:
        assert store.message(m.id).attachments == [a]
        assert store.attachment_data(a) == PNG


def test_a_message_cannot_refer_to_a_file_not_written(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.sqlite3") as store:
        cid = store.create_conversation().id
        ghost = Attachment("0" * 64, "ghost.png", "image")
        with pytest.raises(ChatStoreError, match=r"ghost\.png was not saved"):
            store.add_message(cid, "user", "hi", attachments=[ghost])
        assert store.messages(cid) == []


def test_files_go_with_the_last_message_that_refers_to_them(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.sqlite3") as store:
        assert store.files is not None
        img = store.save_attachment(PNG, "photo.png", "image")
        wav = store.save_attachment(WAV, "clip.wav", "audio")
        one = store.create_conversation().id
        first = store.add_message(one, "user", "look", attachments=[img, wav])
        store.add_message(one, "assistant", "I see")
        two = store.create_conversation().id
        store.add_message(two, "user", "again", attachments=[img])
        store.delete_message(first.id)
        assert store.files.has(img.sha256)  # the other chat still shows it
        assert not store.files.has(wav.sha256)
        store.delete(two)
        assert store.files.has(img.sha256)  # a deleted chat can still be undone
        assert store.purge_deleted() == 1
        assert not store.files.has(img.sha256)
        assert not any(store.files.folder.rglob("*"))  # no empty folders left


def test_a_file_a_crash_left_without_its_message_is_swept(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    with ChatStore(path) as store:
        kept = store.save_attachment(PNG, "photo.png", "image")
        cid = store.create_conversation().id
        store.add_message(cid, "user", "look", attachments=[kept])
        # The app died after writing this file and before its message was committed.
        orphan = store.save_attachment(WAV, "clip.wav", "audio")
        assert store.files is not None
        part = store.files.folder / "ab" / ".abc.1234.part"  # a write cut short
        part.parent.mkdir()
        part.write_bytes(b"half")
        old = time.time() - 2 * 3600
        for f in (store.files.path(orphan.sha256), part, store.files.path(kept.sha256)):
            os.utime(f, (old, old))
        # No message shows it: only what messages refer to is shown.
        shown = [a for m in store.messages(cid) for a in m.attachments]
        assert shown == [kept]
    with ChatStore(path) as store:
        assert store.files is not None
        fresh = AttachmentFiles(store.files.folder).put(b"GIF89a being referred to now")
        store.recover_interrupted()  # what the app does on start
        assert not store.files.has(orphan.sha256) and not part.exists()
        assert store.files.has(kept.sha256)
        assert store.files.has(fresh)  # too young: another process may be about to use it
        assert store.attachment_data(kept) == PNG


def test_a_schema_5_history_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    with ChatStore(path) as store:
        cid = store.create_conversation().id
        store.add_message(cid, "user", "old message")
    db = sqlite3.connect(path)
    db.executescript("ALTER TABLE messages DROP COLUMN attachments; PRAGMA user_version = 5;")
    db.close()
    with ChatStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        (m,) = store.messages(cid)
        assert m.content == "old message" and m.attachments == []


def test_export_and_import_carry_the_files(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "a" / "chats.sqlite3") as src:
        img = src.save_attachment(PNG, "photo.png", "image")
        wav = src.save_attachment(WAV, "clip.wav", "audio")
        cid = src.create_conversation().id
        src.add_message(cid, "user", "look and listen", attachments=[img, wav])
        src.add_message(cid, "assistant", "A picture and a sound.")
        src.add_message(cid, "user", "the picture again", attachments=[img])
        data = json.loads(json.dumps(export_all(src)))
    assert set(data["attachments"]) == {img.sha256, wav.sha256}  # each file once
    assert base64.b64decode(data["attachments"][img.sha256]) == PNG
    assert "*Attached image: photo.png*" in export_markdown(data["conversations"])
    with ChatStore(tmp_path / "b" / "chats.sqlite3") as dst:
        (new,) = import_data(dst, data)
        msgs = dst.active_path(new)
        assert [m.attachments for m in msgs] == [[img, wav], [], [img]]
        assert dst.attachment_data(img) == PNG and dst.attachment_data(wav) == WAV
        # A file missing from the export, or not what its hash says: the message comes
        # without it, never pointing at nothing...
        data["attachments"].pop(wav.sha256)
        data["attachments"][img.sha256] = base64.b64encode(b"other bytes").decode()
        with ChatStore(tmp_path / "c" / "chats.sqlite3") as other:
            (bare,) = import_data(other, data)
            assert [m.attachments for m in other.active_path(bare)] == [[], [], []]
            assert other.active_path(bare)[0].content == "look and listen"
        # ...unless the same bytes are kept here already (their hash names them).
        (again,) = import_data(dst, data)
        assert [m.attachments for m in dst.active_path(again)] == [[img, wav], [], [img]]
