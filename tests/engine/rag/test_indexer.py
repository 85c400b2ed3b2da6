"""Indexing a folder: with the real MiniLM model over files of the Python language reference
(search finds the right topic; a re-index touches only what changed; a SIGKILL mid-file is
resumed by running again), and with the fake embedder for skips, cancel and progress."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from engine.host.runtime import Model
from engine.rag.files import Found, Skipped, walk
from engine.rag.indexer import (
    EMBED_BATCH,
    EMBED_BATCH_TOKENS,
    IndexProgress,
    index_collection,
)
from engine.rag.search import hybrid
from engine.rag.store import RagStore
from engine.server.embeddings import Embedder
from engine.settings import LoadParams
from tests.engine.rag.helpers import DIM, CountingEmbedder, topic_files, word_count

REPO = Path(__file__).resolve().parents[3]
N_TOPICS = 40


class MiniLM:
    """The model's embed and token count as the indexer takes them, counting embed calls."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.embedder = Embedder(model)
        self.calls = 0
        self.texts = 0
        self.dim = len(self.embedder.embed("dimension")[0])

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        self.texts += len(texts)
        return [v for v, _ in self.embedder.embed_many(texts)]

    def count_tokens(self, text: str) -> int:
        return len(self.model.tokenize(text, add_special=True, parse_special=False))


@pytest.fixture(scope="module")
def minilm(minilm_path: Path) -> Iterator[MiniLM]:
    with Model(minilm_path, LoadParams(n_ctx=512, n_threads=2)) as model:
        m = MiniLM(model)
        try:
            yield m
        finally:
            m.embedder.close()


def new_store(tmp_path: Path, docs: Path, dim: int, path: str = "") -> RagStore:
    store = RagStore(tmp_path / "index.db")
    store.create_collection("ref", [docs], model_name="all-MiniLM-L6-v2", model_path=path, dim=dim)
    return store


def chunk_rows(store: RagStore) -> list[tuple[str, int]]:
    return store._db.execute(
        "SELECT f.path, c.ordinal FROM chunks c JOIN files f ON f.id = c.file_id"
    ).fetchall()


@pytest.mark.slow
def test_index_search_and_reindex_only_what_changed(tmp_path: Path, minilm: MiniLM) -> None:
    docs = tmp_path / "docs"
    files = topic_files(docs, N_TOPICS)
    with new_store(tmp_path, docs, minilm.dim) as store:
        texts = minilm.texts  # the module's model may have embedded for other tests first
        report = index_collection(store, "ref", minilm.embed, minilm.count_tokens)
        assert (report.added, report.updated, report.unchanged, report.removed) == (
            N_TOPICS,
            0,
            0,
            0,
        )
        assert report.skipped == [] and not report.cancelled
        counts = store.counts("ref")
        assert counts.indexed == N_TOPICS and counts.chunks == counts.vectors == report.chunks
        assert minilm.texts - texts == report.chunks
        store.check("ref")

        questions = {
            "How do I write a small anonymous function inline?": "lambda",
            "Deleting a name binding with the del statement": "del",
            "Exponent in a floating point literal": "floating",
            "make a variable in a function refer to the module's global namespace": "global",
            "insert a debugging check into a program": "assert",
            "complex numbers with an imaginary part": "imaginary",
        }
        for question, topic in questions.items():
            q, _ = minilm.embedder.embed(question)
            hits = hybrid(store, "ref", question, q, 3)
            assert hits[0].path.stem == topic, (question, [h.path.name for h in hits])

        # One file edited, one deleted, one touched (same bytes, new mtime).
        edited, deleted, touched = files["integers"], files["break"], files["while"]
        edited.write_text(edited.read_text() + "\nA new paragraph about integer literals.\n")
        deleted.unlink()
        st = touched.stat()
        os.utime(touched, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        before = minilm.calls, minilm.texts
        again = index_collection(store, "ref", minilm.embed, minilm.count_tokens)
        assert (again.added, again.updated, again.unchanged, again.removed) == (
            0,
            1,
            N_TOPICS - 2,
            1,
        )
        edited_chunks = [r for r in chunk_rows(store) if r[0] == str(edited)]
        assert minilm.texts - before[1] == len(edited_chunks) == again.chunks
        assert minilm.calls - before[0] == -(-len(edited_chunks) // 32)  # batches of 32
        touched_state = store.file_state("ref", touched)
        assert touched_state is not None
        assert touched_state.mtime_ns == touched.stat().st_mtime_ns
        assert store.file_state("ref", deleted) is None
        store.check("ref")

        # Nothing changed: nothing is read or embedded.
        calls = minilm.calls
        third = index_collection(store, "ref", minilm.embed, minilm.count_tokens)
        assert third.unchanged == N_TOPICS - 1 and minilm.calls == calls


@pytest.mark.slow
def test_a_sigkill_mid_file_is_resumed_by_indexing_again(
    tmp_path: Path, minilm: MiniLM, minilm_path: Path
) -> None:
    docs = tmp_path / "docs"
    files = topic_files(docs, 12)
    new_store(tmp_path, docs, minilm.dim).close()
    kill_after = 5
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.engine.rag.helpers",
            str(tmp_path / "index.db"),
            "ref",
            str(minilm_path),
            str(kill_after),
        ],
        cwd=REPO,
        capture_output=True,
        timeout=240,
    )
    assert child.returncode == -9, child.stderr.decode()[-2000:]

    with RagStore(tmp_path / "index.db") as store:
        # The committed files are whole; the one in flight left nothing.
        assert store.counts("ref").indexed == kill_after
        store.check("ref")
        report = index_collection(store, "ref", minilm.embed, minilm.count_tokens)
        assert (report.added, report.unchanged) == (len(files) - kill_after, kill_after)
        rows = chunk_rows(store)
        assert len(rows) == len(set(rows))  # no chunk twice
        assert sorted({Path(p) for p, _ in rows}) == sorted(files.values())
        c = store.counts("ref")
        fts = store._db.execute("SELECT count(*) FROM chunks_fts").fetchone()[0]
        assert c.indexed == len(files) and c.chunks == c.vectors == fts == len(rows)
        store.check("ref")


# The fake embedder: no model.


def test_skips_keep_what_was_indexed_and_are_reported(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    good, bad = docs / "good.txt", docs / "report.txt"
    good.write_text("plain text that indexes")
    bad.write_bytes(b"\x00binary")
    embed = CountingEmbedder()
    with new_store(tmp_path, docs, DIM) as store:
        report = index_collection(store, "ref", embed, word_count)
        assert report.added == 1
        assert report.skipped == [(bad, "binary file with a text extension")]
        bad_state = store.file_state("ref", bad)
        assert bad_state is not None and bad_state.status == "skipped"
        # The good file breaks: its chunk stays, with the reason recorded.
        good.write_bytes(b"\x00" * 100)
        texts = len(embed.texts)
        second = index_collection(store, "ref", embed, word_count)
        assert dict(second.skipped) == {
            good: "binary file with a text extension",
            bad: "binary file with a text extension",
        }
        state = store.file_state("ref", good)
        assert state is not None and state.status == "indexed"
        assert state.skip_reason == "binary file with a text extension"
        assert store.counts("ref").chunks == 1 and len(embed.texts) == texts
        # Fixed again: indexed anew, the reason cleared.
        good.write_text("plain text again")
        third = index_collection(store, "ref", embed, word_count)
        fixed = store.file_state("ref", good)
        assert third.updated == 1 and fixed is not None and fixed.skip_reason is None


def test_progress_and_cancel_between_files(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    topic_files(docs, 6)
    cancel = threading.Event()
    seen: list[IndexProgress] = []

    def progress(p: IndexProgress) -> None:
        seen.append(p)
        if p.files_done == 2:
            cancel.set()

    with new_store(tmp_path, docs, DIM) as store:
        report = index_collection(
            store, "ref", CountingEmbedder(), word_count, progress=progress, cancel=cancel
        )
        assert report.cancelled and report.added == 2
        assert [p.files_done for p in seen] == [1, 2] and seen[0].files_total == 6
        assert seen[1].chunks == report.chunks and seen[1].eta_seconds is not None
        assert store.counts("ref").indexed == 2
        rest = index_collection(store, "ref", CountingEmbedder(), word_count)
        assert (rest.added, rest.unchanged, rest.cancelled) == (4, 2, False)


def test_a_cancel_inside_a_big_file_leaves_it_as_it_was(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    big = docs / "big.txt"
    big.write_text(" ".join(f"Sentence number {i} is here." for i in range(3000)))
    cancel = threading.Event()

    class CancelAfterOneBatch(CountingEmbedder):
        def __call__(self, texts: list[str]) -> list[list[float]]:
            cancel.set()
            return super().__call__(texts)

    with new_store(tmp_path, docs, DIM) as store:
        embed = CancelAfterOneBatch()
        report = index_collection(store, "ref", embed, word_count, cancel=cancel)
        assert report.cancelled and embed.calls == 1 and report.added == 0
        assert store.file_state("ref", big) is None and store.counts("ref").chunks == 0
        cancel.clear()
        done = index_collection(store, "ref", CountingEmbedder(), word_count)
        assert done.added == 1 and done.chunks > 32


def test_a_big_file_is_embedded_in_batches_bounded_by_tokens(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "big.txt").write_text(" ".join(f"Sentence number {i} is here." for i in range(3000)))
    sizes: list[tuple[int, int]] = []

    class Sizes(CountingEmbedder):
        def __call__(self, texts: list[str]) -> list[list[float]]:
            sizes.append((len(texts), sum(word_count(t) for t in texts)))
            return super().__call__(texts)

    with new_store(tmp_path, docs, DIM) as store:
        embed = Sizes()
        report = index_collection(store, "ref", embed, word_count, max_tokens=100)
        assert report.added == 1 and len(embed.texts) == report.chunks
        assert all(n <= EMBED_BATCH and tokens <= EMBED_BATCH_TOKENS for n, tokens in sizes)
        # Full batches: each but the last had no room for the next chunk (at most 100 tokens).
        assert len(sizes) > 2
        assert all(n == EMBED_BATCH or t > EMBED_BATCH_TOKENS - 100 for n, t in sizes[:-1])
        ids = _chunk_ids(store)
        stored = store.chunks(ids)
        assert embed.texts == [stored[i].text for i in ids]  # in order, each once


def _chunk_ids(store: RagStore) -> list[int]:
    return [r[0] for r in store._db.execute("SELECT id FROM chunks ORDER BY id").fetchall()]


def test_a_folder_that_cannot_be_read_keeps_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = tmp_path / "docs"
    (docs / "locked").mkdir(parents=True)
    (docs / "locked" / "a.txt").write_text("inside a folder that will be unreadable")
    (docs / "b.txt").write_text("outside")
    with new_store(tmp_path, docs, DIM) as store:
        assert index_collection(store, "ref", CountingEmbedder(), word_count).added == 2
        locked = (docs / "locked").resolve()

        def walk_locked(roots: Sequence[Path], **kw: int) -> Iterator[Found | Skipped]:
            yield Skipped(locked, "permission denied")
            yield from (
                e for e in walk(roots) if not (isinstance(e, Found) and locked in e.path.parents)
            )

        monkeypatch.setattr("engine.rag.indexer.walk", walk_locked)
        report = index_collection(store, "ref", CountingEmbedder(), word_count)
        assert report.removed == 0 and report.skipped == [(locked, "permission denied")]
        assert store.counts("ref").chunks == 2
