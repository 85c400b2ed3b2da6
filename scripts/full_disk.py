"""A full disk, for real: a chat, an export, a download and a documents index written to a small
tmpfs that is filled up while they write.

    sudo .venv/bin/python scripts/full_disk.py [--size-mib 8]

Linux, as root (it mounts a tmpfs in a temporary folder and unmounts it at the end). For each
of the four writers: something is stored first, the disk is filled (a filler file written until
ENOSPC, or up to a few bytes short of it), the write is tried, then the checks: the error is
one line (the message a person sees), what was stored before is whole and readable, nothing
half-written is left under a name that looks whole, and once the filler is deleted the same
writer works again. Prints one block per writer; exit status 1 when a check failed, 2 when
no tmpfs could be mounted (the test suite's tests/app/services/test_full_disk.py injects the
same faults without root).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.services.atomic_write import write_text_atomic  # noqa: E402
from app.services.chat_store import ChatStore, ChatStoreError, StreamWriter  # noqa: E402
from app.services.download_jobs import DONE, FAILED, read_jobs  # noqa: E402
from app.services.download_manager import DownloadManager  # noqa: E402
from app.services.hub import HubClient  # noqa: E402
from engine.errors import EngineError  # noqa: E402
from engine.rag.indexer import index_collection  # noqa: E402
from engine.rag.store import RagStore  # noqa: E402
from tests.engine.rag.helpers import DIM, CountingEmbedder, word_count  # noqa: E402
from tests.hub_emulator import running_hub  # noqa: E402

MiB = 1024 * 1024
WRITERS = ("chat", "export", "download", "index")
FILLER = "filler.bin"


@contextlib.contextmanager
def tmpfs(size_mib: int) -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="candlewick-full-disk-"))
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        where.rmdir()
        raise SystemExit(f"cannot mount a tmpfs (root needed): {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)
        where.rmdir()


def fill(disk: Path, leave: int = 0) -> int:
    """Fill the disk up to `leave` free bytes (0: until the kernel says ENOSPC)."""
    free = shutil.disk_usage(disk).free
    fd = os.open(disk / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    written, block = 0, b"\0" * 65536
    try:
        while shutil.disk_usage(disk).free > leave:
            want = min(len(block), shutil.disk_usage(disk).free - leave)
            written += os.write(fd, block[: max(want, 1)])
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return free - shutil.disk_usage(disk).free if written else 0


def unfill(disk: Path) -> None:
    (disk / FILLER).unlink(missing_ok=True)


class Checks:
    def __init__(self, name: str) -> None:
        self.name = name
        self.failed: list[str] = []
        self.lines: list[str] = []

    def note(self, text: str) -> None:
        self.lines.append(text)

    def expect(self, ok: bool, what: str) -> None:
        self.lines.append(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            self.failed.append(what)

    def one_line(self, message: str, what: str) -> None:
        self.note(f"message: {message}")
        self.expect(bool(message) and "\n" not in message.strip(), f"{what} is one line")


def chat(disk: Path) -> Checks:
    c = Checks("chat history (SQLite, WAL)")
    path = disk / "chats.sqlite3"
    store = ChatStore(path)
    conv = store.create_conversation("kept")
    q = store.add_message(conv.id, "user", "What is a lighthouse?")
    a = store.add_message(conv.id, "assistant", "A tower with a light.", parent_id=q.id)
    reply = store.add_message(conv.id, "assistant", "", parent_id=q.id, status="streaming")
    writer = StreamWriter(store, reply.id, interval_s=0.0)
    writer.append("The first words are saved. ")
    fill(disk, leave=128 * 1024)  # room for some of the answer, not for all of it
    error = ""
    written, committed = 0, writer.text
    try:
        for _ in range(2000):  # an answer streaming in, a flush per piece
            writer.append("and the keeper climbs the stairs again " * 20)
            written, committed = written + 1, writer.text
        store.add_message(conv.id, "user", "x" * 200_000, parent_id=a.id)
    except ChatStoreError as e:
        error = str(e)
    except sqlite3.Error as e:
        error = f"{type(e).__name__}: {e}"
        c.expect(False, f"the store raised {type(e).__name__}, not ChatStoreError")
    c.note(f"pieces streamed before the disk was full: {written}")
    c.one_line(error, "the error")
    c.expect("disk is full" in error, "the error says the disk is full")
    with ChatStore(path) as other:
        c.expect(
            other.message(q.id).content == "What is a lighthouse?"
            and other.message(a.id).content == "A tower with a light.",
            "the messages stored before are whole",
        )
        saved = other.message(reply.id).content
        c.expect(saved == committed, f"the answer as last saved ({len(saved)} characters)")
        ok = other._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        c.expect(ok, "PRAGMA integrity_check: ok")
    unfill(disk)
    try:
        writer.finish()
        store.add_message(conv.id, "user", "And now?", parent_id=a.id)
        c.expect(True, "writes again once space is freed")
    except (ChatStoreError, sqlite3.Error) as e:
        c.expect(False, f"writes again once space is freed ({e})")
    store.close()
    return c


def export(disk: Path, home: Path) -> Checks:
    c = Checks("export (atomic file write)")
    target = disk / "chats.json"
    target.write_text('{"conversations": ["the export made yesterday"]}')
    before = target.read_bytes()
    fill(disk, leave=4096)
    try:
        write_text_atomic(target, "x" * 300_000)
        c.expect(False, "the write failed")
    except OSError as e:
        c.expect(e.errno == errno.ENOSPC, f"write_text_atomic raised ENOSPC ({e.strerror})")
    c.expect(target.read_bytes() == before, "the export made before is untouched")
    left = sorted(p.name for p in disk.iterdir() if p.name != FILLER)
    c.expect(left == ["chats.json", "chats.sqlite3"] or left == ["chats.json"], f"files: {left}")
    # Through the command line: a store with a long chat, exported onto the full disk.
    with ChatStore(home / "data" / "chats.sqlite3") as store:
        conv = store.create_conversation("long")
        store.add_message(conv.id, "user", "y" * 300_000)
    out = disk / "out.json"
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "chats", "export", "--output", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, CANDLEWICK_HOME=str(home)),
        timeout=120,
    )
    c.expect(r.returncode == 2, f"`candlewick chats export` exit status {r.returncode}")
    c.one_line(r.stderr.strip(), "its error")
    c.expect(not out.exists(), "no out.json")
    parts = [p.name for p in disk.iterdir() if p.name.endswith((".part", ".tmp"))]
    c.expect(not parts, f"no partial file left ({parts})")
    unfill(disk)
    write_text_atomic(target, "after")
    c.expect(target.read_text() == "after", "writes again once space is freed")
    return c


def download(disk: Path) -> Checks:
    c = Checks("download (verified transfer into the HF cache)")
    cache, state = disk / "hf", disk / "downloads.json"
    kept_data = b"GGUF" + bytes(range(256)) * 1000
    new_data = b"GGUF" + os.urandom(3 * MiB)
    with running_hub() as hub:
        repo = hub.repo("someone/tiny-GGUF")
        repo.add("kept-Q8_0.gguf", data=kept_data)
        repo.add("new-Q8_0.gguf", data=new_data)

        def manager(space: Callable[[Path], int]) -> DownloadManager:
            return DownloadManager(
                state, HubClient(hub.url), cache_dir=cache, free_space=space, retry_delay=0.01
            )

        # The space check passes (the disk filled after it), so the transfer meets ENOSPC.
        dm = manager(lambda p: 1 << 40)
        try:
            kept = dm.wait(dm.add("someone/tiny-GGUF", "kept-Q8_0.gguf").id, 60)
            assert kept is not None and kept.status == DONE, kept
            fill(disk, leave=1 * MiB)
            job = dm.wait(dm.add("someone/tiny-GGUF", "new-Q8_0.gguf").id, 60)
        finally:
            dm.close()
        assert job is not None
        c.expect(job.status == FAILED, f"the job failed ({job.status})")
        c.one_line(job.error or "", "the job's error")
        c.expect("disk is full" in (job.error or ""), "the error says the disk is full")
        blob = job.blob or "?"
        whole = [p for p in cache.rglob(blob) if not p.name.endswith(".incomplete")]
        c.expect(not whole, "no blob under its hash (only the .incomplete part)")
        parts = list(cache.rglob("*.incomplete"))
        c.note(f"part file kept for the resume: {sum(p.stat().st_size for p in parts)} bytes")
        kept_path = Path(kept.path or "")
        ok = hashlib.sha256(kept_path.read_bytes()).hexdigest() == kept.blob
        c.expect(ok, "the download made before is whole (SHA-256)")
        try:
            jobs = {j.filename: j.status for j in read_jobs(state)}
            c.expect(jobs.get("kept-Q8_0.gguf") == DONE, f"the jobs file is readable: {jobs}")
        except Exception as e:
            c.expect(False, f"the jobs file is readable ({type(e).__name__}: {e})")
        tmp = [p.name for p in disk.iterdir() if p.name.endswith(".tmp")]
        c.expect(not tmp, f"no partial jobs file left ({tmp})")
        unfill(disk)
        dm = manager(lambda p: 1 << 40)
        try:
            dm.resume(job.id)
            done = dm.wait(job.id, 60)
        finally:
            dm.close()
        c.expect(done is not None and done.status == DONE, "resumes once space is freed")
    return c


def index(disk: Path, work: Path) -> Checks:
    c = Checks("documents index (SQLite, WAL)")
    docs = work / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("The lighthouse keeper climbs the stairs every evening.")
    store = RagStore(disk / "index.sqlite3")
    store.create_collection("notes", [docs], model_name="bow", model_path="bow", dim=DIM)
    embed = CountingEmbedder()
    index_collection(store, "notes", embed, word_count)
    for i in range(20):
        (docs / f"b{i}.txt").write_text(f"page {i} " + "words of a long report " * 1000)
    fill(disk, leave=64 * 1024)
    error = ""
    try:
        index_collection(store, "notes", embed, word_count)
    except EngineError as e:
        error = str(e)
    except sqlite3.Error as e:
        error = f"{type(e).__name__}: {e}"
        c.expect(False, f"the index raised {type(e).__name__}, not StoreError")
    c.one_line(error, "the error")
    c.expect("disk is full" in error, "the error says the disk is full")
    with RagStore(disk / "index.sqlite3") as other:
        counts = other.counts("notes")
        c.note(f"files indexed before the disk was full: {counts.indexed}")
        try:
            other.check("notes")
            c.expect(True, "the index is consistent (chunks, vectors, FTS)")
        except EngineError as e:
            c.expect(False, f"the index is consistent ({e})")
        ok = counts.chunks == counts.vectors and str((docs / "a.txt").resolve()) in map(
            str, other.paths("notes")
        )
        c.expect(ok, "the file indexed before is there, one vector per chunk")
    unfill(disk)
    try:
        report = index_collection(store, "notes", embed, word_count)
        c.expect(store.counts("notes").indexed == 21, f"indexes again ({report.added} added)")
    except (EngineError, sqlite3.Error) as e:
        c.expect(False, f"indexes again once space is freed ({e})")
    store.close()
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=8)
    ap.add_argument("--only", choices=WRITERS, action="append", help="one writer (repeatable)")
    args = ap.parse_args()
    results: list[Checks] = []
    with tempfile.TemporaryDirectory(prefix="candlewick-full-disk-home-") as h:
        home = Path(h)
        for name in args.only or WRITERS:
            with tmpfs(args.size_mib) as disk:
                work = home / name
                work.mkdir()
                if name == "chat":
                    results.append(chat(disk))
                elif name == "export":
                    results.append(export(disk, work))
                elif name == "download":
                    results.append(download(disk))
                else:
                    results.append(index(disk, work))
    for c in results:
        print(f"{c.name}:")
        for line in c.lines:
            print(f"  {line}")
    failed = [f"{c.name}: {f}" for c in results for f in c.failed]
    print("ok" if not failed else f"{len(failed)} check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
