"""A full disk while a chat, an export, a download and a documents index are written: what was
stored before stays whole and readable, the error is one line, no half-written file is left
looking whole, and the next write after space is freed works.

The suite runs without root, so the disk fills by injection: SQLite's own SQLITE_FULL through
`PRAGMA max_page_count` (the database may not grow by a page), and OSError(ENOSPC) raised at
the Python write of an export and of a download. scripts/full_disk.py runs the same writes on
a real, small tmpfs."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.services import atomic_write, download_manager, verified_transfer
from app.services.chat_store import ChatStore, ChatStoreError, StreamWriter
from app.services.download_jobs import DONE, FAILED, read_jobs
from app.services.download_manager import DownloadManager
from app.services.hub import HubClient
from engine import files  # where the atomic write lives (app.services.atomic_write uses it)
from engine.rag.indexer import index_collection
from engine.rag.search import keyword
from engine.rag.store import RagStore, StoreError
from tests.engine.rag.helpers import DIM, CountingEmbedder, word_count
from tests.hub_emulator import HubEmulator, running_hub

BIG = "lorem ipsum dolor " * 20_000  # ~360 KB: needs many new pages


def no_room(db: Any) -> None:
    """The database may not grow past the pages it has (SQLite answers SQLITE_FULL)."""
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")


def room(db: Any) -> None:
    db.execute("PRAGMA max_page_count = 1073741823")


def one_line(message: str) -> bool:
    return bool(message) and "\n" not in message and "Traceback" not in message


# -- the chat history -----------------------------------------------------------------------


def test_a_full_disk_while_a_chat_is_stored(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    conv = store.create_conversation("kept")
    q = store.add_message(conv.id, "user", "What is a lighthouse?")
    a = store.add_message(conv.id, "assistant", "A tower with a light.", parent_id=q.id)
    reply = store.add_message(conv.id, "assistant", "", parent_id=q.id, status="streaming")
    writer = StreamWriter(store, reply.id, interval_s=0.0)
    writer.append("The first words are saved. ")

    no_room(store._db)
    with pytest.raises(ChatStoreError) as new_message:
        store.add_message(conv.id, "user", BIG, parent_id=a.id)
    with pytest.raises(ChatStoreError) as streamed:
        writer.append(BIG)  # the streamed answer grows past the room left
    for e in (new_message, streamed):
        assert one_line(str(e.value)), e.value
        assert "disk is full" in str(e.value), e.value

    # What was stored before is whole, seen from another connection too.
    with ChatStore(path) as other:
        assert other.message(q.id).content == "What is a lighthouse?"
        assert other.message(a.id).content == "A tower with a light."
        assert other.message(reply.id).content == "The first words are saved. "
        assert other.message(reply.id).status == "streaming"
        assert other._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    # Space again: the same store writes (no transaction was left open by the failure).
    room(store._db)
    writer.finish()
    assert store.message(reply.id).content.endswith(BIG)
    store.add_message(conv.id, "user", "And now?", parent_id=a.id)
    store.close()


# -- an export ------------------------------------------------------------------------------


class FillingFile(io.RawIOBase):
    """A file on a disk with `room` bytes left: writes past it fail with ENOSPC."""

    def __init__(self, fd: int, room: int) -> None:
        self.fd, self.room = fd, room

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        if len(data) > self.room:
            if self.room:
                os.write(self.fd, data[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return os.write(self.fd, data)

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()


@pytest.mark.parametrize("where", ["write", "fsync"])
def test_a_full_disk_while_an_export_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    target = tmp_path / "chats.json"
    target.write_text('{"conversations": ["the export made yesterday"]}')
    before = target.read_bytes()
    if where == "write":
        monkeypatch.setattr(
            files.os, "fdopen", lambda fd, mode: io.BufferedWriter(FillingFile(fd, 1000))
        )
    else:  # a disk that reports it at the flush (delayed allocation, a network disk)

        def fsync(fd: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(files.os, "fsync", fsync)
    with pytest.raises(OSError) as e:
        atomic_write.write_text_atomic(target, BIG)
    assert e.value.errno == errno.ENOSPC
    assert target.read_bytes() == before  # the old export is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chats.json"]  # no .part left


def test_the_chats_export_command_says_the_disk_is_full_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main
    from app.services.paths import AppPaths

    with ChatStore(AppPaths.default().data / "chats.sqlite3") as store:
        conv = store.create_conversation("kept")
        store.add_message(conv.id, "user", BIG)
    target = tmp_path / "out.json"

    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", fsync)
    assert main(["chats", "export", "--output", str(target)]) == 2
    err = capsys.readouterr().err
    assert one_line(err.strip()) and "No space left on device" in err, err
    assert not list(tmp_path.iterdir())


# -- a download -----------------------------------------------------------------------------

REPO = "someone/tiny-GGUF"
KEPT = "kept-Q8_0.gguf"
NEW = "new-Q8_0.gguf"


@pytest.fixture
def hub() -> Iterator[HubEmulator]:
    with running_hub() as emu:
        r = emu.repo(REPO)
        r.add(KEPT, data=b"GGUF" + bytes(range(256)) * 300)
        r.add(NEW, data=b"GGUF" + bytes(range(255, -1, -1)) * 400)
        yield emu


def test_a_full_disk_while_a_download_is_written(
    hub: HubEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, state = tmp_path / "hf", tmp_path / "downloads.json"

    heard: dict[str, str] = {}

    def manager() -> DownloadManager:
        return DownloadManager(
            state,
            HubClient(hub.url),
            cache_dir=cache,
            chunk_size=4096,
            retry_delay=0.01,
            on_change=lambda j: heard.__setitem__(j.filename, j.status),
        )

    dm = manager()
    try:
        kept = dm.wait(dm.add(REPO, KEPT).id, 60)
        assert kept is not None and kept.status == DONE, kept
        # The list is saved after the job is marked done (on the download thread): wait for
        # the saved state, or the full disk below refuses that save and it reads "queued".
        end = time.monotonic() + 60
        while {j.filename: j.status for j in read_jobs(state)} != {KEPT: DONE}:
            assert time.monotonic() < end, read_jobs(state)
            time.sleep(0.01)
        kept_path = Path(kept.path or "")
        kept_bytes = kept_path.read_bytes()

        real_open, full = open, [True]

        def filling_open(file: Any, mode: str = "r", *a: Any, **kw: Any) -> Any:
            if "a" in mode and full[0]:  # the part file: 40,000 bytes left on the disk
                return io.BufferedWriter(
                    FillingFile(
                        os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666), 40_000
                    )
                )
            return real_open(file, mode, *a, **kw)

        def filling_save(path: Path, jobs: Any) -> None:
            if full[0]:  # the list of downloads cannot be saved either
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_save(path, jobs)

        real_save = download_manager.write_jobs
        monkeypatch.setattr(verified_transfer, "open", filling_open, raising=False)
        monkeypatch.setattr(download_manager, "write_jobs", filling_save)
        job = dm.add(REPO, NEW)
        # The listener hears of the failure, though the list could not be saved.
        end = time.monotonic() + 60
        while heard.get(NEW) != FAILED and time.monotonic() < end:
            time.sleep(0.01)
        assert heard.get(NEW) == FAILED, heard
        job = dm.get(job.id)
    finally:
        dm.close()  # saves the list: refused too, and says nothing
    assert job is not None and job.status == FAILED, job
    assert one_line(job.error or "") and "disk is full" in (job.error or ""), job.error
    # Nothing half-written looks whole: no blob under its hash, only the part file.
    blob = job.blob
    assert blob is not None
    assert not [p for p in cache.rglob(blob) if not p.name.endswith(".incomplete")]
    parts = list(cache.rglob("*.incomplete"))
    assert len(parts) == 1 and parts[0].stat().st_size <= 40_000
    # The download made before is whole, and still listed.
    assert kept_path.read_bytes() == kept_bytes
    assert hashlib.sha256(kept_bytes).hexdigest() == kept.blob
    # The list on disk is the last one saved before the disk was full: the kept download.
    assert {j.filename: j.status for j in read_jobs(state)} == {KEPT: DONE}

    # Space again: the same download finishes, verified.
    full[0] = False
    dm = manager()
    try:
        job = dm.add(REPO, NEW)  # the list did not keep it: asked for again, it resumes
        done = dm.wait(job.id, 60)
    finally:
        dm.close()
    assert done is not None and done.status == DONE, done
    assert hashlib.sha256(Path(done.path or "").read_bytes()).hexdigest() == done.blob


# -- a documents index ----------------------------------------------------------------------


def test_a_full_disk_while_documents_are_indexed(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("The lighthouse keeper climbs the stairs every evening.")
    store = RagStore(tmp_path / "index.sqlite3")
    store.create_collection("notes", [docs], model_name="bow", model_path="bow", dim=DIM)
    embed = CountingEmbedder()
    index_collection(store, "notes", embed, word_count)
    assert store.counts("notes").indexed == 1

    (docs / "b.txt").write_text(BIG)
    no_room(store._db)
    with pytest.raises(StoreError) as e:
        index_collection(store, "notes", embed, word_count)
    assert one_line(str(e.value)) and "disk is full" in str(e.value), e.value

    # The file indexed before is whole and found; the new one is not half there.
    with RagStore(tmp_path / "index.sqlite3") as other:
        counts = other.counts("notes")
        assert (counts.indexed, counts.chunks, counts.vectors) == (1, 1, 1)
        assert other.paths("notes") == [(docs / "a.txt").resolve()]
        other.check("notes")
        assert [h.path.name for h in keyword(other, "notes", "lighthouse", 5)] == ["a.txt"]

    # Space again: the next run indexes the new file.
    room(store._db)
    report = index_collection(store, "notes", embed, word_count)
    assert report.added == 1 and store.counts("notes").indexed == 2
    store.check("notes")
    store.close()
