"""The index of a document collection in one SQLite file: collections, their files, the files'
chunks, one vector per chunk and a full-text (FTS5) index over the chunk text.

Vectors are float32 BLOBs, L2-normalised when stored, and searched with numpy by brute force
(exact cosine). The `sqlite-vec` extension would do this inside SQLite, but many Pythons
(macOS's among them) build `sqlite3` without `enable_load_extension`, so it cannot be relied
on; a matrix of 10,000 x 384 float32 is 15 MB and a search over it takes about 2 ms on a
CPU core (benchmarks/rag_search.py measures it).

One file's row, chunks and vectors are written in one transaction: a crash loses at most the
file being written, never half of one.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from engine.errors import EngineError
from engine.rag.chunking import Chunk
from engine.rag.files import Found

SCHEMA_VERSION = 1
FileStatus = Literal["indexed", "skipped"]
NO_TEXT = "no text found"

_SCHEMA = """
CREATE TABLE collections (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    roots TEXT NOT NULL,               -- JSON list of folder or file paths
    model_name TEXT NOT NULL,
    model_path TEXT NOT NULL,
    dim INTEGER NOT NULL CHECK (dim > 0),
    created REAL NOT NULL
);
CREATE TABLE files (
    id INTEGER PRIMARY KEY,
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    size INTEGER,                      -- NULL for a file the walk skipped without a stat
    mtime_ns INTEGER,
    sha256 TEXT,
    status TEXT NOT NULL CHECK (status IN ('indexed', 'skipped')),
    skip_reason TEXT,                  -- on an indexed file: why its latest version was not
    indexed_at REAL NOT NULL,
    UNIQUE (collection_id, path)
);
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    text TEXT NOT NULL,
    page INTEGER,
    heading TEXT,
    start INTEGER NOT NULL,
    "end" INTEGER NOT NULL,
    n_tokens INTEGER NOT NULL,
    UNIQUE (file_id, ordinal)
);
CREATE TABLE vectors (
    chunk_id INTEGER PRIMARY KEY REFERENCES chunks(id) ON DELETE CASCADE,
    vector BLOB NOT NULL               -- float32, L2-normalised, collections.dim values
);
CREATE VIRTUAL TABLE chunks_fts USING fts5(
    text, content='chunks', content_rowid='id',
    tokenize='unicode61 remove_diacritics 2'
);
-- External content: the FTS index follows the chunks table through these triggers (foreign-key
-- cascades fire them too).
CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TRIGGER chunks_au AFTER UPDATE OF text ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text);
END;
"""


class StoreError(EngineError):
    """The index cannot be used as asked; `str()` is one line for the user."""


@dataclass(frozen=True)
class Collection:
    id: int
    name: str
    roots: tuple[Path, ...]
    model_name: str
    model_path: str
    dim: int
    created: float


class FileState(NamedTuple):
    """What the index holds about a file: enough to tell whether it changed."""

    size: int | None
    mtime_ns: int | None
    sha256: str | None
    status: FileStatus
    skip_reason: str | None


@dataclass(frozen=True)
class Counts:
    files: int
    indexed: int
    skipped: int
    chunks: int
    vectors: int


@dataclass(frozen=True)
class StoredChunk:
    """A chunk as search returns it: its text, where it came from, its span."""

    id: int
    path: Path
    ordinal: int
    text: str
    page: int | None
    heading: str | None
    start: int
    end: int
    n_tokens: int


@dataclass(frozen=True)
class VectorMatrix:
    """A collection's vectors: row i is the chunk `chunk_ids[i]`."""

    chunk_ids: npt.NDArray[np.int64]
    matrix: npt.NDArray[np.float32]


def normalised(
    vector: Sequence[float] | npt.NDArray[np.float32], dim: int
) -> npt.NDArray[np.float32]:
    v = np.asarray(vector, dtype=np.float32)
    if v.shape != (dim,):
        raise StoreError(f"a vector has {v.size} values; this collection's model makes {dim}")
    norm = float(np.linalg.norm(v))
    if not np.isfinite(norm) or norm == 0.0:
        raise StoreError("the embedding model returned a zero or non-finite vector")
    return v / norm


class RagStore:
    """The index file. Safe to share between threads (one connection behind a lock); other
    processes may write the same file (WAL), and the vector cache notices their commits."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(
            str(path), check_same_thread=False, isolation_level=None, timeout=30.0
        )
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        try:
            self._migrate()
        except BaseException:
            self._db.close()
            raise
        # collection id -> (our change counter, sqlite data_version, the matrix)
        self._vectors: dict[int, tuple[int, int, VectorMatrix]] = {}
        self._changes = 0

    def _migrate(self) -> None:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path.name} was written by a newer Candlewick (index schema "
                f"{version}; this version reads up to {SCHEMA_VERSION})"
            )
        if version == 0:
            with self._transaction():
                self._db.executescript(
                    "BEGIN;" + _SCHEMA + f"PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
                )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> RagStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    class _Tx:
        def __init__(self, store: RagStore, immediate: bool) -> None:
            self.store, self.immediate = store, immediate

        def __enter__(self) -> sqlite3.Connection:
            self.store._lock.acquire()
            if self.immediate:
                self.store._db.execute("BEGIN IMMEDIATE")
            return self.store._db

        def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
            db = self.store._db
            try:
                if not self.immediate:
                    return
                try:
                    if exc is None:
                        db.execute("COMMIT")
                finally:
                    # After SQLITE_FULL or an I/O error SQLite may have rolled back already:
                    # a second ROLLBACK would hide the real error.
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    self.store._changes += 1
            except sqlite3.OperationalError as e:
                raise StoreError(self.store._write_failed(e)) from None
            finally:
                self.store._lock.release()
            # A write that failed on a full disk, an I/O error, a locked file: one line, and
            # the index as it was before the transaction.
            if isinstance(exc, sqlite3.OperationalError):
                raise StoreError(self.store._write_failed(exc)) from None

    def _write_failed(self, e: sqlite3.OperationalError) -> str:
        if getattr(e, "sqlite_errorname", "") == "SQLITE_FULL":
            return (
                f"the disk is full: the documents index ({self.path}) was not changed; "
                "free some space and index again"
            )
        return f"the documents index ({self.path}) cannot be written: {e}"

    def _transaction(self, *, immediate: bool = False) -> RagStore._Tx:
        return RagStore._Tx(self, immediate)

    # Collections

    def create_collection(
        self, name: str, roots: Sequence[Path], *, model_name: str, model_path: str, dim: int
    ) -> Collection:
        if not name.strip():
            raise StoreError("a collection needs a name")
        roots_json = json.dumps([str(Path(r).expanduser().resolve()) for r in roots])
        with self._transaction(immediate=True) as db:
            try:
                db.execute(
                    "INSERT INTO collections(name, roots, model_name, model_path, dim, "
                    "created) VALUES (?, ?, ?, ?, ?, ?)",
                    (name, roots_json, model_name, model_path, dim, time.time()),
                )
            except sqlite3.IntegrityError:
                raise StoreError(f"a collection named {name!r} already exists") from None
        return self.collection(name)

    def collection(self, name: str) -> Collection:
        with self._lock:
            row = self._db.execute(
                "SELECT id, name, roots, model_name, model_path, dim, "
                "created FROM collections WHERE name = ?",
                (name,),
            ).fetchone()
        if row is None:
            raise StoreError(f"there is no collection named {name!r}")
        return _collection(row)

    def collections(self) -> list[Collection]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, name, roots, model_name, model_path, dim, "
                "created FROM collections ORDER BY name"
            ).fetchall()
        return [_collection(r) for r in rows]

    def set_roots(self, name: str, roots: Sequence[Path]) -> Collection:
        """The collection's folders and files from now on; the next index adds what is new and
        drops what is no longer under them."""
        cid = self.collection(name).id
        roots_json = json.dumps([str(Path(r).expanduser().resolve()) for r in roots])
        with self._transaction(immediate=True) as db:
            db.execute("UPDATE collections SET roots = ? WHERE id = ?", (roots_json, cid))
        return self.collection(name)

    def set_model(self, name: str, *, model_name: str, model_path: str, dim: int) -> Collection:
        """Another embedding model for the collection: its vectors no longer compare with the
        new model's, so its files are forgotten and the next index embeds them all again."""
        cid = self.collection(name).id
        with self._transaction(immediate=True) as db:
            db.execute(
                "UPDATE collections SET model_name = ?, model_path = ?, dim = ? WHERE id = ?",
                (model_name, model_path, dim, cid),
            )
            db.execute("DELETE FROM files WHERE collection_id = ?", (cid,))
        self._vectors.pop(cid, None)
        return self.collection(name)

    def last_indexed(self, name: str) -> float | None:
        """When a file of the collection was last indexed (a Unix time), None before any."""
        cid = self.collection(name).id
        with self._lock:
            row = self._db.execute(
                "SELECT max(indexed_at) FROM files WHERE collection_id = ?", (cid,)
            ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def remove_collection(self, name: str) -> None:
        cid = self.collection(name).id
        with self._transaction(immediate=True) as db:
            db.execute("DELETE FROM collections WHERE id = ?", (cid,))
        self._vectors.pop(cid, None)

    # Files

    def file_state(self, name: str, path: Path) -> FileState | None:
        cid = self.collection(name).id
        with self._lock:
            row = self._db.execute(
                "SELECT size, mtime_ns, sha256, status, skip_reason FROM files "
                "WHERE collection_id = ? AND path = ?",
                (cid, str(path)),
            ).fetchone()
        return None if row is None else FileState(*row)

    def replace_file(
        self,
        name: str,
        found: Found,
        sha256: str,
        chunks: Sequence[Chunk],
        vectors: Sequence[Sequence[float]],
    ) -> None:
        """The file's new version: its row, chunks and vectors replace the old ones at once.
        A file without chunks is recorded as skipped ("no text found")."""
        col = self.collection(name)
        if len(vectors) != len(chunks):
            raise StoreError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        blobs = [normalised(v, col.dim).tobytes() for v in vectors]
        status, reason = ("indexed", None) if chunks else ("skipped", NO_TEXT)
        with self._transaction(immediate=True) as db:
            # Deleting the row cascades to its chunks, their vectors and (triggers) FTS rows.
            db.execute(
                "DELETE FROM files WHERE collection_id = ? AND path = ?", (col.id, str(found.path))
            )
            cur = db.execute(
                "INSERT INTO files(collection_id, path, size, mtime_ns, sha256, status, "
                "skip_reason, indexed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    col.id,
                    str(found.path),
                    found.size,
                    found.mtime_ns,
                    sha256,
                    status,
                    reason,
                    time.time(),
                ),
            )
            file_id = cur.lastrowid
            for ordinal, (c, blob) in enumerate(zip(chunks, blobs, strict=True)):
                cur = db.execute(
                    'INSERT INTO chunks(file_id, ordinal, text, page, heading, start, "end", '
                    "n_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (file_id, ordinal, c.text, c.page, c.heading, c.start, c.end, c.n_tokens),
                )
                db.execute(
                    "INSERT INTO vectors(chunk_id, vector) VALUES (?, ?)", (cur.lastrowid, blob)
                )

    def touch_file(self, name: str, found: Found) -> None:
        """The file's content is what the index holds (same sha256); only its stat moved."""
        cid = self.collection(name).id
        with self._transaction(immediate=True) as db:
            db.execute(
                "UPDATE files SET size = ?, mtime_ns = ? WHERE collection_id = ? AND path = ?",
                (found.size, found.mtime_ns, cid, str(found.path)),
            )

    def mark_skipped(
        self, name: str, path: Path, reason: str, *, found: Found | None = None
    ) -> None:
        """Record why `path` was passed over. A file indexed before keeps its chunks and its
        recorded stat (so the next run tries the new version again); only the reason is set."""
        cid = self.collection(name).id
        with self._transaction(immediate=True) as db:
            row = db.execute(
                "SELECT status FROM files WHERE collection_id = ? AND path = ?", (cid, str(path))
            ).fetchone()
            if row is not None and row[0] == "indexed":
                db.execute(
                    "UPDATE files SET skip_reason = ? WHERE collection_id = ? AND path = ?",
                    (reason, cid, str(path)),
                )
                return
            size = found.size if found else None
            mtime_ns = found.mtime_ns if found else None
            db.execute(
                "INSERT INTO files(collection_id, path, size, mtime_ns, sha256, status, "
                "skip_reason, indexed_at) VALUES (?, ?, ?, ?, NULL, 'skipped', ?, ?) "
                "ON CONFLICT (collection_id, path) DO UPDATE SET size = excluded.size, "
                "mtime_ns = excluded.mtime_ns, skip_reason = excluded.skip_reason, "
                "indexed_at = excluded.indexed_at",
                (cid, str(path), size, mtime_ns, reason, time.time()),
            )

    def paths(self, name: str) -> list[Path]:
        cid = self.collection(name).id
        with self._lock:
            rows = self._db.execute(
                "SELECT path FROM files WHERE collection_id = ? ORDER BY path", (cid,)
            ).fetchall()
        return [Path(r[0]) for r in rows]

    def skipped(self, name: str) -> list[tuple[Path, str]]:
        """The files passed over and why, by path (what `counts().skipped` counts)."""
        cid = self.collection(name).id
        with self._lock:
            rows = self._db.execute(
                "SELECT path, coalesce(skip_reason, '') FROM files WHERE collection_id = ? "
                "AND status = 'skipped' ORDER BY path",
                (cid,),
            ).fetchall()
        return [(Path(p), str(why)) for p, why in rows]

    def remove_missing(
        self, name: str, seen: Iterable[Path], *, keep_under: Iterable[Path] = ()
    ) -> list[Path]:
        """Drop the files the walk did not see, except those under `keep_under` (folders the
        walk could not read this time: an unreadable folder is not a deleted one)."""
        seen_set = {str(p) for p in seen}
        keep = [Path(p) for p in keep_under]
        gone = [
            p
            for p in self.paths(name)
            if str(p) not in seen_set and not any(p == k or k in p.parents for k in keep)
        ]
        if gone:
            cid = self.collection(name).id
            with self._transaction(immediate=True) as db:
                db.executemany(
                    "DELETE FROM files WHERE collection_id = ? AND path = ?",
                    [(cid, str(p)) for p in gone],
                )
        return gone

    def counts(self, name: str) -> Counts:
        cid = self.collection(name).id
        with self._lock:
            files, indexed = self._db.execute(
                "SELECT count(*), coalesce(sum(status = 'indexed'), 0) FROM files "
                "WHERE collection_id = ?",
                (cid,),
            ).fetchone()
            chunks, vectors = self._db.execute(
                "SELECT count(c.id), count(v.chunk_id) FROM chunks c JOIN files f "
                "ON f.id = c.file_id LEFT JOIN vectors v ON v.chunk_id = c.id "
                "WHERE f.collection_id = ?",
                (cid,),
            ).fetchone()
        return Counts(
            files=files, indexed=indexed, skipped=files - indexed, chunks=chunks, vectors=vectors
        )

    # Reading for search

    def chunks(self, ids: Sequence[int]) -> dict[int, StoredChunk]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        with self._lock:
            rows = self._db.execute(
                'SELECT c.id, f.path, c.ordinal, c.text, c.page, c.heading, c.start, c."end", '
                f"c.n_tokens FROM chunks c JOIN files f ON f.id = c.file_id WHERE c.id IN "
                f"({marks})",
                list(ids),
            ).fetchall()
        return {r[0]: StoredChunk(r[0], Path(r[1]), *r[2:]) for r in rows}

    def fts(self, name: str, expression: str, k: int) -> list[tuple[int, float]]:
        """(chunk id, bm25) of the best `k` matches of an FTS5 expression, best first (bm25
        is lower for a better match)."""
        cid = self.collection(name).id
        with self._lock:
            rows = self._db.execute(
                "SELECT chunks_fts.rowid, bm25(chunks_fts) AS score FROM chunks_fts "
                "JOIN chunks c ON c.id = chunks_fts.rowid JOIN files f ON f.id = c.file_id "
                "WHERE chunks_fts MATCH ? AND f.collection_id = ? ORDER BY score LIMIT ?",
                (expression, cid, k),
            ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def match_counts(self, expressions: Sequence[str]) -> tuple[int, list[int]]:
        """The FTS index's row count and how many rows match each FTS5 expression, over every
        collection: the N and n of the idf that FTS5's bm25 computes."""
        with self._lock:
            total = int(self._db.execute("SELECT count(*) FROM chunks").fetchone()[0])
            counts = [
                int(
                    self._db.execute(
                        "SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH ?", (e,)
                    ).fetchone()[0]
                )
                for e in expressions
            ]
        return total, counts

    def vectors(self, name: str) -> VectorMatrix:
        """The collection's vectors as one matrix, loaded once and kept until this store or
        another connection commits a change."""
        col = self.collection(name)
        with self._lock:
            version = int(self._db.execute("PRAGMA data_version").fetchone()[0])
            cached = self._vectors.get(col.id)
            if cached and cached[0] == self._changes and cached[1] == version:
                return cached[2]
            rows = self._db.execute(
                "SELECT v.chunk_id, v.vector FROM vectors v JOIN chunks c ON c.id = v.chunk_id "
                "JOIN files f ON f.id = c.file_id WHERE f.collection_id = ? ORDER BY v.chunk_id",
                (col.id,),
            ).fetchall()
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            # One copy of all the BLOBs, then a view: no per-row array.
            flat = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32)
            vm = VectorMatrix(ids, flat.reshape(len(rows), col.dim))
            self._vectors[col.id] = (self._changes, version, vm)
        return vm

    def check(self, name: str) -> None:
        """Raise unless the FTS index and the vectors match the chunks exactly (for tests and
        a repair command)."""
        cid = self.collection(name).id
        with self._lock:
            self._db.execute(
                "INSERT INTO chunks_fts(chunks_fts, rank) VALUES ('integrity-check', 1)"
            )
            missing = self._db.execute(
                "SELECT count(*) FROM chunks c JOIN files f ON f.id = c.file_id LEFT JOIN "
                "vectors v ON v.chunk_id = c.id WHERE f.collection_id = ? AND v.chunk_id IS "
                "NULL",
                (cid,),
            ).fetchone()[0]
        if missing:
            raise StoreError(f"{missing} chunks have no vector")


def _collection(row: tuple[int, str, str, str, str, int, float]) -> Collection:
    cid, name, roots, model_name, model_path, dim, created = row
    return Collection(
        cid, name, tuple(Path(r) for r in json.loads(roots)), model_name, model_path, dim, created
    )
