"""Searching a chat's collections for a question: the chat's side of the documents index.

Each collection was embedded by its own model (the collection records its path); that model
is loaded the first time a question needs it and kept (app.services.embedding_models, shared
with the Documents tab's indexing), so a chat's second question costs a search, not a load.

Calls may come from any thread, one at a time (a lock): the chat asks from a background
thread, never from the GUI thread. Every failure a user can cause (a collection removed, its
model file moved, an index the app cannot open) is a `RetrievalError` with one line.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from app.services.documents import open_documents
from app.services.embedding_models import EmbeddingModels, LoadedEmbedding
from engine.errors import EngineError
from engine.rag.search import Hit, hybrid
from engine.rag.store import RagStore, StoreError

MAX_QUERY_CHARS = 1000  # a pasted page is searched by its start

OpenIndex = Callable[[], AbstractContextManager[RagStore]]


class RetrievalError(EngineError):
    """The chat's collections cannot be searched; `str()` is one line for the user."""


class Embedding(Protocol):
    """A collection's embedding model, as search uses it."""

    def embed(self, text: str) -> list[float]: ...

    def close(self) -> None: ...


# Loads the embedding model of a file (a test or another app part may bring its own).
LoadEmbedding = Callable[[Path], Embedding]


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
        shared = models or EmbeddingModels()
        # Models it made itself are its to free; the app's shared ones are the app's.
        self._owned = shared if models is None and load is None else None
        self._load: LoadEmbedding = load or (lambda path: _SharedEmbedding(shared.get(path)))
        self._models: dict[Path, Embedding] = {}
        self._lock = threading.Lock()
        self._closed = False

    def names(self) -> list[str]:
        """The collections in the index ([] when there is no index to read)."""
        try:
            with self._open() as store:
                return [c.name for c in store.collections()]
        except (EngineError, OSError):
            return []

    def search(self, collections: Sequence[str], query: str, k: int) -> list[Hit]:
        """The best `k` passages for `query` over `collections`, best first (reciprocal rank
        fusion scores, which compare across collections)."""
        query = " ".join(query.split())[:MAX_QUERY_CHARS]
        with self._lock:
            if self._closed:
                raise RetrievalError("documents are closed (the app is shutting down)")
            try:
                with self._open() as store:
                    hits: list[Hit] = []
                    for name in collections:
                        hits += self._search_one(store, name, query, k)
            except StoreError as e:
                raise RetrievalError(str(e)) from None
            except OSError as e:
                raise RetrievalError(f"the documents index cannot be read: {e}") from None
        hits.sort(key=lambda h: -h.score)
        return hits[:k]

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
        for m in models:
            m.close()
        if self._owned is not None:
            self._owned.close()


__all__ = ["Embedding", "LoadEmbedding", "RetrievalError", "Retriever"]
