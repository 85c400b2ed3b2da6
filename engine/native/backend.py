"""One typed backend over a llama.cpp context: the only code that decodes.

`ContextBackend` is what a decode loop sees of a context: a batch to fill (tokens or
embeddings, positions, sequence ids, which rows want logits), `decode`/`encode`, logits and
pooled embeddings out, sampler chains, KV operations and per-sequence state. `LlamaBackend`
implements it on llama-cpp-python's ctypes bindings; nothing else in `engine/` calls
`llama_decode`, `llama_encode` or `llama_batch_*`. A test backend with the same interface runs
the real scheduler without a model.

A backend is a view of a context its creator frees (a `Model`'s), or owns one it opened
itself (`open_pooled`, an embeddings context; `open_scoring`, a text's logits row by
row; `close` frees it); either way it is used from
the one thread that drives that context. Binding functions are looked up on the
module at every call, as before, so a test that wraps `llama_decode` still sees every decode.

The hot path stays as tight as a hand-written loop: `TokenBatch.put` writes five ctypes fields
through arrays looked up once per batch, and a failed decode raises `DecodeFailed` (no return
code to check in the common case).
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from typing import Any, NewType, Protocol

import numpy as np
import numpy.typing as npt

from engine.errors import EngineError
from engine.native import llama_lib
from engine.native.lora import LoraAdapter, set_adapters
from engine.native.thread_tuner import ThreadTuner

# A sampler chain, opaque to the loop: a llama.cpp pointer here, anything in a test backend.
Sampler = NewType("Sampler", object)

_POOLING_MEAN = 1  # llama_pooling_type


class DecodeFailed(EngineError):
    """llama.cpp refused a batch; the message is the one text for it, whoever decoded."""

    def __init__(self, rc: int) -> None:
        super().__init__(decode_error(rc))
        self.rc = rc


def decode_error(rc: int) -> str:
    """The one message for a failed `llama_decode`, whoever called it."""
    if rc == 1:
        return (
            "the context is full (no free KV cache slot for this batch); start a new chat "
            "or raise the context"
        )
    if rc == 2:
        return "decoding was aborted"
    return f"llama.cpp failed to decode (error {rc})"


class SamplerSpec(Protocol):
    """What a sampler chain is built from (`engine.settings.SamplingParams` is one)."""

    @property
    def penalizes(self) -> bool: ...
    @property
    def repeat_last_n(self) -> int: ...
    @property
    def repeat_penalty(self) -> float: ...
    @property
    def frequency_penalty(self) -> float: ...
    @property
    def presence_penalty(self) -> float: ...
    @property
    def temperature(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def top_p(self) -> float: ...
    @property
    def min_p(self) -> float: ...
    @property
    def seed(self) -> int | None: ...


class TokenBatch(Protocol):
    """Rows for one decode. `n_tokens`: how many rows the next decode reads."""

    capacity: int
    n_tokens: int

    def put(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        """Row `i`: `token` at position `pos` of sequence `seq`; `logits`: keep its output."""

    def put_embedding(
        self, i: int, row: npt.NDArray[np.float32], pos: int, seq: int, logits: bool
    ) -> None:
        """Row `i` of an embeddings batch: `row` (n_embd floats) instead of a token."""

    def close(self) -> None: ...


class ContextBackend(Protocol):
    """The interface a decode loop has to one context (see the module doc)."""

    @property
    def n_vocab(self) -> int: ...
    @property
    def n_batch(self) -> int:
        """The most rows one decode may take."""

    @property
    def n_ctx_seq(self) -> int:
        """The positions one sequence holds."""

    @property
    def n_seq_max(self) -> int: ...

    # -- batches ----------------------------------------------------------------------------
    def batch(self, capacity: int, n_embd: int = 0) -> TokenBatch:
        """A batch of `capacity` rows: of tokens, or of `n_embd`-float embeddings."""

    def decode(
        self, batch: TokenBatch, *, fixed_threads: bool = False, causal: bool = True
    ) -> None:
        """Run the batch (waits for it); raises DecodeFailed. `fixed_threads`: on the
        context's own thread count, whatever the thread tuner chose, and unmeasured (CPU
        flash attention splits a lone query's cache by the thread count: a reproducible
        reply must be decoded on the same count each time). `causal=False`: the batch's
        rows attend to each other both ways (a projector's image that asks for it)."""

    def encode(self, batch: TokenBatch) -> None:
        """Run an encoder over the batch; raises DecodeFailed."""

    def apply_lora(self, scales: tuple[float, ...]) -> None:
        """Decode from now on with the model's LoRA adapters at `scales` (one per adapter;
        () when it has none). Context-wide: a batch is decoded under one setting."""

    # -- outputs ----------------------------------------------------------------------------
    def logits(self, row: int) -> npt.NDArray[np.float32]:
        """The logits of batch row `row` (-1: the last), a writable view of n_vocab floats."""

    def pooled(self, seq: int, n: int) -> npt.NDArray[np.float32] | None:
        """A copy of sequence `seq`'s pooled output (`n` floats); None when not pooled."""

    # -- sampling ---------------------------------------------------------------------------
    def sampler(self, spec: SamplerSpec) -> Sampler: ...
    def greedy_sampler(self) -> Sampler: ...
    def sampler_accept(self, sampler: Sampler, token: int) -> None: ...
    def sample(self, sampler: Sampler, row: int) -> int:
        """Sample from batch row `row`'s logits and accept the token into the chain."""

    def sampler_free(self, sampler: Sampler) -> None: ...

    # -- vocabulary -------------------------------------------------------------------------
    def is_eog(self, token: int) -> bool: ...
    def token_to_piece(self, token: int, special: bool) -> bytes: ...

    # -- KV cache ---------------------------------------------------------------------------
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Drop `seq`'s cells in [p0, p1) (-1: open); False when the cache cannot."""

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...
    def seq_keep(self, seq: int) -> None: ...
    def seq_shift(self, seq: int, p0: int, p1: int, delta: int) -> None: ...
    def clear(self) -> None:
        """Drop every cell of every sequence."""

    def pos_max(self, seq: int) -> int:
        """The highest position `seq` holds (-1: none)."""

    def state_get(self, seq: int, max_bytes: int) -> bytes | None:
        """Sequence `seq`'s KV state, or None when empty or larger than `max_bytes`."""

    def state_set(self, seq: int, state: bytes) -> bool:
        """Load a state `state_get` gave into `seq`; False when llama.cpp refuses it."""


class LlamaBatch:
    """A `llama_batch` from `llama_batch_init`, freed by `close` (or when collected)."""

    __slots__ = (
        "_embd",
        "_logits",
        "_n_embd",
        "_n_seq_id",
        "_pos",
        "_raw",
        "_seq_id",
        "_token",
        "capacity",
    )

    def __init__(self, capacity: int, n_embd: int = 0) -> None:
        C = llama_lib.lib()
        self.capacity = capacity
        self._n_embd = n_embd
        # The binding's structure and arrays (untyped ctypes objects, private to this class).
        self._raw: Any = C.llama_batch_init(capacity, n_embd, 1)
        b = self._raw
        self._token: Any = b.token
        self._embd = b.embd
        self._pos = b.pos
        self._n_seq_id = b.n_seq_id
        self._seq_id = b.seq_id
        self._logits = b.logits

    @property
    def n_tokens(self) -> int:
        return int(self._raw.n_tokens)

    @n_tokens.setter
    def n_tokens(self, n: int) -> None:
        self._raw.n_tokens = n

    @property
    def raw(self) -> ctypes.Structure | None:
        """The `llama_batch` itself (None once closed)."""
        return self._raw  # type: ignore[no-any-return]

    def put(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        self._token[i] = token
        self._pos[i] = pos
        self._n_seq_id[i] = 1
        self._seq_id[i][0] = seq
        self._logits[i] = logits

    def put_embedding(
        self, i: int, row: npt.NDArray[np.float32], pos: int, seq: int, logits: bool
    ) -> None:
        n = self._n_embd
        if row.shape != (n,):
            raise EngineError(f"an embedding row has {row.size} floats, the batch takes {n}")
        src = np.ascontiguousarray(row, dtype=np.float32)
        ctypes.memmove(ctypes.addressof(self._embd.contents) + i * n * 4, src.ctypes.data, n * 4)
        self._pos[i] = pos
        self._n_seq_id[i] = 1
        self._seq_id[i][0] = seq
        self._logits[i] = logits

    def close(self) -> None:
        if self._raw is not None:
            llama_lib.lib().llama_batch_free(self._raw)
            self._raw = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class LlamaBackend:
    """`ContextBackend` on a llama.cpp context (`ctx`) and its model's vocabulary.
    `owned`: `close` frees the context (else its creator does)."""

    def __init__(
        self,
        ctx: ctypes.c_void_p,
        vocab: ctypes.c_void_p,
        n_vocab: int,
        *,
        owned: bool = False,
        adapt_threads: bool = False,
    ) -> None:
        if not ctx:
            raise EngineError("the model is not loaded")
        C = llama_lib.lib()
        self._C = C
        self._ctx: ctypes.c_void_p | None = ctx
        self._owned = owned
        self._vocab = vocab
        self._mem = C.llama_get_memory(ctx)
        self._n_vocab = n_vocab
        # One row of logits as a ctypes type, made once: a row view per sample is then a
        # buffer at an address (np.ctypeslib.as_array builds a pointer type every call).
        self._row_type = ctypes.c_float * n_vocab
        self._n_batch = int(C.llama_n_batch(ctx))
        self._n_ctx_seq = int(C.llama_n_ctx_seq(ctx))
        self._n_seq_max = int(C.llama_n_seq_max(ctx))
        # Its own buffer: other threads detokenize with the model's at the same time.
        self._piece = ctypes.create_string_buffer(256)
        self._threads = int(C.llama_n_threads(ctx))
        self._threads_batch = int(C.llama_n_threads_batch(ctx))
        self.tuner: ThreadTuner | None = ThreadTuner(self._threads) if adapt_threads else None
        # The model's LoRA adapters (engine.native.lora) and the scales the context applies.
        self.loras: list[LoraAdapter] = []
        self._lora_scales: tuple[float, ...] = ()

    @classmethod
    def open_pooled(
        cls,
        model: ctypes.c_void_p,
        vocab: ctypes.c_void_p,
        n_vocab: int,
        *,
        n_tokens: int,
        n_seq_max: int,
        n_threads: int,
        mean_pooling: bool,
    ) -> LlamaBackend:
        """A context of its own on `model`'s weights that gives pooled outputs (embeddings,
        a reranker's scores): every token of a batch in one ubatch (a non-causal model needs
        its whole input there) and one KV stream for all sequences, so each may be as long as
        `n_tokens`. `mean_pooling`: pool by the mean (a text generator's weights), else as
        the file says."""
        C = llama_lib.lib()
        cp = C.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_tokens
        cp.n_seq_max = n_seq_max
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.embeddings = True
        if mean_pooling:
            cp.pooling_type = _POOLING_MEAN  # else unspecified: the model's own
        ctx = C.llama_init_from_model(model, cp)
        if not ctx:
            raise EngineError("llama.cpp could not create an embeddings context")
        return cls(ctx, vocab, n_vocab, owned=True)

    @classmethod
    def open_scoring(
        cls,
        model: ctypes.c_void_p,
        vocab: ctypes.c_void_p,
        n_vocab: int,
        *,
        n_ctx: int,
        n_seq_max: int,
        n_batch: int,
        n_ubatch: int,
        n_threads: int,
    ) -> LlamaBackend:
        """A context of its own on `model`'s weights that scores a text: `n_seq_max`
        sequences of `n_ctx // n_seq_max` cells each (not unified), every row a batch asks
        logits for kept (`output_logits`). Shaped as llama.cpp's `llama-perplexity` shapes
        its context (a sliding-window cache of the window's size, flash attention and KV
        types at llama.cpp's defaults), so a quant's scores compare with its numbers."""
        C = llama_lib.lib()
        cp = C.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = min(n_ubatch, n_batch)
        cp.n_seq_max = n_seq_max
        cp.kv_unified = False
        cp.swa_full = False
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.embeddings = False
        ctx = C.llama_init_from_model(model, cp)
        if not ctx:
            raise EngineError("llama.cpp could not create a context to score the text")
        return cls(ctx, vocab, n_vocab, owned=True)

    def close(self) -> None:
        """Free the context if this backend opened it (idempotent); a view does nothing."""
        if not self._owned:
            return
        ctx, self._ctx = self._ctx, None
        if ctx:
            self._C.llama_free(ctx)

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_batch(self) -> int:
        return self._n_batch

    @property
    def n_ctx_seq(self) -> int:
        return self._n_ctx_seq

    @property
    def n_seq_max(self) -> int:
        return self._n_seq_max

    def graphs_reused(self) -> int:
        """Decodes that ran llama.cpp's already built graph instead of building one (its
        performance counter, since the context was made)."""
        return int(self._C.llama_perf_context(self._ctx).n_reused)

    # -- batches ----------------------------------------------------------------------------

    def batch(self, capacity: int, n_embd: int = 0) -> LlamaBatch:
        return LlamaBatch(capacity, n_embd)

    def decode(
        self, batch: TokenBatch, *, fixed_threads: bool = False, causal: bool = True
    ) -> None:
        C = self._C
        if not causal:
            C.llama_set_causal_attn(self._ctx, False)
            try:
                self._decode(batch, fixed_threads)
            finally:
                C.llama_set_causal_attn(self._ctx, True)
            return
        self._decode(batch, fixed_threads)

    def _decode(self, batch: TokenBatch, fixed_threads: bool) -> None:
        C = self._C
        tuner = self.tuner
        pinned = fixed_threads and tuner is not None and tuner.current != self._threads
        if pinned:
            self._use_threads(self._threads)
        t0 = time.perf_counter()
        try:
            rc = C.llama_decode(self._ctx, _raw(batch))
            if rc != 0:
                raise DecodeFailed(int(rc))
            C.llama_synchronize(self._ctx)
        finally:
            if pinned:
                assert tuner is not None
                self._use_threads(tuner.current)
        if tuner is not None and not fixed_threads:
            n = tuner.observe(batch.n_tokens, time.perf_counter() - t0)
            if n is not None:
                self._use_threads(n)

    @property
    def threads(self) -> int:
        """The threads the next decode step runs on (fewer than asked while contended)."""
        return self.tuner.current if self.tuner is not None else self._threads

    def _use_threads(self, n: int) -> None:
        # Prompt reading follows the decode count down, and is given its own count back.
        batch = self._threads_batch if n >= self._threads else min(n, self._threads_batch)
        self._C.llama_set_n_threads(self._ctx, n, batch)

    def apply_lora(self, scales: tuple[float, ...]) -> None:
        if scales != self._lora_scales:
            assert self._ctx
            set_adapters(self._ctx, self.loras, scales)
            self._lora_scales = scales

    def encode(self, batch: TokenBatch) -> None:
        rc = self._C.llama_encode(self._ctx, _raw(batch))
        if rc != 0:
            raise DecodeFailed(int(rc))

    # -- outputs ----------------------------------------------------------------------------

    def logits(self, row: int) -> npt.NDArray[np.float32]:
        ptr = self._C.llama_get_logits_ith(self._ctx, row)
        if not ptr:
            raise EngineError(f"batch row {row} has no logits")
        row_data = self._row_type.from_address(ctypes.addressof(ptr.contents))
        return np.frombuffer(memoryview(row_data), dtype=np.float32)

    def output_logits(self, n: int) -> npt.NDArray[np.float32]:
        """The logits of the last decode's `n` output rows (the rows that asked for them,
        in batch order) as one (n, n_vocab) view: valid until this context decodes again."""
        ptr = self._C.llama_get_logits(self._ctx)
        if not ptr:
            raise EngineError("the last batch kept no logits")
        return np.ctypeslib.as_array(ptr, shape=(n, self._n_vocab))

    def pooled(self, seq: int, n: int) -> npt.NDArray[np.float32] | None:
        ptr = self._C.llama_get_embeddings_seq(self._ctx, seq)
        if not ptr:
            return None
        out = np.empty(n, dtype=np.float32)
        ctypes.memmove(out.ctypes.data, ptr, n * 4)
        return out

    # -- sampling ---------------------------------------------------------------------------

    def sampler(self, spec: SamplerSpec) -> Sampler:
        C = self._C
        chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        s = spec
        if s.penalizes:
            C.llama_sampler_chain_add(
                chain,
                C.llama_sampler_init_penalties(
                    self._n_vocab,
                    s.repeat_last_n,
                    s.repeat_penalty,
                    s.frequency_penalty,
                    s.presence_penalty,
                ),
            )
        if s.temperature <= 0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
            return Sampler(chain)
        if s.top_k > 0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(s.top_k))
        if s.top_p < 1.0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_p(s.top_p, 1))
        if s.min_p > 0.0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_min_p(s.min_p, 1))
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_temp(s.temperature))
        seed = s.seed if s.seed is not None else 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: random
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return Sampler(chain)

    def greedy_sampler(self) -> Sampler:
        C = self._C
        chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
        return Sampler(chain)

    def sampler_accept(self, sampler: Sampler, token: int) -> None:
        self._C.llama_sampler_accept(sampler, token)

    def sample(self, sampler: Sampler, row: int) -> int:
        return int(self._C.llama_sampler_sample(sampler, self._ctx, row))

    def sampler_free(self, sampler: Sampler) -> None:
        self._C.llama_sampler_free(sampler)

    # -- vocabulary -------------------------------------------------------------------------

    def is_eog(self, token: int) -> bool:
        return bool(self._C.llama_vocab_is_eog(self._vocab, token))

    def token_to_piece(self, token: int, special: bool) -> bytes:
        C = self._C
        buf = self._piece
        n = C.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n >= 0:
            return buf.raw[:n]
        bigger = ctypes.create_string_buffer(-n)
        n = C.llama_token_to_piece(self._vocab, token, bigger, len(bigger), 0, special)
        return bigger.raw[:n]

    # -- KV cache ---------------------------------------------------------------------------

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(self._C.llama_memory_seq_rm(self._mem, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self._C.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        self._C.llama_memory_seq_keep(self._mem, seq)

    def seq_shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self._C.llama_memory_seq_add(self._mem, seq, p0, p1, delta)

    def clear(self) -> None:
        self._C.llama_memory_clear(self._mem, True)

    def pos_max(self, seq: int) -> int:
        return int(self._C.llama_memory_seq_pos_max(self._mem, seq))

    def state_get(self, seq: int, max_bytes: int) -> bytes | None:
        C = self._C
        size = int(C.llama_state_seq_get_size(self._ctx, seq))
        if size <= 0 or size > max_bytes:
            return None
        buf = (ctypes.c_uint8 * size)()
        written = int(C.llama_state_seq_get_data(self._ctx, buf, size, seq))
        return bytes(buf)[:written] if written > 0 else None

    def state_set(self, seq: int, state: bytes) -> bool:
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        return int(self._C.llama_state_seq_set_data(self._ctx, buf, len(state), seq)) != 0


def max_parallel_sequences() -> int:
    """The most sequences one llama.cpp context may hold (a build constant)."""
    return int(llama_lib.lib().llama_max_parallel_sequences())


def pooled_width(model: ctypes.c_void_p, *, rank: bool) -> int:
    """How many floats one pooled sequence of `model` is: its embedding width, or with
    `rank` the classifier head's outputs (a reranker)."""
    C = llama_lib.lib()
    return int(C.llama_model_n_cls_out(model) if rank else C.llama_model_n_embd(model))


def _raw(batch: TokenBatch) -> ctypes.Structure:
    raw = batch.raw if isinstance(batch, LlamaBatch) else None
    if raw is None:
        raise EngineError("a llama.cpp context decodes only an open LlamaBatch")
    return raw


__all__ = [
    "ContextBackend",
    "DecodeFailed",
    "LlamaBackend",
    "LlamaBatch",
    "Sampler",
    "SamplerSpec",
    "TokenBatch",
    "decode_error",
    "max_parallel_sequences",
    "pooled_width",
]
