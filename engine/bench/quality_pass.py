"""One pass of a model over a text, scored as llama.cpp's `llama-perplexity` scores it.

The text's tokens (with BOS where the model adds one) are cut into chunks of `ctx` tokens;
the remainder is left out. Each chunk starts from an empty cache with its first token
replaced by BOS (where the model adds one); only its second half is scored: the logits at
positions `ctx/2 .. ctx-2`, each against the next token. `n_batch` tokens go in one decode:
`n_batch // ctx` chunks side by side (each its own sequence), or a chunk over several
decodes when it is longer than `n_batch`. llama.cpp does exactly this, so the numbers
compare with its own.

The decodes run on the model's decode thread (`Scheduler.call_soon`), on a context of their
own on the same weights (`LlamaBackend.open_scoring`), as embeddings and reranking do; the
arithmetic on the logits (engine.bench.quality_math) runs off the loop, on as many worker
threads as the decode uses, reading the context's output rows in place while the loop is
free for other work (only this scorer decodes on that context).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from engine.bench import quality_math as qm
from engine.bench.quality_store import ReferenceScores
from engine.errors import EngineError
from engine.host.runtime import Model
from engine.native.backend import LlamaBackend

DEFAULT_CTX = 512  # llama-perplexity's default
DEFAULT_BATCH = 2048  # llama.cpp's default n_batch
_UBATCH = 512  # llama.cpp's default n_ubatch
_MAX_SEQ = 256
# Logits the arithmetic takes at once (1 MiB of float32, and as much scratch): a block the
# core's own cache holds through the few passes numpy makes over it. Blocks of 128 rows
# (25 MiB for SmolLM2) went to the shared cache every pass: twice the time a row.
_BLOCK_ELEMENTS = 1 << 18

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]

# (chunks done, chunks in all)
PassProgress = Callable[[int, int], None]


class QualityCancelled(EngineError):
    """The pass was stopped before its end."""


@dataclass(frozen=True)
class Chunking:
    """How a text of `n_tokens` is cut and batched (see the module doc)."""

    ctx: int
    n_batch: int  # tokens per decode (llama.cpp's n_batch, capped as it caps it)
    chunks: int
    n_seq: int  # chunks per decode

    @property
    def first(self) -> int:
        """The first position of a chunk whose logits are scored."""
        return self.ctx // 2

    @property
    def scored_per_chunk(self) -> int:
        return self.ctx - 1 - self.first

    @property
    def scored(self) -> int:
        return self.chunks * self.scored_per_chunk


def plan(
    n_tokens: int,
    ctx: int = DEFAULT_CTX,
    n_batch: int = DEFAULT_BATCH,
    max_chunks: int | None = None,
) -> Chunking:
    """The chunks of a text of `n_tokens` tokens; EngineError when it is too short (llama.cpp
    asks for two chunks' worth)."""
    if ctx < 16:
        raise EngineError("the context must be at least 16 tokens")
    if n_batch < 1:
        raise EngineError("the batch must be at least 1 token")
    if n_tokens < 2 * ctx:
        raise EngineError(
            f"the text is {n_tokens} tokens; a context of {ctx} needs at least {2 * ctx} "
            "(choose a smaller --ctx or a longer text)"
        )
    chunks = n_tokens // ctx
    if max_chunks is not None:
        if max_chunks < 1:
            raise EngineError("at least one chunk must be scored")
        chunks = min(chunks, max_chunks)
    # llama.cpp holds at most LLAMA_MAX_SEQ (256) sequences in a context.
    n_seq = min(max(1, n_batch // ctx), _MAX_SEQ)
    return Chunking(ctx=ctx, n_batch=min(n_batch, n_seq * ctx), chunks=chunks, n_seq=n_seq)


@dataclass
class CandidateScores:
    """A candidate's pass, position by position against the reference."""

    nll: npt.NDArray[np.float64]
    kld: npt.NDArray[np.float64]
    same_top: npt.NDArray[np.bool_]
    pass_s: float


class TextScorer:
    """Passes of one loaded model over a text's chunks (see the module doc)."""

    def __init__(self, model: Model, chunking: Chunking) -> None:
        specials = model.special_tokens()
        if specials.add_eos:
            # llama-perplexity refuses these too (GGML_ASSERT): an end token after the text
            # is not what the model predicts there.
            raise EngineError(f"{model.path.name} adds an end token to a text; it cannot be scored")
        self.model = model
        self.chunking = chunking
        self._bos = specials.bos if specials.add_bos else None
        self._lock = threading.Lock()
        c = chunking
        self._backend: LlamaBackend | None = None
        self._batch_rows = c.n_batch
        self._workers = max(1, model.load_info.n_threads)
        self._local = threading.local()
        self._n_ctx = c.n_seq * c.ctx

    def tokens(self, text: str) -> list[int]:
        """The text's tokens as llama-perplexity reads it (special tokens as plain text)."""
        return self.model.tokenize(text, add_special=True, parse_special=False)

    def _context(self) -> LlamaBackend:
        if self._backend is None:
            m = self.model
            self._backend = LlamaBackend.open_scoring(
                m.model_ptr,
                m.vocab_ptr,
                m.n_vocab,
                n_ctx=self._n_ctx,
                n_seq_max=self.chunking.n_seq,
                n_batch=self._batch_rows,
                n_ubatch=_UBATCH,
                n_threads=m.load_info.n_threads,
            )
        return self._backend

    def close(self) -> None:
        """Free the scoring context (on the decode thread, or here once the loop is gone)."""
        with self._lock:
            if self._backend is None:
                return
            backend, self._backend = self._backend, None
            try:
                self.model.loop.call_soon(backend.close)
            except EngineError:  # the loop has stopped: nothing else decodes on it
                backend.close()

    # -- decoding ---------------------------------------------------------------------------

    def _decode_group(
        self, tokens: list[int], first_chunk: int, n_seq: int, part: int
    ) -> tuple[npt.NDArray[np.float32], int]:
        """On the decode thread: decode part `part` of chunks [first_chunk, +n_seq) and return
        the output rows (a view into the context) and how many there are."""
        c = self.chunking
        backend = self._context()
        if part == 0:
            backend.clear()
        lo = part * c.n_batch
        size = min(c.ctx - lo, c.n_batch)
        batch = backend.batch(size * n_seq)
        try:
            i = outputs = 0
            for seq in range(n_seq):
                start = (first_chunk + seq) * c.ctx
                for k in range(size):
                    pos = lo + k
                    tok = tokens[start + pos]
                    if pos == 0 and self._bos is not None:
                        tok = self._bos
                    keep = pos >= c.first
                    batch.put(i, tok, pos, seq, keep)
                    i += 1
                    outputs += keep
            batch.n_tokens = i
            backend.decode(batch)
            rows = (
                backend.output_logits(outputs)
                if outputs
                else np.empty((0, self.model.n_vocab), np.float32)
            )
        finally:
            batch.close()
        return rows, outputs

    def _chunk_logits(
        self, tokens: list[int], cancel: threading.Event | None, progress: PassProgress | None
    ) -> Iterator[tuple[int, npt.NDArray[np.float32]]]:
        """Each chunk's scored rows of logits (ctx - first rows; the last predicts past the
        chunk and is not scored), in order. A row block is valid until the next is asked for."""
        c = self.chunking
        parts = (c.ctx + c.n_batch - 1) // c.n_batch
        loop = self.model.loop
        done = 0
        for first_chunk in range(0, c.chunks, c.n_seq):
            if cancel is not None and cancel.is_set():
                raise QualityCancelled("cancelled")
            n_seq = min(c.n_seq, c.chunks - first_chunk)
            with self._lock:
                if parts == 1:
                    rows, _ = loop.call_soon(
                        partial(self._decode_group, tokens, first_chunk, n_seq, 0)
                    )
                    per = c.ctx - c.first
                    for seq in range(n_seq):
                        yield first_chunk + seq, rows[seq * per : (seq + 1) * per]
                else:  # one chunk longer than a batch: its rows gathered from each decode
                    kept: list[npt.NDArray[np.float32]] = []
                    for part in range(parts):
                        rows, n = loop.call_soon(
                            partial(self._decode_group, tokens, first_chunk, 1, part)
                        )
                        if n:
                            kept.append(np.array(rows, copy=True))
                    yield first_chunk, np.concatenate(kept)
            done += n_seq
            if progress is not None:
                progress(done, c.chunks)

    def _blocks(self, vocab: int) -> list[tuple[int, int]]:
        """A chunk's scored rows in blocks: at least one per worker, each of about
        `_BLOCK_ELEMENTS` logits (one row at least)."""
        n = self.chunking.scored_per_chunk
        per = max(1, min(_BLOCK_ELEMENTS // max(1, vocab), -(-n // self._workers)))
        return [(lo, min(n, lo + per)) for lo in range(0, n, per)]

    def _scratch(self, shape: tuple[int, int]) -> npt.NDArray[np.float32]:
        """This worker thread's temporary block, kept between blocks."""
        buf: npt.NDArray[np.float32] | None = getattr(self._local, "buf", None)
        if buf is None or buf.shape[0] < shape[0] or buf.shape[1] != shape[1]:
            buf = np.empty(shape, np.float32)
            self._local.buf = buf
        return buf

    def _targets(self, tokens: list[int], chunk: int) -> npt.NDArray[np.int32]:
        c = self.chunking
        start = chunk * c.ctx + c.first + 1
        return np.asarray(tokens[start : start + c.scored_per_chunk], dtype=np.int32)

    def _pool(self) -> ThreadPoolExecutor:
        # The arithmetic runs while the decode threads wait: as many workers as they are
        # (numpy lets go of the interpreter's lock on large arrays).
        return ThreadPoolExecutor(self._workers, thread_name_prefix="candlewick-quality")

    # -- passes -----------------------------------------------------------------------------

    def reference_pass(
        self,
        tokens: list[int],
        *,
        cancel: threading.Event | None = None,
        progress: PassProgress | None = None,
    ) -> ReferenceScores:
        """Score the text as the reference: what every candidate is compared with."""
        c = self.chunking
        n = c.scored
        top = np.empty(n, np.int32)
        nll = np.empty(n, np.float64)
        counts = np.zeros(n, np.int64)
        cols: list[npt.NDArray[np.int32]] = []
        logp: list[npt.NDArray[np.float32]] = []

        def block(logits: F32, targets: I32, base: int, lo: int, hi: int) -> qm.KeptLogProbs:
            rows = logits[lo:hi]
            scratch = self._scratch(rows.shape)
            norm = qm.normalise(rows, scratch)
            top[base + lo : base + hi] = norm.top
            nll[base + lo : base + hi] = qm.target_nll(rows, norm, targets[lo:hi])
            kept = qm.kept_log_probs(rows, norm)
            counts[base + lo : base + hi] = np.bincount(kept.rows, minlength=hi - lo)
            return kept

        t0 = time.perf_counter()
        with self._pool() as pool:
            for chunk, logits in self._chunk_logits(tokens, cancel, progress):
                targets, base = self._targets(tokens, chunk), chunk * c.scored_per_chunk
                jobs = [
                    pool.submit(block, logits, targets, base, lo, hi)
                    for lo, hi in self._blocks(logits.shape[1])
                ]
                for job in jobs:  # in row order
                    kept = job.result()
                    cols.append(kept.cols)
                    logp.append(kept.logp)
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        return ReferenceScores(
            tokens=np.asarray(tokens[: c.chunks * c.ctx], dtype=np.int32),
            top=top,
            nll=nll,
            indptr=indptr,
            cols=np.concatenate(cols) if cols else np.empty(0, np.int32),
            logp=np.concatenate(logp) if logp else np.empty(0, np.float32),
            n_vocab=self.model.n_vocab,
            pass_s=time.perf_counter() - t0,
        )

    def candidate_pass(
        self,
        tokens: list[int],
        ref: ReferenceScores,
        *,
        cancel: threading.Event | None = None,
        progress: PassProgress | None = None,
    ) -> CandidateScores:
        """Score the text as a candidate, position by position against `ref`."""
        c = self.chunking
        if ref.rows != c.scored or ref.n_vocab != self.model.n_vocab:
            raise EngineError("the reference's scores are for another text or vocabulary")
        n = c.scored
        nll = np.empty(n, np.float64)
        kld = np.empty(n, np.float64)
        same = np.empty(n, np.bool_)
        p_ref = np.exp(ref.logp.astype(np.float64))

        def block(logits: F32, targets: I32, base: int, lo: int, hi: int) -> None:
            rows = logits[lo:hi]
            norm = qm.normalise(rows, self._scratch(rows.shape))
            where, span = ref.block(base + lo, base + hi)
            kept = qm.KeptLogProbs(where, ref.cols[span], ref.logp[span])
            nll[base + lo : base + hi] = qm.target_nll(rows, norm, targets[lo:hi])
            kld[base + lo : base + hi] = qm.kl_rows(rows, norm, kept, p_ref[span])
            same[base + lo : base + hi] = norm.top == ref.top[base + lo : base + hi]

        t0 = time.perf_counter()
        with self._pool() as pool:
            for chunk, logits in self._chunk_logits(tokens, cancel, progress):
                targets, base = self._targets(tokens, chunk), chunk * c.scored_per_chunk
                jobs = [
                    pool.submit(block, logits, targets, base, lo, hi)
                    for lo, hi in self._blocks(logits.shape[1])
                ]
                for job in jobs:
                    job.result()
        return CandidateScores(nll=nll, kld=kld, same_top=same, pass_s=time.perf_counter() - t0)


__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_CTX",
    "CandidateScores",
    "Chunking",
    "PassProgress",
    "QualityCancelled",
    "TextScorer",
    "plan",
]
