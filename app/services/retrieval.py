"""Searching a chat's collections for a question: the chat's side of the documents index.

Each collection was embedded by its own model (the collection records its path); that model
is loaded the first time a question needs it and kept, so a chat's second question costs a
search, not a load. `close()` frees them (at shutdown).

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
from engine.errors import EngineError
from engine.host.runtime import Model
from engine.model.facts import model_facts
from engine.model.gguf import read_gguf
from engine.native.load_probe import FirstLoads
from engine.rag.search import Hit, hybrid
from engine.rag.store import RagStore, StoreError
from engine.server.embeddings import Embedder
from engine.settings import LoadParams

# Chunks are at most 200 tokens and a question is cut to fit: 512 holds either.
EMBED_CTX = 512
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


class _Embedding:
    """A GGUF embedding model on this computer, with its own decode thread."""

    def __init__(self, path: Path, n_threads: int | None, first_loads: FirstLoads | None) -> None:
        facts = model_facts(read_gguf(path))
        n_ctx = min(EMBED_CTX, facts.context_length or EMBED_CTX)
        self.model = Model(
            path, LoadParams(n_ctx=n_ctx, n_threads=n_threads), first_loads=first_loads
        )
        try:
            self.embedder = Embedder(self.model)
        except BaseException:
            self.model.close()
            raise

    def embed(self, text: str) -> list[float]:
        # A question longer than the model's context is searched by as much as fits.
        tokens = self.model.tokenize(text, add_special=True, parse_special=False)
        if len(tokens) > self.embedder.max_tokens:
            text = self.model.detokenize(tokens[: self.embedder.max_tokens - 2])
        return self.embedder.embed(text)[0]

    def close(self) -> None:
        self.embedder.close()
        self.model.close()


class Retriever:
    """Hybrid search over collections, with their embedding models loaded once."""

    def __init__(
        self,
        index: OpenIndex = open_documents,
        *,
        n_threads: int | None = None,
        first_loads: FirstLoads | None = None,
        load: LoadEmbedding | None = None,
    ) -> None:
        """`first_loads`: a file's first load is tried in a child process first (a file
        that crashes llama.cpp fails the search, not the app); `load`: another way to load
        a collection's model."""
        self._open = index
        self._load: LoadEmbedding = load or (lambda path: _Embedding(path, n_threads, first_loads))
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


__all__ = ["Embedding", "LoadEmbedding", "RetrievalError", "Retriever"]
