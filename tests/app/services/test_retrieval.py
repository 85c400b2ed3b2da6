"""The chat's searches over its collections (app/services/retrieval.py), on a real index with
the hashed bag of words as the embedding model: the model loaded once per file and kept, the
hits of several collections ranked together, and each failure a user can cause as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.services.retrieval import RetrievalError, Retriever
from engine.rag.indexer import index_collection
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
