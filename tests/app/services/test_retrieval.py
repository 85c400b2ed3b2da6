"""The chat's searches over its collections (app/services/retrieval.py), on a real index with
the hashed bag of words as the embedding model: the model loaded once per file and kept, the
hits of several collections ranked together, and each failure a user can cause as one line.
With the test reranker (untrained: its order means nothing, the tests check that the hits
follow its scores)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.services.embedding_models import EmbeddingModels
from app.services.retrieval import RetrievalError, Retriever
from engine.rag.indexer import index_collection
from engine.rag.search import hybrid
from engine.rag.store import RagStore
from tests.engine.rag.helpers import DIM, bow_vector, word_count


class Bow:
    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim
        self.closed = False

    def embed(self, text: str) -> list[float]:
        return bow_vector(text, self.dim)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def index(tmp_path: Path) -> Path:
    model = tmp_path / "bow.gguf"
    model.write_bytes(b"GGUF")
    db = tmp_path / "documents.sqlite3"
    with RagStore(db) as store:
        for name, text in (
            ("lamps", "The lamp burns whale oil every night."),
            ("bells", "The fog bell rings when fog rolls in."),
        ):
            folder = tmp_path / name
            folder.mkdir()
            (folder / f"{name}.txt").write_text(text, encoding="utf-8")
            store.create_collection(
                name, [folder], model_name="bow", model_path=str(model), dim=DIM
            )
            index_collection(store, name, lambda ts: [bow_vector(t) for t in ts], word_count)
    return db


def test_the_model_is_loaded_once_and_the_collections_ranked_together(index: Path) -> None:
    loads: list[Path] = []
    models: list[Bow] = []

    def load(path: Path) -> Bow:
        loads.append(path)
        models.append(Bow())
        return models[-1]

    r = Retriever(lambda: RagStore(index), load=load)
    assert r.names() == ["bells", "lamps"]
    hits = r.search(["lamps", "bells"], "what does the fog bell do", 2)
    assert [h.path.name for h in hits] == ["bells.txt", "lamps.txt"]
    assert r.search(["lamps"], "oil", 5)[0].path.name == "lamps.txt"
    assert len(loads) == 1 and r.loaded == loads  # one file, one load, kept
    r.close()
    assert models[0].closed and r.loaded == []
    with pytest.raises(RetrievalError, match="shutting down"):
        r.search(["lamps"], "oil", 5)


def test_failures_are_one_line(index: Path, tmp_path: Path) -> None:
    r = Retriever(lambda: RagStore(index), load=lambda _p: Bow())
    with pytest.raises(RetrievalError, match=r"^the chat's collection 'attic' is gone"):
        r.search(["attic"], "oil", 5)
    wrong = Retriever(lambda: RagStore(index), load=lambda _p: Bow(dim=8))
    with pytest.raises(RetrievalError, match="gives 8 values, its index holds 64"):
        wrong.search(["lamps"], "oil", 5)

    def broken(_path: Path) -> Bow:
        raise ValueError("not a GGUF file (bad magic)")

    with pytest.raises(RetrievalError, match="of 'lamps' cannot be loaded: not a GGUF file"):
        Retriever(lambda: RagStore(index), load=broken).search(["lamps"], "oil", 5)
    (tmp_path / "bow.gguf").unlink()
    with pytest.raises(RetrievalError, match="embedding model of 'lamps' is gone"):
        Retriever(lambda: RagStore(index), load=lambda _p: Bow()).search(["lamps"], "x", 5)
    for e in (r, wrong):
        e.close()


# Two collections of short notes that share words with the question in different amounts, so
# the fusion ranks them and the (untrained, test) reranker re-sorts them its own way.
NOTES = {
    "lamps": [
        "The lamp burns whale oil every night in the tower.",
        "A keeper trims the lamp and cleans its glass at dusk.",
        "Oil for the lamp comes by boat once a month.",
        "The tower stands on a rock above the harbour.",
        "Storms break the glass of the lamp room in winter.",
    ],
    "bells": [
        "The fog bell rings when fog rolls in at night.",
        "A keeper winds the bell's clockwork every four hours.",
        "Ships hear the bell before they see the lamp.",
        "The bell was cast in bronze and weighs a ton.",
    ],
}
QUESTION = "what does the keeper do with the lamp at night"


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    model = tmp_path / "bow.gguf"
    model.write_bytes(b"GGUF")
    db = tmp_path / "notes.sqlite3"
    with RagStore(db) as store:
        for name, texts in NOTES.items():
            folder = tmp_path / name
            folder.mkdir()
            for i, text in enumerate(texts):
                (folder / f"{name}{i}.txt").write_text(text, encoding="utf-8")
            store.create_collection(
                name, [folder], model_name="bow", model_path=str(model), dim=DIM
            )
            index_collection(store, name, lambda ts: [bow_vector(t) for t in ts], word_count)
    return db


def test_a_reranker_re_sorts_the_fused_candidates(notes: Path, reranker_path: Path) -> None:
    models = EmbeddingModels(n_threads=2)
    r = Retriever(lambda: RagStore(notes), models=models, load=lambda _p: Bow())
    try:
        both = ["lamps", "bells"]
        # Without a reranker: the fused hits, as before (scores of reciprocal rank fusion).
        plain = r.search(both, QUESTION, 3)
        with RagStore(notes) as store:
            fused = [
                h for name in both for h in hybrid(store, name, QUESTION, bow_vector(QUESTION), 3)
            ]
        assert plain == sorted(fused, key=lambda h: -h.score)[:3]
        assert models.loaded == []  # nothing for the reranker yet

        # With one: the fused best 5 (candidates), scored by the reranker, the best 3 kept.
        candidates = r.search(both, QUESTION, 5)
        scores = models.get(reranker_path).rerank(QUESTION, [h.text for h in candidates])
        expected = sorted(zip(scores, candidates, strict=True), key=lambda p: -p[0])[:3]
        got = r.search(both, QUESTION, 3, reranker=reranker_path, candidates=5)
        assert [h.chunk_id for h in got] == [h.chunk_id for _s, h in expected]
        assert [h.score for h in got] == [s for s, _h in expected]
        assert [h.chunk_id for h in got] != [h.chunk_id for h in candidates[:3]]  # re-sorted
        # The default: 20 candidates, here every note.
        every = r.search(both, QUESTION, len(NOTES["lamps"]) + len(NOTES["bells"]))
        all_scores = models.get(reranker_path).rerank(QUESTION, [h.text for h in every])
        best = sorted(zip(all_scores, every, strict=True), key=lambda p: -p[0])[:2]
        got = r.search(both, QUESTION, 2, reranker=reranker_path)
        assert [h.chunk_id for h in got] == [h.chunk_id for _s, h in best]
        assert models.loaded == [reranker_path.resolve()]  # loaded once, shared
    finally:
        r.close()
        models.close()


def test_a_reranker_that_cannot_be_used_is_one_line(
    notes: Path, tmp_path: Path, reranker_path: Path, minilm_path: Path, smollm2_path: Path
) -> None:
    r = Retriever(lambda: RagStore(notes), load=lambda _p: Bow())
    try:
        with pytest.raises(RetrievalError, match=r"is an embedding model, not a reranker"):
            r.search(["lamps"], "oil", 2, reranker=minilm_path)
        with pytest.raises(RetrievalError, match=r"is a text generator, not a reranker"):
            r.search(["lamps"], "oil", 2, reranker=smollm2_path)
        broken = tmp_path / "broken.gguf"
        broken.write_bytes(b"not a gguf at all")
        with pytest.raises(RetrievalError, match=r"^the reranker broken.gguf cannot be loaded"):
            r.search(["lamps"], "oil", 2, reranker=broken)
        copy = tmp_path / "rerank-copy.gguf"
        shutil.copyfile(reranker_path, copy)
        assert len(r.search(["lamps"], "oil", 2, reranker=copy)) == 2
        copy.unlink()  # deleted from the library after its first use
        with pytest.raises(RetrievalError, match=r"^the reranker is gone: .*rerank-copy.gguf$"):
            r.search(["lamps"], "oil", 2, reranker=copy)
    finally:
        r.close()
