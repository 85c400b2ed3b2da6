"""Sentence embeddings from a loaded model, decoded on the model's decode thread between two
generation steps (`call_soon`): one thread drives llama.cpp, as in llama-server.

An embedding model (a GGUF that says how it pools: BERT, nomic-bert, ...) gets a context of
its own here in embeddings mode (`LlamaBackend.open_pooled`), pooled as the file says, that
packs several inputs into one decode, each its own sequence (as llama.cpp's
`llama-embedding` does). Its attention is not causal, so all of a batch's tokens go in one
ubatch and every token's scores are computed against the whole batch (masked across
sequences): that cost grows with the square of the batch, so the budget is the model's
context (512 tokens for MiniLM): that packs the short inputs (queries, small chunks) whose
one-at-a-time decodes are mostly fixed cost, and costs long ones about what one at a time
does (benchmarks/rag_search.py measures both). A text generator named for embeddings (as
Ollama allows) gets a second context on the same weights, with embeddings on and mean
pooling, so generation and embedding never share a KV cache.

A reranker (pooling RANK: a BERT with a classifier head, a Qwen3 reranker) goes the same way:
each (query, document) pair is one sequence, built as llama-server's `format_prompt_rerank`
builds it, and its pooled output is the head's `n_cls_out` floats, of which the first is the
pair's relevance score (raw, as llama-server gives it)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from engine.errors import EngineError
from engine.host.runtime import Model
from engine.model.facts import POOLING_RANK, embedding_pooling
from engine.native.backend import LlamaBackend, max_parallel_sequences, pooled_width

# The most inputs one decode takes (short queries: many fit in the token budget).
MAX_SEQUENCES = 64


class Embedder:
    def __init__(
        self,
        model: Model,
        *,
        max_tokens: int = 512,
        n_threads: int | None = None,
        batch_tokens: int | None = None,
    ) -> None:
        self.model = model
        # What one input may be: an embedding model's trained context (its position table).
        self.max_tokens = model.n_ctx if model.embedding_only else max_tokens
        # What one decode may take: at least one input of any allowed size.
        self.batch_tokens = max(self.max_tokens, batch_tokens or self.max_tokens)
        self.max_sequences = max(1, min(MAX_SEQUENCES, max_parallel_sequences()))
        self._n_threads = n_threads or model.load_info.n_threads
        self.is_reranker = model.embedding_only and embedding_pooling(model.gguf) == POOLING_RANK
        # What one pooled sequence is: a vector of n_embd, or a reranker's head outputs.
        self._n_out = pooled_width(model.model_ptr, rank=self.is_reranker)
        # How a (query, document) pair is written: the file's "rerank" prompt, else markers.
        self._rerank_template = model.named_template("rerank") if self.is_reranker else None
        self._specials = model.special_tokens()
        self._backend: LlamaBackend | None = None  # its own context, opened on first use
        self._lock = threading.Lock()
        # One long-lived worker thread keeps embedding work off the event loop; started now so
        # its lifetime is the server's, not the first request's.
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="candlewick-embed")
        self.executor.submit(lambda: None).result()

    def _context(self) -> LlamaBackend:
        if self._backend is None:
            m = self.model
            self._backend = LlamaBackend.open_pooled(
                m.model_ptr,
                m.vocab_ptr,
                m.n_vocab,
                n_tokens=self.batch_tokens,
                n_seq_max=self.max_sequences,
                n_threads=self._n_threads,
                mean_pooling=not m.embedding_only,
            )
        return self._backend

    def embed(self, text: str) -> tuple[list[float], int]:
        """The L2-normalised embedding of `text` and its token count."""
        return self.embed_many([text])[0]

    def embed_many(self, texts: Sequence[str]) -> list[tuple[list[float], int]]:
        """Each text's L2-normalised embedding and token count, in order. Texts are packed
        into as few decodes as the token budget allows; each decode is its own step on the
        decode thread, so a long list does not hold generation up for its whole time."""
        if self.is_reranker:
            raise EngineError(
                f"{self.model.path.name} is a reranking model; it gives relevance scores, "
                "not embeddings"
            )
        inputs = [self._tokens(t, i, len(texts)) for i, t in enumerate(texts)]
        out: list[tuple[list[float], int]] = []
        for group, rows in self._pooled(inputs):
            norms = np.linalg.norm(rows.astype(np.float64), axis=1, keepdims=True)
            norms[norms == 0] = 1.0
            vectors = [[float(v) for v in row] for row in rows / norms]
            out.extend(zip(vectors, (len(t) for t in group), strict=True))
        return out

    def rerank(self, query: str, documents: Sequence[str]) -> list[tuple[float, int]]:
        """Each document's relevance score to `query` and its pair's token count, in input
        order (sorting is the caller's). Pairs are packed into decodes as embeddings are."""
        if not self.is_reranker:
            raise EngineError(
                f"{self.model.path.name} is not a reranking model; it gives embeddings, "
                "not relevance scores"
            )
        pairs = [self._pair(query, d, i, len(documents)) for i, d in enumerate(documents)]
        out: list[tuple[float, int]] = []
        for group, rows in self._pooled(pairs):
            out.extend((float(row[0]), len(t)) for row, t in zip(rows, group, strict=True))
        return out

    def _pooled(
        self, inputs: list[list[int]]
    ) -> Iterator[tuple[list[list[int]], npt.NDArray[np.float32]]]:
        """Each group of inputs with its pooled rows; one decode-thread step per group."""
        for group in self._groups(inputs):
            with self._lock:
                rows = self.model.loop.call_soon(functools.partial(self._decode, group))
            yield group, rows

    def _tokens(self, text: str, i: int, n: int) -> list[int]:
        which = f"input {i}" if n > 1 else "the input"
        tokens = self.model.tokenize(text, add_special=True, parse_special=False)
        if not tokens:
            raise EngineError("cannot embed an empty input" + (f" ({which})" if n > 1 else ""))
        if len(tokens) > self.max_tokens:
            raise EngineError(
                f"{which} is {len(tokens)} tokens; embeddings take at most {self.max_tokens}"
            )
        return tokens

    def _pair(self, query: str, document: str, i: int, n: int) -> list[int]:
        """One (query, document) sequence, as llama-server's `format_prompt_rerank` makes it:
        the file's "rerank" template with both substituted, or else the vocabulary's own
        markers (for a BERT vocabulary: [CLS] query [SEP] document [SEP])."""
        m, template = self.model, self._rerank_template
        if template is not None:
            text = template.replace("{query}", query).replace("{document}", document)
            tokens = m.tokenize(text, add_special=False, parse_special=True)
        else:
            sp = self._specials
            eos = sp.eos if sp.eos >= 0 else sp.sep  # llama.cpp's fallback
            tokens = [sp.bos] if sp.add_bos else []
            tokens += m.tokenize(query, add_special=False, parse_special=False)
            tokens += [eos] if sp.add_eos else []
            tokens += [sp.sep] if sp.add_sep else []
            tokens += m.tokenize(document, add_special=False, parse_special=False)
            tokens += [eos] if sp.add_eos else []
        if not tokens:
            raise EngineError("cannot rerank an empty pair")
        if len(tokens) > self.max_tokens:
            which = f"document {i}" if n > 1 else "the document"
            raise EngineError(
                f"{which} is {len(tokens)} tokens with the query; reranking takes at most "
                f"{self.max_tokens}"
            )
        return tokens

    def pair_overhead(self) -> int:
        """The tokens a rerank pair takes besides its query's and document's (the template's
        own text, or the vocabulary's markers, as `_pair` builds it): what a caller that
        cuts long documents to fit must leave room for."""
        if self._rerank_template is not None:
            empty = self._rerank_template.replace("{query}", "").replace("{document}", "")
            return len(self.model.tokenize(empty, add_special=False, parse_special=True))
        sp = self._specials
        return int(sp.add_bos) + 2 * int(sp.add_eos) + int(sp.add_sep)

    def _groups(self, inputs: list[list[int]]) -> list[list[list[int]]]:
        """Consecutive inputs, as many a group as fit the token budget and sequence count."""
        groups: list[list[list[int]]] = []
        size = 0
        for tokens in inputs:
            if (
                not groups
                or size + len(tokens) > self.batch_tokens
                or len(groups[-1]) >= self.max_sequences
            ):
                groups.append([])
                size = 0
            groups[-1].append(tokens)
            size += len(tokens)
        return groups

    def _decode(self, group: list[list[int]]) -> npt.NDArray[np.float32]:
        """The pooled output of each sequence of the group: `_n_out` floats a row."""
        backend = self._context()
        backend.clear()
        total = sum(len(t) for t in group)
        batch = backend.batch(total)
        try:
            i = 0
            for seq, tokens in enumerate(group):
                for pos, t in enumerate(tokens):
                    batch.put(i, t, pos, seq, True)
                    i += 1
            batch.n_tokens = total
            backend.decode(batch)  # DecodeFailed: the one decode-error text
            rows = np.empty((len(group), self._n_out), dtype=np.float32)
            for seq in range(len(group)):
                row = backend.pooled(seq, self._n_out)
                if row is None:
                    raise EngineError("this model gives no pooled embeddings")
                rows[seq] = row
        finally:
            batch.close()
        return rows

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            if self._backend is not None:
                self._backend.close()
                self._backend = None
