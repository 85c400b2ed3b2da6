"""The embedding models the app has loaded: one copy per file, shared by the chat's searches
and the Documents tab's indexing (a collection searched while it is indexed uses one model).
A reranker (a GGUF that pools RANK) is loaded the same way and scores a search's passages.

They load through the app's `ModelHost`, as the chat's model does: a load first makes room
within the host's memory budget (idle models the host loaded on demand go first), and each is
in the host, counted against that budget and listed with the other models, held by the
embeddings client (the host never evicts it). What this client keeps about a model (its
`LoadedEmbedding`: the embedder beside it) lives on the host's entry, so the host stays the
one registry. A model is loaded the first time either needs it and kept until `close()` (at
shutdown). Any thread may ask; the `Embedder` runs each decode on the model's own decode
thread, so a search and an indexing step take turns there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from engine.errors import EngineError
from engine.host.host import Loadable, ModelHost
from engine.host.runtime import Model
from engine.model.facts import model_facts
from engine.model.gguf import read_gguf
from engine.native.load_probe import FirstLoads
from engine.server.embeddings import Embedder
from engine.settings import LoadParams

log = logging.getLogger("candlewick.embeddings")
# Chunks are at most 200 tokens (engine.rag.indexer) and a question is cut to fit: 512 holds
# either.
EMBED_CTX = 512
# Tokens kept free of a rerank pair's document beyond what its markers measure: a document cut
# at a token boundary may tokenize a little longer once joined to the query.
PAIR_SLACK = 4
# One thread. With two or more, the embedding model's decode thread has an OpenMP team, and
# with more OpenMP threads than cores libgomp stops spinning at its barriers: the chat's own
# team then sleeps and wakes at every step, and the chat ran at about half speed (2 cores:
# SmolLM2 ~50 vs ~90 tok/s). An idle embedding loop's thread now ends and takes its team along
# (engine.host.loop_thread), but indexing next to a chat reply would still have both teams. On
# 2 busy cores one thread also embedded as fast as two (12-15 vs 2-6 chunks/s).
EMBED_THREADS = 1
OWNER = "embeddings"  # the host's name for the client that holds these models


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
        host: ModelHost | None = None,
        first_loads: FirstLoads | None = None,
        n_threads: int = EMBED_THREADS,
        load: LoadModel | None = None,
    ) -> None:
        """`host`: the app's model host (None: one of its own, closed with this);
        `first_loads`: a file's first load is tried in a child process first (a file that
        crashes llama.cpp fails the search or the indexing, not the app)."""
        self._host = host if host is not None else ModelHost()
        self._own_host = host is None
        self._n_threads = n_threads
        self._load: LoadModel = load or (
            lambda path: LoadedEmbedding(path, n_threads=n_threads, first_loads=first_loads)
        )
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
            model = next((m for m in self._kept() if m.path == key), None)
            if model is not None:
                return model
            name = self._free_name(key)
            short = self._host.make_room(
                Loadable(name, key, LoadParams(n_ctx=EMBED_CTX, n_threads=self._n_threads))
            )
            if short is not None:  # llama.cpp's own checks decide, as for the chat's model
                log.info("loading %s anyway: %s", key.name, short)
            model = self._load(key)
            try:
                self._host.add(name, model.model, owner=OWNER)
            except BaseException:
                model.close()
                raise
            self._host.attachments.set(name, self, model)
            return model

    def _kept(self) -> list[LoadedEmbedding]:
        return [cast(LoadedEmbedding, m) for _name, m in self._host.attachments.of(self)]

    def _free_name(self, path: Path) -> str:
        """The file's stem, or with a number when another model has that name."""
        taken = {h.name for h in self._host.hosted()}
        name, n = path.stem, 2
        while name in taken:
            name, n = f"{path.stem}-{n}", n + 1
        return name

    @property
    def loaded(self) -> list[Path]:
        with self._lock:
            return [m.path for m in self._kept()]

    def close(self) -> None:
        """Free every model; a later `get` is refused. Whoever used them has stopped (the
        window closes this after its Documents tab and its chat's searches have ended)."""
        with self._lock:
            self._closed = True
            names = [name for name, _m in self._host.attachments.of(self)]
        for name in names:
            self._host.remove(name)  # closes what this kept: the embedder and the model
        if self._own_host:
            self._host.close()
