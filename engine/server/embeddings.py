"""Sentence embeddings from a loaded model, decoded on the model's decode thread between two
generation steps (`call_soon`): one thread drives llama.cpp, as in llama-server.

An embedding model (a GGUF that says how it pools: BERT, nomic-bert, ...) is loaded with its
one context in embeddings mode, and the vectors come from there, pooled as the file says. A
text generator named for embeddings (as Ollama allows) gets a second context on the same
weights, with embeddings on and mean pooling, so generation and embedding never share a KV
cache."""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.errors import EngineError
from engine.host.runtime import Model
from engine.native import llama_lib

_POOLING_MEAN = 1


class Embedder:
    def __init__(
        self, model: Model, *, max_tokens: int = 512, n_threads: int | None = None
    ) -> None:
        self.model = model
        # An embedding model's own context holds what one input may be.
        self.max_tokens = model.n_ctx if model.embedding_only else max_tokens
        self._n_threads = n_threads or model.load_info.n_threads
        self._ctx: Any = None
        self._lock = threading.Lock()
        # One long-lived worker thread keeps embedding work off the event loop; started now so
        # its lifetime is the server's, not the first request's.
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="candlewick-embed")
        self.executor.submit(lambda: None).result()

    def _context(self) -> Any:
        if self.model.embedding_only:
            return self.model.ctx_ptr  # the model's, freed with it
        if self._ctx is None:
            C = llama_lib.lib()
            cp = C.llama_context_default_params()
            cp.n_ctx = cp.n_batch = cp.n_ubatch = self.max_tokens
            cp.n_seq_max = 1
            cp.n_threads = cp.n_threads_batch = self._n_threads
            cp.embeddings = True
            cp.pooling_type = _POOLING_MEAN
            ctx = C.llama_init_from_model(self.model.model_ptr, cp)
            if not ctx:
                raise EngineError("llama.cpp could not create an embeddings context")
            self._ctx = ctx
        return self._ctx

    def embed(self, text: str) -> tuple[list[float], int]:
        """The L2-normalised embedding of `text` and its token count."""
        tokens = self.model.tokenize(text, add_special=True, parse_special=False)
        if not tokens:
            raise EngineError("cannot embed an empty input")
        if len(tokens) > self.max_tokens:
            raise EngineError(
                f"the input is {len(tokens)} tokens; embeddings take at most {self.max_tokens}"
            )
        with self._lock:
            return self.model.loop.call_soon(lambda: self._embed(tokens))

    def _embed(self, tokens: list[int]) -> tuple[list[float], int]:
        C = llama_lib.lib()
        ctx = self._context()
        C.llama_memory_clear(C.llama_get_memory(ctx), True)
        batch = C.llama_batch_init(len(tokens), 0, 1)
        try:
            for i, t in enumerate(tokens):
                batch.token[i] = t
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            batch.n_tokens = len(tokens)
            rc = C.llama_decode(ctx, batch)
            if rc != 0:
                raise EngineError(f"llama.cpp failed to compute the embedding (error {rc})")
            ptr = C.llama_get_embeddings_seq(ctx, 0)
            if not ptr:
                raise EngineError("this model gives no pooled embeddings")
            n = int(C.llama_model_n_embd(self.model.model_ptr))
            vec = [float(ptr[i]) for i in range(n)]
        finally:
            C.llama_batch_free(batch)
        norm = math.sqrt(sum(v * v for v in vec)) or 1.0
        return [v / norm for v in vec], len(tokens)

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            if self._ctx is not None:
                llama_lib.lib().llama_free(self._ctx)
                self._ctx = None
