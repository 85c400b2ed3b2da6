"""Bringing a collection's index up to date with its folders: new and changed files are
extracted, chunked and embedded, unchanged ones are not read, files that are gone are dropped.

Each file is committed on its own (`RagStore.replace_file`), so indexing is resumable: after a
crash or a kill, running it again finds the committed files unchanged and redoes only the one
that was in flight. Cancelling stops between files, or between two embedding batches of a big
file, which then stays as the index had it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.rag.chunking import Chunk, chunk
from engine.rag.extract import ExtractError, extract
from engine.rag.files import Found, Skipped, walk
from engine.rag.store import NO_TEXT, FileState, RagStore, StoreError

Embed = Callable[[list[str]], list[list[float]]]
# One call of `embed` takes at most this many chunks and tokens: the embedder packs them into
# as few decodes as it can, and a cancel waits for one call at most (a few seconds on a CPU).
EMBED_BATCH = 32
EMBED_BATCH_TOKENS = 2048


@dataclass(frozen=True)
class IndexProgress:
    files_done: int
    files_total: int
    chunks: int  # chunks embedded so far in this run
    eta_seconds: float | None  # None until a changed file has been indexed
    path: Path | None  # the file just finished


@dataclass
class IndexReport:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    chunks: int = 0
    seconds: float = 0.0
    cancelled: bool = False


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _same_stat(state: FileState | None, found: Found) -> bool:
    return state is not None and state.size == found.size and state.mtime_ns == found.mtime_ns


class _Eta:
    """Seconds left, from the bytes of changed files indexed so far and the time they took
    (unchanged files cost nothing, so counting files would mislead)."""

    def __init__(self, bytes_to_do: int) -> None:
        self.left = bytes_to_do
        self.done = 0
        self.busy = 0.0

    def add(self, size: int, seconds: float) -> None:
        self.done += size
        self.left = max(0, self.left - size)
        self.busy += seconds

    def seconds(self) -> float | None:
        if self.done == 0:
            return None
        return self.busy / self.done * self.left


def index_collection(
    store: RagStore,
    name: str,
    embed: Embed,
    count_tokens: Callable[[str], int],
    *,
    progress: Callable[[IndexProgress], None] | None = None,
    cancel: threading.Event | None = None,
    pause: Callable[[], None] | None = None,
    max_tokens: int = 200,
    overlap_tokens: int = 32,
) -> IndexReport:
    """`pause`, when given, is called before every embedding batch and may block (the desktop
    holds indexing there while the chat answers: both on the same cores halve the chat)."""
    t0 = time.monotonic()
    if pause is not None:
        embed = _paused(embed, pause, cancel)
    report = IndexReport()
    col = store.collection(name)
    entries = list(walk(col.roots))
    found = [e for e in entries if isinstance(e, Found)]
    walk_skipped = [e for e in entries if isinstance(e, Skipped)]

    for s in walk_skipped:
        store.mark_skipped(name, s.path, s.reason)
        report.skipped.append((s.path, s.reason))
    # The walk is complete, so what it did not see is gone (except below unreadable folders).
    report.removed = len(
        store.remove_missing(
            name,
            [f.path for f in found] + [s.path for s in walk_skipped],
            keep_under=[s.path for s in walk_skipped],
        )
    )

    states = {f.path: store.file_state(name, f.path) for f in found}
    eta = _Eta(sum(f.size for f in found if not _same_stat(states[f.path], f)))
    for done, f in enumerate(found):
        if cancel is not None and cancel.is_set():
            report.cancelled = True
            break
        state = states[f.path]
        started = time.monotonic()
        try:
            outcome = _index_one(
                store, name, f, state, embed, count_tokens, max_tokens, overlap_tokens, cancel
            )
        except _Cancelled:
            report.cancelled = True  # this file's chunks were not stored: the next run redoes it
            break
        if isinstance(outcome, str):
            report.skipped.append((f.path, outcome))
        elif outcome is None:
            report.unchanged += 1
        else:
            report.chunks += outcome
            if state is not None and state.status == "indexed":
                report.updated += 1
            else:
                report.added += 1
        if not _same_stat(state, f):
            eta.add(f.size, time.monotonic() - started)
        if progress is not None:
            progress(IndexProgress(done + 1, len(found), report.chunks, eta.seconds(), f.path))
    report.seconds = time.monotonic() - t0
    return report


def _index_one(
    store: RagStore,
    name: str,
    f: Found,
    state: FileState | None,
    embed: Embed,
    count_tokens: Callable[[str], int],
    max_tokens: int,
    overlap_tokens: int,
    cancel: threading.Event | None,
) -> int | str | None:
    """The number of chunks stored, why the file was skipped, or None: its content is what
    the index holds."""
    if state is not None and _same_stat(state, f):
        return state.skip_reason if state.status == "skipped" and state.skip_reason else None
    try:
        sha = sha256_of(f.path)
    except OSError as e:
        return _skip(store, name, f, _read_error(e))
    if state is not None and state.sha256 == sha:
        # Touched, not changed: record the new stat so the next run need not hash it again.
        store.touch_file(name, f)
        return state.skip_reason if state.status == "skipped" and state.skip_reason else None
    try:
        doc = extract(f.path)
    except ExtractError as e:
        # A file indexed before keeps its chunks (mark_skipped only records the reason).
        return _skip(store, name, f, str(e))
    chunks = chunk(doc, count_tokens, max_tokens=max_tokens, overlap_tokens=overlap_tokens)
    vectors = _embed_all(embed, chunks, cancel)
    store.replace_file(name, f, sha, chunks, vectors)
    return len(chunks) if chunks else NO_TEXT


def _read_error(e: OSError) -> str:
    if isinstance(e, FileNotFoundError):
        return "file disappeared"
    if isinstance(e, PermissionError):
        return "permission denied"
    return f"cannot read ({e.strerror or type(e).__name__})"


def _skip(store: RagStore, name: str, f: Found, reason: str) -> str:
    store.mark_skipped(name, f.path, reason, found=f)
    return reason


class _Cancelled(Exception):
    pass


def _paused(embed: Embed, pause: Callable[[], None], cancel: threading.Event | None) -> Embed:
    """`embed` that first waits on `pause`; a cancel during the wait abandons the file."""

    def gated(texts: list[str]) -> list[list[float]]:
        pause()
        if cancel is not None and cancel.is_set():
            raise _Cancelled
        return embed(texts)

    return gated


def _embed_all(
    embed: Embed, chunks: Sequence[Chunk], cancel: threading.Event | None
) -> list[list[float]]:
    """The chunks' vectors, in batches; a cancel between two batches abandons the file (a big
    file would otherwise hold the cancel for as long as it takes to embed)."""
    vectors: list[list[float]] = []
    for batch in _batches(chunks):
        if cancel is not None and cancel.is_set():
            raise _Cancelled
        got = embed(batch)
        if len(got) != len(batch):
            raise StoreError(f"the embedder returned {len(got)} vectors for {len(batch)} texts")
        vectors.extend(got)
    return vectors


def _batches(chunks: Sequence[Chunk]) -> Iterator[list[str]]:
    """Consecutive chunks' texts, at most EMBED_BATCH of them and EMBED_BATCH_TOKENS tokens
    a batch (a chunk bigger than that alone)."""
    batch: list[str] = []
    tokens = 0
    for c in chunks:
        if batch and (len(batch) >= EMBED_BATCH or tokens + c.n_tokens > EMBED_BATCH_TOKENS):
            yield batch
            batch, tokens = [], 0
        batch.append(c.text)
        tokens += c.n_tokens
    if batch:
        yield batch
