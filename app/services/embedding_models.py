"""The embedding models the app has loaded: one copy per file, shared by the chat's searches
and the Documents tab's indexing (a collection searched while it is indexed uses one model).
A reranker (a GGUF that pools RANK) is loaded the same way and scores a search's passages.

A model is loaded the first time either needs it and kept until `close()` (at shutdown). Any
thread may ask; the `Embedder` runs each decode on the model's own decode thread, so a search
and an indexing step take turns there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.errors import EngineError
from engine.host.runtime import Model
from engine.model.facts import model_facts
from engine.model.gguf import read_gguf
from engine.native.load_probe import FirstLoads
from engine.server.embeddings import Embedder
from engine.settings import LoadParams

# Chunks are at most 200 tokens (engine.rag.indexer) and a question is cut to fit: 512 holds
# either.
EMBED_CTX = 512
# Tokens kept free of a rerank pair's document beyond what its markers measure: a document cut
# at a token boundary may tokenize a little longer once joined to the query.
PAIR_SLACK = 4
# One thread. With two or more, the embedding model's decode thread keeps an OpenMP team, and
# with more OpenMP threads than cores libgomp stops spinning at its barriers: the chat's own
# team then sleeps and wakes at every step, and the chat ran at about half speed (2 cores:
# SmolLM2 ~50 vs ~90 tok/s) even with no embedding running. On 2 busy cores one thread also
# embedded as fast as two (12-15 vs 2-6 chunks/s).
EMBED_THREADS = 1


class LoadedEmbedding:
    """One embedding GGUF (or reranker GGUF), loaded with its own context and decode thread."""

    def __init__(
        self, path: Path, *, n_threads: int | None, first_loads: FirstLoads | None
    ) -> None:
        """`n_threads` None: llama.cpp's default (every core; for a process that only indexes)."""
        self.path = path
        facts = model_facts(read_gguf(path))
        # A reranker scores (query, passage) pairs (`rerank`); it has no vectors to give.
        self.is_reranker = facts.is_reranker
        self.dim = facts.n_embd  # the length of its vectors (meaningless for a reranker)
        n_ctx = min(EMBED_CTX, facts.context_length or EMBED_CTX)
        self.model = Model(
            path, LoadParams(n_ctx=n_ctx, n_threads=n_threads), first_loads=first_loads
        )
        try:
            self.embedder = Embedder(self.model)
        except BaseException:
            self.model.close()
            raise

    def embed_many(self, texts: list[str]) -> list[list[float]]:
        return [v for v, _n in self.embedder.embed_many(texts)]

    def embed_query(self, text: str) -> list[float]:
        """A question's vector; one longer than the model's context is embedded by as much
        of its start as fits."""
        tokens = self.model.tokenize(text, add_special=True, parse_special=False)
        if len(tokens) > self.embedder.max_tokens:
            text = self.model.detokenize(tokens[: self.embedder.max_tokens - 2])
        return self.embedder.embed(text)[0]

    def rerank(self, query: str, texts: Sequence[str]) -> list[float]:
        """Each text's relevance score to `query` (raw, higher is better), in input order. A
        question longer than half the model's context is scored by its start, and a text
        whose pair would not fit by as much of its start as does: an indexed chunk never
        fails a search. EngineError for a model that is not a reranker."""
        limit = self.embedder.max_tokens
        q = self._tokens(query)
        if len(q) > limit // 2:
            q = q[: limit // 2]
            query = self.model.detokenize(q)
        room = limit - len(q) - self.embedder.pair_overhead() - PAIR_SLACK
        cut = []
        for text in texts:
            tokens = self._tokens(text)
            cut.append(self.model.detokenize(tokens[:room]) if len(tokens) > room else text)
        return [score for score, _n in self.embedder.rerank(query, cut)]

    def _tokens(self, text: str) -> list[int]:
        return self.model.tokenize(text, add_special=False, parse_special=False)

    def count_tokens(self, text: str) -> int:
        return len(self.model.tokenize(text, add_special=True, parse_special=False))

    def close(self) -> None:
        self.embedder.close()
        self.model.close()


LoadModel = Callable[[Path], LoadedEmbedding]


class EmbeddingModels:
    def __init__(
        self,
        *,
        first_loads: FirstLoads | None = None,
        n_threads: int = EMBED_THREADS,
        load: LoadModel | None = None,
    ) -> None:
        """`first_loads`: a file's first load is tried in a child process first (a file
        that crashes llama.cpp fails the search or the indexing, not the app)."""
        self._load: LoadModel = load or (
            lambda path: LoadedEmbedding(path, n_threads=n_threads, first_loads=first_loads)
        )
        self._models: dict[Path, LoadedEmbedding] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, path: Path) -> LoadedEmbedding:
        """The model of `path` (an embedding model or a reranker: `is_reranker` says which),
        loaded now if it is not yet. Raises what loading raises
        (EngineError, or ValueError/OSError for a file that is not a usable GGUF)."""
        key = path.resolve()
        with self._lock:  # two first uses of one file load it once
            if self._closed:
                raise EngineError("the embedding models are closed (the app is shutting down)")
            model = self._models.get(key)
            if model is None:
                model = self._models[key] = self._load(key)
            return model

    @property
    def loaded(self) -> list[Path]:
        with self._lock:
            return list(self._models)

    def close(self) -> None:
        """Free every model; a later `get` is refused. Whoever used them has stopped (the
        window closes this after its Documents tab and its chat's searches have ended)."""
        with self._lock:
            self._closed = True
            models, self._models = list(self._models.values()), {}
        for m in models:
            m.close()
