"""The document index in SQLite: collections, one transaction per file, the FTS index and the
vectors following the chunks, skipped files keeping what was indexed, the schema version."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.rag.store import NO_TEXT, SCHEMA_VERSION, RagStore, StoreError
from tests.engine.rag.helpers import DIM, bow_vector, found, make_chunks


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RagStore]:
    with RagStore(tmp_path / "index.db") as s:
        s.create_collection(
            "notes", [tmp_path / "docs"], model_name="fake", model_path="fake", dim=DIM
        )
        yield s


def put(
    store: RagStore, path: Path, texts: list[str], *, mtime_ns: int = 1, sha: str = "s1"
) -> None:
    store.replace_file(
        "notes",
        found(path, mtime_ns=mtime_ns),
        sha,
        make_chunks(texts),
        [bow_vector(t) for t in texts],
    )


def fts_rows(store: RagStore) -> int:
    return int(store._db.execute("SELECT count(*) FROM chunks_fts").fetchone()[0])


def test_collections(tmp_path: Path, store: RagStore) -> None:
    col = store.collection("notes")
    assert col.roots == ((tmp_path / "docs").resolve(),) and col.dim == DIM
    with pytest.raises(StoreError, match="already exists"):
        store.create_collection("notes", [], model_name="m", model_path="p", dim=3)
    store.create_collection("more", [], model_name="m", model_path="p", dim=3)
    assert [c.name for c in store.collections()] == ["more", "notes"]
    put(store, tmp_path / "a.txt", ["alpha beta"])
    store.remove_collection("notes")
    assert [c.name for c in store.collections()] == ["more"]
    with pytest.raises(StoreError, match="no collection named 'notes'"):
        store.collection("notes")
    assert store._db.execute("SELECT count(*) FROM chunks").fetchone()[0] == 0
    assert fts_rows(store) == 0


def test_replacing_a_file_replaces_its_chunks_vectors_and_fts_rows(
    tmp_path: Path, store: RagStore
) -> None:
    a = tmp_path / "a.txt"
    put(store, a, ["the quick brown fox", "jumps over the lazy dog"])
    assert store.file_state("notes", a) == (10, 1, "s1", "indexed", None)
    assert store.fts("notes", '"fox"', 5) != []
    put(store, a, ["an entirely new text"], mtime_ns=2, sha="s2")
    c = store.counts("notes")
    assert (c.files, c.indexed, c.chunks, c.vectors) == (1, 1, 1, 1)
    assert store.fts("notes", '"fox"', 5) == [] and len(store.fts("notes", '"new"', 5)) == 1
    assert fts_rows(store) == 1
    store.check("notes")


def test_vectors_are_normalised_and_checked(tmp_path: Path, store: RagStore) -> None:
    put(store, tmp_path / "a.txt", ["one two", "three"])
    vm = store.vectors("notes")
    assert vm.matrix.shape == (2, DIM) and vm.matrix.dtype == np.float32
    assert np.allclose(np.linalg.norm(vm.matrix, axis=1), 1.0)
    with pytest.raises(StoreError, match="3 values; this collection's model makes 64"):
        store.replace_file(
            "notes", found(tmp_path / "b.txt"), "s", make_chunks(["x"]), [[1.0, 2.0, 3.0]]
        )
    with pytest.raises(StoreError, match="zero"):
        store.replace_file(
            "notes", found(tmp_path / "b.txt"), "s", make_chunks(["x"]), [[0.0] * DIM]
        )


def test_a_failed_write_leaves_the_old_version_whole(tmp_path: Path, store: RagStore) -> None:
    a = tmp_path / "a.txt"
    put(store, a, ["kept text"])
    # A bad vector is refused before anything is written: the old version stays.
    with pytest.raises(StoreError):
        store.replace_file(
            "notes",
            found(a, mtime_ns=2),
            "s2",
            make_chunks(["new", "newer"]),
            [bow_vector("new"), [0.0] * DIM],
        )
    assert store.file_state("notes", a) == (10, 1, "s1", "indexed", None)
    assert [r[0] for r in store._db.execute("SELECT text FROM chunks")] == ["kept text"]

    # A failure inside the transaction (a constraint, here) rolls the whole file back.
    store._db.execute(
        "CREATE TEMP TRIGGER fail AFTER INSERT ON main.chunks "
        "WHEN new.ordinal = 1 BEGIN SELECT raise(ABORT, 'disk full'); END"
    )
    with pytest.raises(sqlite3.IntegrityError, match="disk full"):
        put(store, a, ["first", "second"], mtime_ns=3, sha="s3")
    assert store.file_state("notes", a) == (10, 1, "s1", "indexed", None)
    assert [r[0] for r in store._db.execute("SELECT text FROM chunks")] == ["kept text"]
    assert fts_rows(store) == 1
    store.check("notes")


def test_skipped_files_keep_what_was_indexed(tmp_path: Path, store: RagStore) -> None:
    a, b = tmp_path / "a.pdf", tmp_path / "b.pdf"
    put(store, a, ["indexed before"])
    store.mark_skipped("notes", a, "encrypted PDF", found=found(a, mtime_ns=9))
    # The chunks stay, and so does the recorded stat: the next run tries the new version.
    assert store.file_state("notes", a) == (10, 1, "s1", "indexed", "encrypted PDF")
    assert store.counts("notes").chunks == 1
    store.mark_skipped("notes", b, "encrypted PDF", found=found(b, mtime_ns=9))
    assert store.file_state("notes", b) == (10, 9, None, "skipped", "encrypted PDF")
    store.mark_skipped("notes", b, "permission denied")
    assert store.file_state("notes", b) == (None, None, None, "skipped", "permission denied")
    # A file with no text is recorded as skipped with that reason.
    store.replace_file("notes", found(tmp_path / "c.pdf"), "s", [], [])
    assert store.file_state("notes", tmp_path / "c.pdf") == (10, 1, "s", "skipped", NO_TEXT)
    c = store.counts("notes")
    assert (c.files, c.indexed, c.skipped) == (3, 1, 2)


def test_remove_missing_spares_folders_that_could_not_be_read(
    tmp_path: Path, store: RagStore
) -> None:
    docs = tmp_path / "docs"
    for p in (docs / "a.txt", docs / "b.txt", docs / "locked" / "c.txt"):
        put(store, p, [p.name])
    gone = store.remove_missing("notes", [docs / "a.txt"], keep_under=[docs / "locked"])
    assert gone == [docs / "b.txt"]
    assert store.paths("notes") == [docs / "a.txt", docs / "locked" / "c.txt"]
    assert store.counts("notes").chunks == 2 and fts_rows(store) == 2


def test_the_vector_cache_follows_changes_from_any_connection(
    tmp_path: Path, store: RagStore
) -> None:
    put(store, tmp_path / "a.txt", ["one"])
    first = store.vectors("notes")
    assert store.vectors("notes") is first  # cached
    put(store, tmp_path / "b.txt", ["two"])
    assert len(store.vectors("notes").chunk_ids) == 2
    with RagStore(store.path) as other:  # another process's writes look like this
        other.replace_file(
            "notes", found(tmp_path / "c.txt"), "s", make_chunks(["three"]), [bow_vector("three")]
        )
    assert len(store.vectors("notes").chunk_ids) == 3


def test_a_newer_schema_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "index.db"
    RagStore(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(
        StoreError,
        match=f"written by a newer Candlewick .*schema "
        f"{SCHEMA_VERSION + 1}; this version reads up to "
        f"{SCHEMA_VERSION}",
    ):
        RagStore(path)
    RagStore(path.with_name("again.db")).close()  # a fresh file is created at the version


def test_reopening_keeps_everything(tmp_path: Path, store: RagStore) -> None:
    put(store, tmp_path / "a.txt", ["persisted"])
    store.close()
    with RagStore(store.path) as again:
        assert again.counts("notes").chunks == 1
        assert len(again.fts("notes", '"persisted"', 3)) == 1


def test_new_roots_keep_the_index_and_a_new_model_empties_it(
    tmp_path: Path, store: RagStore
) -> None:
    assert store.last_indexed("notes") is None
    put(store, tmp_path / "a.txt", ["alpha beta", "gamma"])
    first = store.last_indexed("notes")
    assert first is not None
    col = store.set_roots("notes", [tmp_path / "docs", tmp_path / "more"])
    assert col.roots == ((tmp_path / "docs").resolve(), (tmp_path / "more").resolve())
    assert store.counts("notes").chunks == 2  # more folders: nothing to embed again
    assert len(store.vectors("notes").chunk_ids) == 2
    col = store.set_model("notes", model_name="other", model_path="other.gguf", dim=8)
    assert (col.model_name, col.dim, col.roots[1]) == ("other", 8, (tmp_path / "more").resolve())
    # Vectors of two models do not compare: everything is embedded again, by the next index.
    assert (
        store.counts("notes").chunks == 0 and store.file_state("notes", tmp_path / "a.txt") is None
    )
    assert len(store.vectors("notes").chunk_ids) == 0 and fts_rows(store) == 0
    assert store.last_indexed("notes") is None
