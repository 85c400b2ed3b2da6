"""Searching a chat's collections for a question: the chat's side of the documents index.

Each collection was embedded by its own model (the collection records its path); that model
is loaded the first time a question needs it and kept (app.services.embedding_models, shared
with the Documents tab's indexing), so a chat's second question costs a search, not a load.

With a reranker, the fused best `max(k, candidates)` passages over the collections are scored
by it (each paired with the question) and the best `k` of those are returned: the hits keep
their fields, with `score` now the reranker's raw score (higher is better; grounding and the
citations go by the order, not by the score). The reranker comes from the same shared models.

Calls may come from any thread, one at a time (a lock): the chat asks from a background
thread, never from the GUI thread. Every failure a user can cause (a collection removed, its
model file moved, an index the app cannot open) is a `RetrievalError` with one line.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from app.services.documents import open_documents
from app.services.embedding_models import EmbeddingModels, LoadedEmbedding
from engine.errors import EngineError
from engine.model.facts import model_facts
from engine.model.gguf import read_gguf
from engine.rag.search import Hit, hybrid
from engine.rag.store import RagStore, StoreError

MAX_QUERY_CHARS = 1000  # a pasted page is searched by its start
# The fused passages a reranker scores: each is one decode-sized pair, so this is the cost a
# search adds (at least `k` are always scored).
RERANK_CANDIDATES = 20

OpenIndex = Callable[[], AbstractContextManager[RagStore]]


class RetrievalError(EngineError):
    """The chat's collections cannot be searched; `str()` is one line for the user."""


class Embedding(Protocol):
    """A collection's embedding model, as search uses it."""

    def embed(self, text: str) -> list[float]: ...

    def close(self) -> None: ...


# Loads the embedding model of a file (a test or another app part may bring its own).
LoadEmbedding = Callable[[Path], Embedding]


class Reranker(Protocol):
    """Scores passages for a question (app.services.embedding_models.LoadedEmbedding)."""

    def rerank(self, query: str, texts: Sequence[str]) -> list[float]: ...


def check_reranker(path: Path) -> None:
    """RetrievalError with one line unless `path` is a reranker GGUF (read from its header:
    nothing is loaded)."""
    if not path.exists():
        raise RetrievalError(f"the reranker is gone: {path}")
    try:
        facts = model_facts(read_gguf(path))
    except (EngineError, ValueError, OSError) as e:  # a GGUF problem is a ValueError
        raise RetrievalError(f"the reranker {path.name} cannot be loaded: {e}") from None
    if not facts.is_reranker:
        kind = "an embedding model" if facts.embedding_only else "a text generator"
        raise RetrievalError(
            f"{path.name} is {kind}, not a reranker (its file does not pool by rank)"
        )


def reranked(reranker: Reranker, query: str, hits: Sequence[Hit]) -> list[tuple[float, Hit]]:
    """`hits` with the reranker's score of each, best first (ties keep the fused order)."""
    try:
        scores = reranker.rerank(query, [h.text for h in hits]) if hits else []
    except EngineError as e:
        raise RetrievalError(f"the reranker cannot score the passages: {e}") from None
    order = sorted(range(len(hits)), key=lambda i: -scores[i])
    return [(scores[i], hits[i]) for i in order]


class _SharedEmbedding:
    """A collection's model from the app's shared ones (freed by them, not by search)."""

    def __init__(self, model: LoadedEmbedding) -> None:
        self.model = model

    def embed(self, text: str) -> list[float]:
        return self.model.embed_query(text)

    def close(self) -> None:
        pass


class Retriever:
    """Hybrid search over collections, with their embedding models loaded once."""

    def __init__(
        self,
        index: OpenIndex = open_documents,
        *,
        models: EmbeddingModels | None = None,
        load: LoadEmbedding | None = None,
    ) -> None:
        """`models`: the app's embedding models, shared with the Documents tab (a new set
        when None); `load`: another way to load a collection's model."""
        self._open = index
        shared = self._shared = models or EmbeddingModels()
        # Models it made itself are its to free; the app's shared ones are the app's.
        self._owned = shared if models is None else None
        self._load: LoadEmbedding = load or (lambda path: _SharedEmbedding(shared.get(path)))
        self._models: dict[Path, Embedding] = {}
        self._rerankers: dict[Path, Reranker] = {}
        self._lock = threading.Lock()
        self._closed = False

    def names(self) -> list[str]:
        """The collections in the index ([] when there is no index to read)."""
        try:
            with self._open() as store:
                return [c.name for c in store.collections()]
        except (EngineError, OSError):
            return []

    def search(
        self,
        collections: Sequence[str],
        query: str,
        k: int,
        *,
        reranker: Path | None = None,
        candidates: int = RERANK_CANDIDATES,
    ) -> list[Hit]:
        """The best `k` passages for `query` over `collections`, best first: by reciprocal
        rank fusion scores (which compare across collections), or with `reranker` (a GGUF
        path) the fused best `max(k, candidates)` re-sorted by its scores."""
        query = " ".join(query.split())[:MAX_QUERY_CHARS]
        depth = max(k, candidates) if reranker is not None else k
        with self._lock:
            if self._closed:
                raise RetrievalError("documents are closed (the app is shutting down)")
            # Loaded before the search: a reranker that cannot be used fails it at once.
            scorer = self._reranker(reranker) if reranker is not None else None
            try:
                with self._open() as store:
                    hits: list[Hit] = []
                    for name in collections:
                        hits += self._search_one(store, name, query, depth)
            except StoreError as e:
                raise RetrievalError(str(e)) from None
            except OSError as e:
                raise RetrievalError(f"the documents index cannot be read: {e}") from None
            hits.sort(key=lambda h: -h.score)
            if scorer is None:
                return hits[:k]
            best = reranked(scorer, query, hits[:depth])[:k]
        return [replace(h, score=score) for score, h in best]

    def _reranker(self, path: Path) -> Reranker:
        key = path.resolve()
        r = self._rerankers.get(key)
        if r is not None:
            if not key.exists():  # deleted from the library since: say so, as a new load would
                check_reranker(key)
            return r
        check_reranker(key)
        try:
            r = self._rerankers[key] = self._shared.get(key)
        except (EngineError, ValueError, OSError) as err:
            raise RetrievalError(f"the reranker {path.name} cannot be loaded: {err}") from None
        return r

    def _search_one(self, store: RagStore, name: str, query: str, k: int) -> list[Hit]:
        try:
            col = store.collection(name)
        except StoreError:
            raise RetrievalError(
                f"the chat's collection '{name}' is gone: untick it in Chat settings"
            ) from None
        q = self._embedding(Path(col.model_path), name).embed(query)
        if len(q) != col.dim:
            raise RetrievalError(
                f"the embedding model of '{name}' gives {len(q)} values, its index holds "
                f"{col.dim}: run `candlewick docs index {name}` after re-adding it"
            )
        return hybrid(store, name, query, q, k)

    def _embedding(self, path: Path, collection: str) -> Embedding:
        e = self._models.get(path)
        if e is not None:
            return e
        if not path.exists():
            raise RetrievalError(
                f"the embedding model of '{collection}' is gone: {path} (add the collection "
                "again with --embedding-model MODEL --reembed)"
            )
        try:
            e = self._models[path] = self._load(path)
        except (EngineError, ValueError, OSError) as err:  # a GGUF problem is a ValueError
            raise RetrievalError(
                f"the embedding model of '{collection}' cannot be loaded: {err}"
            ) from None
        return e

    @property
    def loaded(self) -> list[Path]:
        """The embedding models kept loaded."""
        with self._lock:
            return list(self._models)

    def close(self) -> None:
        """Free the models; a later search is refused."""
        with self._lock:
            self._closed = True
            models, self._models = list(self._models.values()), {}
            self._rerankers = {}  # the shared models' to free
        for m in models:
            m.close()
        if self._owned is not None:
            self._owned.close()


__all__ = [
    "RERANK_CANDIDATES",
    "Embedding",
    "LoadEmbedding",
    "Reranker",
    "RetrievalError",
    "Retriever",
    "check_reranker",
    "reranked",
]
