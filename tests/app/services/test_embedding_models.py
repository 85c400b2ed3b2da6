"""One loaded copy of an embedding model for the whole app: the chat's searches and the
Documents tab's indexing get the same one."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from app.services.embedding_models import EmbeddingModels, LoadedEmbedding
from app.services.retrieval import Retriever
from app.ui.index_job import embedding_loader
from engine.errors import EngineError
from engine.host.runtime import Model
from engine.rag.store import RagStore


class Loads:
    def __init__(self) -> None:
        self.paths: list[Path] = []
        self.closed: list[Path] = []

    def __call__(self, path: Path) -> LoadedEmbedding:
        self.paths.append(path)
        model = LoadedEmbedding.__new__(LoadedEmbedding)  # no llama.cpp: what get() hands out
        model.path = path
        # What the host holds for it: a model of that file.
        model.model = cast(Model, SimpleNamespace(path=path))
        model.close = lambda: self.closed.append(path)  # type: ignore[method-assign]
        return model


def test_a_file_is_loaded_once_whoever_asks_and_freed_at_close(tmp_path: Path) -> None:
    gguf = tmp_path / "minilm.gguf"
    gguf.write_bytes(b"GGUF")
    loads = Loads()
    models = EmbeddingModels(load=loads)
    got: list[LoadedEmbedding] = []
    threads = [threading.Thread(target=lambda: got.append(models.get(gguf))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Another spelling of the same file is the same model.
    got.append(models.get(tmp_path / "." / "minilm.gguf"))
    assert loads.paths == [gguf.resolve()]
    assert all(m is got[0] for m in got)
    assert models.loaded == [gguf.resolve()]
    models.close()
    assert loads.closed == [gguf.resolve()]
    with pytest.raises(EngineError, match="closed"):
        models.get(gguf)


def test_the_chat_and_the_documents_tab_share_one_copy(minilm_path: Path, tmp_path: Path) -> None:
    index = tmp_path / "documents.sqlite3"
    with RagStore(index) as store:
        store.create_collection(
            "notes", [tmp_path], model_name="MiniLM", model_path=str(minilm_path), dim=384
        )
        col = store.collection("notes")
    models = EmbeddingModels()
    try:
        for_indexing = embedding_loader(models)(col)
        retriever = Retriever(lambda: RagStore(index), models=models)
        assert retriever.search(["notes"], "what is a lighthouse", 3) == []  # nothing indexed
        assert models.loaded == [minilm_path.resolve()]
        vectors = for_indexing.embed(["a lighthouse keeper", "the storm"])
        assert len(vectors) == 2 and len(vectors[0]) == 384
        for_indexing.close()  # the indexing run ends: the model stays for the chat
        retriever.close()
        assert models.loaded == [minilm_path.resolve()]
    finally:
        models.close()
    assert models.loaded == []


PASSAGES = [
    "A lighthouse keeper trims the lamp's wick every evening.",
    "Bread is baked from flour, water, salt and yeast.",
    "The fog bell rings when fog rolls in from the sea.",
]


def test_a_reranker_scores_as_its_embedder_does_and_a_long_text_is_cut(
    reranker_path: Path,
) -> None:
    model = LoadedEmbedding(reranker_path, n_threads=2, first_loads=None)
    try:
        assert model.is_reranker
        question = "who looks after the lamp?"
        expected = [score for score, _n in model.embedder.rerank(question, PASSAGES)]
        assert model.rerank(question, PASSAGES) == expected
        assert len(set(expected)) == 3  # three texts, three scores: not a constant
        # A text whose pair is longer than the context fails the engine; here it is scored
        # by as much of its start as fits, so what follows that start changes nothing.
        long = " ".join(f"word{i}" for i in range(400))
        with pytest.raises(EngineError, match="reranking takes at most"):
            model.embedder.rerank(question, [long])
        [cut] = model.rerank(question, [long])
        assert model.rerank(question, [long + " and a different ending"]) == [cut]
        assert model.rerank(question * 60, PASSAGES[:1])  # a long question: its start
    finally:
        model.close()


def test_an_embedding_model_does_not_rerank(minilm_path: Path) -> None:
    model = LoadedEmbedding(minilm_path, n_threads=2, first_loads=None)
    try:
        assert not model.is_reranker and model.dim == 384
        with pytest.raises(EngineError, match="not a reranking model"):
            model.rerank("a question", PASSAGES)
    finally:
        model.close()
