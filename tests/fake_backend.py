"""A llama.cpp context without a model, for tests: the real decode loop runs on it.

`FakeBackend` has the interface of `engine.native.backend.ContextBackend`. Its "model" is a
function of what a sequence's KV cells hold (by default a rolling hash of every token in
them, so the next token changes when any cell does), and it keeps real KV bookkeeping per
sequence: positions, remove/copy/keep/shift, state save and restore. So a test of the
scheduler's KV layout (prefix reuse, copies between slots, moves, trims) fails when the
layout is wrong, just as the model tests' greedy text would change.

It checks a batch the way llama.cpp does: a sequence's positions in a batch must continue
from the highest one it holds, a sequence holds at most `n_ctx_seq` cells, ids stop at
`n_seq_max`, and rows without logits have no output. A refusal raises `DecodeFailed` with
llama.cpp's return code and leaves the cells untouched.

`FakeVocab` is a tiny word-piece vocabulary: a piece is a word with the whitespace before
it, as BPE vocabularies cut most text. Token 0 is the end-of-generation token.
"""

from __future__ import annotations

import re
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from engine.decoding.constraints import TokenMask
from engine.errors import EngineError
from engine.host.prompt_cache import PromptStateCache
from engine.host.scheduler import Scheduler
from engine.host.speculative import Speculator
from engine.memory.actual import ActualMemory
from engine.memory.cpu_kernels import SplitRule
from engine.native.backend import DecodeFailed, Sampler, SamplerSpec, TokenBatch
from engine.settings import LoadParams

EOG = 0
EOG_PIECE = "</s>"
# Words the default "model" writes, so its text reads as words (tests assert on ids mostly).
WORDS = (
    " the cat sat on a mat and then it ran to see one big red dog that was"
    " very happy with all of its small friends in our old town by river"
)
_PIECE = re.compile(r"\s*\S+|\s+")

# The logit of the token the model chooses; every other piece gets 0 (ids no piece has yet,
# -inf). Greedy always takes it; at temperature 1 over the default ~30 words it is drawn
# about 80% of the time. A scripted model sets it high enough that any sampling follows it.
CHOSEN_LOGIT = 5.0

NextToken = Callable[[Sequence[int]], int]


class FakeVocab:
    """Word-pieces to ids and back; grows as text is tokenized, up to `capacity` ids."""

    def __init__(self, words: str = WORDS, *, capacity: int = 1 << 12) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._pieces: list[str] = [EOG_PIECE]
        self._ids: dict[str, int] = {}
        self.tokenize(words)

    def __len__(self) -> int:
        return len(self._pieces)

    def tokenize(self, text: str) -> list[int]:
        with self._lock:
            out = []
            for piece in _PIECE.findall(text):
                tok = self._ids.get(piece)
                if tok is None:
                    if len(self._pieces) >= self.capacity:
                        raise EngineError(f"the fake vocabulary is full ({self.capacity} pieces)")
                    tok = self._ids[piece] = len(self._pieces)
                    self._pieces.append(piece)
                out.append(tok)
            return out

    def piece(self, token: int, special: bool = False) -> bytes:
        if token == EOG:
            return EOG_PIECE.encode() if special else b""
        return self._pieces[token].encode()

    def detokenize(self, tokens: Iterable[int]) -> str:
        return "".join(self.piece(t).decode() for t in tokens)


def hash_next(n_words: int) -> NextToken:
    """The default model: a token after any history, chosen by a hash of all of it, never
    the end of generation (so `max_tokens` or a stop string ends a reply)."""

    def next_token(history: Sequence[int]) -> int:
        return 1 + hash(tuple(history)) % (n_words - 1)  # ints hash alike in every process

    return next_token


def paced(next_token: NextToken, seconds: float) -> NextToken:
    """`next_token` taking `seconds` a row, like a real model: a long reply then stays in
    flight long enough for a test to act while it runs (cancel it, queue beside it)."""

    def slow(history: Sequence[int]) -> int:
        time.sleep(seconds)
        return next_token(history)

    return slow


@dataclass
class FakeBatch:
    """A `TokenBatch`: rows of (token or embedding, position, sequence, wants logits)."""

    capacity: int
    n_embd: int = 0
    n_tokens: int = 0
    rows: list[tuple[int, int, int, bool] | None] = field(default_factory=list)
    closed: bool = False

    def __post_init__(self) -> None:
        self.rows = [None] * self.capacity

    def put(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        self.rows[i] = (token, pos, seq, bool(logits))

    def put_embedding(
        self, i: int, row: npt.NDArray[np.float32], pos: int, seq: int, logits: bool
    ) -> None:
        if row.shape != (self.n_embd,):
            raise EngineError(
                f"an embedding row has {row.size} floats, the batch takes {self.n_embd}"
            )
        # An embedding stands in the cell as a token no text has (negative, from its bytes).
        token = -1 - (hash(row.astype(np.float32).tobytes()) & 0x7FFFFFFF)
        self.rows[i] = (token, pos, seq, bool(logits))

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeSampler:
    """A sampler chain: greedy, or temperature sampling (top-k, top-p) from a seeded stream,
    with llama.cpp's repeat/frequency/presence penalties over what it accepted."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    repeat_last_n: int = 0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    accepted: list[int] = field(default_factory=list)
    freed: bool = False

    def __post_init__(self) -> None:
        # llama.cpp takes the seed as uint32 (a negative one wraps), as LlamaBackend passes it.
        self.rng = np.random.default_rng(None if self.seed is None else self.seed & 0xFFFFFFFF)

    def choose(self, logits: npt.NDArray[np.float32]) -> int:
        z = logits.astype(np.float64)
        recent = self.accepted[-self.repeat_last_n :] if self.repeat_last_n > 0 else []
        for tok in set(recent):
            if 0 <= tok < z.size:
                z[tok] = (
                    z[tok] / self.repeat_penalty if z[tok] > 0 else z[tok] * self.repeat_penalty
                )
                z[tok] -= recent.count(tok) * self.frequency_penalty + self.presence_penalty
        if self.temperature <= 0:
            return int(np.argmax(z))
        order = np.argsort(-z, kind="stable")
        if self.top_k > 0:
            order = order[: self.top_k]
        p = np.exp((z[order] - z[order[0]]) / self.temperature)
        p /= p.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p)) + 1
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        return int(order[self.rng.choice(order.size, p=p)])


class FakeBackend:
    """`ContextBackend` over the KV cells of `n_seq_max` sequences and a scripted model.

    `next_token(history)` is the model: the token after `history`, the tokens a sequence
    holds through the row's position. Counters (`decodes`, `rows_decoded`, `copies`,
    `states_saved`, `states_restored`) let a test check what the loop asked for."""

    def __init__(
        self,
        *,
        n_seq_max: int = 4,
        n_ctx_seq: int = 256,
        n_batch: int = 64,
        vocab: FakeVocab | None = None,
        next_token: NextToken | None = None,
        n_embd: int = 8,
        chosen_logit: float = CHOSEN_LOGIT,
    ) -> None:
        self.vocab = vocab or FakeVocab()
        self.chosen_logit = chosen_logit
        self._n_vocab = self.vocab.capacity
        self._n_batch = n_batch
        self._n_ctx_seq = n_ctx_seq
        self._n_seq_max = n_seq_max
        self.n_embd = n_embd
        self.fixed_thread_steps = 0  # decodes asked to run on the load's own thread count
        self.non_causal_steps = 0  # decodes whose rows attend both ways (a projector's image)
        self.next_token = next_token or hash_next(len(self.vocab))
        self.cells: list[dict[int, int]] = [{} for _ in range(n_seq_max)]
        self._out = np.zeros((0, self._n_vocab), dtype=np.float32)
        self._out_rows: list[int] = []  # batch row of each output row
        self._pool_src: dict[int, dict[int, int]] = {}
        self.decodes = 0
        self.rows_decoded = 0
        self.copies = 0
        self.states_saved = 0
        self.states_restored = 0
        # A test makes the next decode fail with this llama.cpp return code (then it resets).
        self.fail_next: int | None = None
        # LoRA scales as the loop set them, and each decode's (scales, sequences).
        self.lora: tuple[float, ...] = ()
        self.lora_batches: list[tuple[tuple[float, ...], frozenset[int]]] = []

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

    # -- what a sequence holds ---------------------------------------------------------------

    def tokens(self, seq: int) -> list[int]:
        """The tokens `seq` holds, by position (what the model reads)."""
        cells = self.cells[seq]
        return [cells[p] for p in sorted(cells)]

    # -- batches -----------------------------------------------------------------------------

    def batch(self, capacity: int, n_embd: int = 0) -> FakeBatch:
        return FakeBatch(capacity, n_embd)

    def decode(
        self, batch: TokenBatch, *, fixed_threads: bool = False, causal: bool = True
    ) -> None:
        if not causal:
            self.non_causal_steps += 1
        if fixed_threads:
            self.fixed_thread_steps += 1
        if isinstance(batch, FakeBatch):
            seqs = frozenset(r[2] for r in batch.rows[: batch.n_tokens] if r is not None)
            self.lora_batches.append((self.lora, seqs))
        self._run(batch, keep=True)

    def apply_lora(self, scales: tuple[float, ...]) -> None:
        self.lora = scales

    def encode(self, batch: TokenBatch) -> None:
        self._run(batch, keep=False)

    def _run(self, batch: TokenBatch, *, keep: bool) -> None:
        if not isinstance(batch, FakeBatch):
            raise EngineError("a fake context decodes only its own batches")
        if batch.closed:
            raise EngineError("the batch has been freed")
        if self.fail_next is not None:
            rc, self.fail_next = self.fail_next, None
            raise DecodeFailed(rc)
        n = batch.n_tokens
        if n <= 0 or n > batch.capacity or n > self._n_batch:
            raise DecodeFailed(-1)
        rows = batch.rows[:n]
        if any(r is None for r in rows):
            raise DecodeFailed(-1)
        # llama.cpp's checks, before anything is written.
        nxt = {s: self.pos_max(s) + 1 for s in range(self._n_seq_max)}
        added = [0] * self._n_seq_max
        for r in rows:
            assert r is not None
            _, pos, seq, _ = r
            if not 0 <= seq < self._n_seq_max:
                raise DecodeFailed(-1)
            if keep and pos != nxt[seq]:
                raise DecodeFailed(-1)  # positions must continue the sequence
            nxt[seq] = pos + 1
            added[seq] += 1
        if keep and any(
            len(self.cells[s]) + added[s] > self._n_ctx_seq for s in range(self._n_seq_max)
        ):
            raise DecodeFailed(1)  # no free KV slot for the batch
        outs: list[int] = []
        views: dict[int, dict[int, int]] = {}
        for i, r in enumerate(rows):
            assert r is not None
            tok, pos, seq, want = r
            cells = self.cells[seq] if keep else views.setdefault(seq, {})
            cells[pos] = tok
            if want:
                outs.append(i)
        out = np.zeros((len(outs), self._n_vocab), dtype=np.float32)
        out[:, len(self.vocab) :] = -np.inf
        for j, i in enumerate(outs):
            r = rows[i]
            assert r is not None
            _, pos, seq, _ = r
            cells = self.cells[seq] if keep else views[seq]
            history = [cells[p] for p in sorted(cells) if p <= pos]
            out[j, self.next_token(history)] = self.chosen_logit
        self._out, self._out_rows = out, outs
        # Pooled on demand (few callers want it): what each sequence of the batch holds.
        self._pool_src = {
            seq: (self.cells[seq] if keep else views[seq]) for _, _, seq, _ in filter(None, rows)
        }
        self.decodes += 1
        self.rows_decoded += n

    # -- outputs -----------------------------------------------------------------------------

    def logits(self, row: int) -> npt.NDArray[np.float32]:
        j = len(self._out_rows) - 1 if row == -1 else _index(self._out_rows, row)
        if j < 0:
            raise EngineError(f"batch row {row} has no logits")
        return self._out[j]

    def pooled(self, seq: int, n: int) -> npt.NDArray[np.float32] | None:
        cells = self._pool_src.get(seq)
        return None if not cells else _pooled([cells[p] for p in sorted(cells)], n)

    # -- sampling ----------------------------------------------------------------------------

    def sampler(self, spec: SamplerSpec) -> Sampler:
        s = spec
        return Sampler(
            FakeSampler(
                temperature=s.temperature,
                top_k=s.top_k,
                top_p=s.top_p,
                seed=s.seed,
                repeat_last_n=s.repeat_last_n if s.penalizes else 0,
                repeat_penalty=s.repeat_penalty if s.penalizes else 1.0,
                frequency_penalty=s.frequency_penalty if s.penalizes else 0.0,
                presence_penalty=s.presence_penalty if s.penalizes else 0.0,
            )
        )

    def greedy_sampler(self) -> Sampler:
        return Sampler(FakeSampler())

    def sampler_accept(self, sampler: Sampler, token: int) -> None:
        _sampler(sampler).accepted.append(token)

    def sample(self, sampler: Sampler, row: int) -> int:
        s = _sampler(sampler)
        tok = s.choose(self.logits(row))
        s.accepted.append(tok)
        return tok

    def sampler_free(self, sampler: Sampler) -> None:
        s = _sampler(sampler)
        if s.freed:
            raise EngineError("a sampler chain freed twice")
        s.freed = True

    # -- vocabulary --------------------------------------------------------------------------

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def token_to_piece(self, token: int, special: bool) -> bytes:
        return self.vocab.piece(token, special)

    # -- KV cache ----------------------------------------------------------------------------

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        for s in self._seqs(seq):
            cells = self.cells[s]
            for p in [p for p in cells if _inside(p, p0, p1)]:
                del cells[p]
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        # One KV stream per sequence (llama.cpp's default): a copy is of the whole stream.
        self.copies += 1
        if src == dst:
            return
        self.cells[dst] = {p: t for p, t in self.cells[src].items() if _inside(p, p0, p1)}

    def seq_keep(self, seq: int) -> None:
        for s in range(self._n_seq_max):
            if s != seq:
                self.cells[s].clear()

    def seq_shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        for s in self._seqs(seq):
            cells = self.cells[s]
            moved = {p + delta: t for p, t in cells.items() if _inside(p, p0, p1)}
            kept = {p: t for p, t in cells.items() if not _inside(p, p0, p1)}
            self.cells[s] = {**kept, **{p: t for p, t in moved.items() if p >= 0}}

    def clear(self) -> None:
        for cells in self.cells:
            cells.clear()

    def pos_max(self, seq: int) -> int:
        cells = self.cells[seq]
        return max(cells) if cells else -1

    def state_get(self, seq: int, max_bytes: int) -> bytes | None:
        cells = self.cells[seq]
        if not cells:
            return None
        data = b"FAKEKV" + b"".join(struct.pack("<qq", p, t) for p, t in sorted(cells.items()))
        if len(data) > max_bytes:
            return None
        self.states_saved += 1
        return data

    def state_set(self, seq: int, state: bytes) -> bool:
        body = state[6:]
        if not state.startswith(b"FAKEKV") or len(body) % 16:
            return False
        self.cells[seq] = dict(struct.iter_unpack("<qq", body))
        self.states_restored += 1
        return True

    def _seqs(self, seq: int) -> range:
        return range(self._n_seq_max) if seq < 0 else range(seq, seq + 1)


def _inside(p: int, p0: int, p1: int) -> bool:
    return (p0 < 0 or p >= p0) and (p1 < 0 or p < p1)


def _index(rows: list[int], row: int) -> int:
    try:
        return rows.index(row)
    except ValueError:
        return -1


def _sampler(sampler: Sampler) -> FakeSampler:
    if not isinstance(sampler, FakeSampler):
        raise EngineError("not a sampler of this backend")
    if sampler.freed:
        raise EngineError("the sampler chain has been freed")
    return sampler


def _pooled(tokens: list[int], n: int) -> npt.NDArray[np.float32]:
    """A unit vector that depends on every token (mean pooling of seeded token vectors)."""
    vec = np.zeros(n, dtype=np.float64)
    for t in tokens:
        vec += np.random.default_rng(t & 0xFFFFFFFF).standard_normal(n)
    norm = float(np.linalg.norm(vec)) or 1.0
    return (vec / norm).astype(np.float32)


@dataclass(frozen=True)
class FakeLoadInfo:
    """How the fake was "loaded" (what `Model.load_info` tells the loop and the server)."""

    n_gpu_layers: int = 0
    n_threads: int = 1


class FakeLoopModel:
    """A loaded model as its `Scheduler` sees it (engine.host.loop_model.LoopModel), on a
    `FakeBackend`: what `Model` gives the loop, and nothing else.

    `recreate_context` builds a new backend of the asked shape with the same vocabulary and
    model, as `Model` recreates its context on the same weights; `refuse_contexts_over`
    makes it refuse a context of more cells, as llama.cpp does when memory runs out (the old
    context stays). `stream_bytes`: what one sequence's KV stream weighs (the loop weighs a
    copy between slots against prefilling by it)."""

    def __init__(
        self,
        *,
        n_slots: int = 4,
        n_ctx_seq: int = 256,
        n_batch: int = 64,
        vocab: FakeVocab | None = None,
        next_token: NextToken | None = None,
        state_cache_bytes: int = 0,
        stream_bytes: int = 0,
        chosen_logit: float = CHOSEN_LOGIT,
    ) -> None:
        self._chosen_logit = chosen_logit
        self.vocab = vocab or FakeVocab()
        self._next_token = next_token or hash_next(len(self.vocab))
        self.params = LoadParams(n_ctx=n_slots * n_ctx_seq, n_seq_max=n_slots, n_batch=n_batch)
        self.backend: FakeBackend | None = self._backend(n_slots, n_ctx_seq)
        self.split_rule: SplitRule = "any"
        self.flash_attn_on = False
        self.state_cache = PromptStateCache(state_cache_bytes) if state_cache_bytes else None
        self.speculator: Speculator | None = None
        self.load_info = FakeLoadInfo()
        self.amx_weights = False
        self.column_kernels = False
        self.memory_actual = ActualMemory(
            weights_bytes=0,
            kv_bytes=stream_bytes * n_slots,
            compute_bytes=0,
            output_bytes=0,
            devices={"CPU": stream_bytes * n_slots},
        )
        self.refuse_contexts_over: int | None = None
        self.contexts_made = 1
        self.scheduler: Scheduler | None = None
        self.lora_scales: tuple[float, ...] = ()

    def _backend(self, n_seq_max: int, n_ctx_seq: int) -> FakeBackend:
        return FakeBackend(
            n_seq_max=n_seq_max,
            n_ctx_seq=n_ctx_seq,
            n_batch=self.params.n_batch,
            vocab=self.vocab,
            next_token=self._next_token,
            chosen_logit=self._chosen_logit,
        )

    @property
    def loop(self) -> Scheduler:
        """The one decode loop, made on first use (as a loaded `Model` has one)."""
        if self.scheduler is None:
            self.scheduler = Scheduler(self)
        if self.scheduler.closed:
            raise EngineError("the fake model has been unloaded")
        return self.scheduler

    def grammar_mask(self, grammar: str) -> TokenMask:
        raise EngineError("the fake model has no grammar support")

    def recreate_context(self, n_seq_max: int, n_ctx: int) -> None:
        limit = self.refuse_contexts_over
        if limit is not None and n_ctx > limit:
            raise EngineError(f"could not make room for {n_ctx} cells (the limit is {limit})")
        self.backend = self._backend(n_seq_max, n_ctx // max(n_seq_max, 1))
        self.params = replace(self.params, n_ctx=n_ctx, n_seq_max=n_seq_max)
        self.contexts_made += 1

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        self.backend = None


__all__ = [
    "EOG",
    "FakeBackend",
    "FakeBatch",
    "FakeLoadInfo",
    "FakeLoopModel",
    "FakeSampler",
    "FakeVocab",
    "NextToken",
    "hash_next",
    "paced",
]
