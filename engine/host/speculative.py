"""Speculative decoding: a cheap drafter proposes tokens, the model checks them in one batch.

Each step decodes [last token, d1..dk] in one batch with logits at every position,
then samples the model's own token at each position with the request's sampler chain and
accepts drafts while they equal what the model sampled. The first mismatch is replaced by the
model's token (a free extra token when every draft is accepted), and the KV cells of the
rejected drafts are removed with `llama_memory_seq_rm`.

Why this is exact: every token handed out is the model's own sample at that position, drawn
once, from the logits plain decoding would see, with the same sampler chain (penalties, RNG).
Drafts only decide how many positions one decode covers. Greedy output is therefore
token-for-token what plain decoding gives wherever llama.cpp computes a token's logits the same
alone and in a batch (`Model.exactness`, computed by `engine.memory.cpu_kernels` from the build's
kernel rules: not with AMX or repacked weights, nor with types llamafile's sgemm takes), and
with sampling the target's distribution is kept (accepting iff the target's sample equals
a deterministic draft is the standard accept/reject rule for a draft that puts all its mass on
one token).

Two drafters:
- `PromptLookup`: no second model. Finds the longest recent n-gram of the conversation's tail
  earlier in the prompt/history and proposes what followed it there. Wins big when the answer
  quotes its context (extraction, summaries, RAG, code edits). Draft lengths follow the
  measured cost of a verification batch (`VerifyCost`).
- `DraftSeq`: a second, smaller GGUF with the same vocabulary (`Speculator`), drafting
  greedily with a KV sequence per slot of the target kept in step with that slot's
  conversation.

The loop that verifies drafts is the scheduler's (engine.host.scheduler): there is one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from engine.errors import EngineError
from engine.host import decode_guard
from engine.host.prompt_cache import common_prefix
from engine.host.stats import GenerationStats
from engine.memory import cpu_kernels
from engine.native.backend import ContextBackend, DecodeFailed, Sampler, TokenBatch
from engine.settings import DEFAULT_DRAFT_MAX, LoadParams

DEFAULT_MODEL_DRAFT_MAX = 5


class _Markers(Protocol):
    @property
    def bos(self) -> int: ...
    @property
    def eos(self) -> int: ...


class VocabModel(Protocol):
    """What the vocabulary check reads of a loaded model (`engine.host.runtime.Model`)."""

    @property
    def path(self) -> Path: ...
    @property
    def n_vocab(self) -> int: ...
    def special_tokens(self) -> _Markers: ...
    def token_bytes(self, token: int, *, special: bool = False) -> bytes: ...
    def token_text(self, token: int) -> str: ...


class DraftModel(VocabModel, Protocol):
    """A draft model as the `Speculator` drives it: its context's backend and its limits."""

    @property
    def backend(self) -> ContextBackend | None: ...
    @property
    def n_batch(self) -> int: ...
    @property
    def n_ctx_seq(self) -> int: ...
    def recreate_context(self, n_seq_max: int, n_ctx: int) -> None: ...
    def close(self) -> None: ...


class _Placement(Protocol):
    @property
    def n_gpu_layers(self) -> int: ...


class CostModel(Protocol):
    """What picks a model's verification cost curve (`verify_cost`)."""

    @property
    def load_info(self) -> _Placement: ...
    @property
    def amx_weights(self) -> bool: ...
    @property
    def column_kernels(self) -> bool: ...


class CostCurve(Protocol):
    """What decoding n tokens in one batch costs, in one-token decodes (`VerifyCost`, or the
    loop's measured curve, engine.host.draft_gain.MeasuredCost)."""

    def __call__(self, n: int) -> float: ...


@dataclass(frozen=True)
class VerifyCost:
    """What decoding n tokens in one verification batch costs, in one-token decodes: `first`
    for two tokens, `step` for each one more. Where the kernels change with the batch's size
    the curve bends: `then` gives 3, 4, ... tokens size by size, and `step` counts past them.
    Measured inside the speculative loop (docs/speculative.md), graph changes between batch
    shapes included."""

    first: float
    step: float
    then: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.first <= 0 or self.step < 0 or any(c <= 0 for c in self.then):
            raise EngineError("a verification cost needs costs > 0 and step >= 0")

    def __call__(self, n: int) -> float:
        if n <= 1:
            return 1.0
        if n == 2:
            return self.first
        if n - 3 < len(self.then):
            return self.then[n - 3]
        last = self.then[-1] if self.then else self.first
        return last + self.step * (n - 2 - len(self.then))


# SmolLM2, 2 threads. Generic CPU kernels: every position costs about the same again.
COST_CPU = VerifyCost(1.43, 0.43)
# Q4_1 and Q8_0 weights in the project's build on x86 (installers/llama_cpp/quant_columns.patch):
# a weight row is read once for the batch's tokens. Two to four tokens share each block of four
# Q4_1 rows (~0.15 of a decode each); from five, two rows at a time, which costs every token
# more (2-core EPYC, `make setup`'s build, timing loop and decode loop: 2 tokens 1.19-1.24,
# 3 1.32-1.37, 4 1.48-1.53, 5 1.8, 6 2.0-2.1, 8 2.5). Past 8 a batch has no graph lane (17
# tokens: 5.7 decodes).
COST_COLUMNS = VerifyCost(1.2, 0.35, then=(1.35, 1.5, 1.8, 2.0, 2.25, 2.5))
# AMX weights in a build without the project's patch: two tokens already take the 16-row tile
# path (the one-token path is a cheaper vector kernel), after which positions are cheap.
COST_AMX = VerifyCost(1.81, 0.17)
# AMX weights in the project's build (installers/llama_cpp/amx_small_batch.patch): up to 6 rows
# take the vector kernels, so the second token is cheap and each further one costs more.
COST_AMX_SMALL_BATCH = VerifyCost(1.38, 0.29)
# Not measured for verification: the H200's batched decode (8 sequences for 2.6 decodes).
COST_GPU = VerifyCost(1.2, 0.2)

# A request's own check on prompt lookup (`DraftYield`): after this many verified drafts ...
REQUEST_MIN_VERIFIED = 8
REQUEST_DECAY = 0.9  # ... the last ten or so count ...
REQUEST_EXPLORE_EVERY = 8  # ... and while they lose, every 8th chance drafts all the same.
# Chosen by replaying the benchmark's answers (benchmarks/lookup_replay.py): with cheap
# verification (1.24 + 0.22 (n - 2)) it changes nothing, with dear (1.8 + 0.5 (n - 2)) it
# lifts the worst prompt from x0.89 to x0.95; checking after 4 drafts with a decay of 0.8
# lost up to 1.5% with the cheap curve.

# llama.cpp's own speculative example allows vocabularies that differ only in padding.
VOCAB_MAX_SIZE_DIFFERENCE = 128
_VOCAB_SAMPLE = 512


class Drafter(Protocol):
    """Proposes continuations of the conversation; told every token the model commits.
    `sets_length`: the drafter sizes its own drafts (else the loop adapts the length)."""

    sets_length: bool

    def begin(self, tokens: Sequence[int]) -> None: ...

    def accept(self, token: int) -> None: ...

    def propose(self, n: int) -> list[int]: ...

    def end(self) -> None: ...

    def rebind(self, seq: int) -> None:
        """The request moved to another slot (sequence id)."""


class DraftYield:
    """What one request's verified drafts gave against what their steps cost.

    The loop's measured gain (engine.host.draft_gain) belongs to the model and the machine,
    so after requests whose answers quote their prompt it keeps drafting in one whose answer
    does not, and loses there (docs/speculative.md, "The worst prompt"). So each request
    checks its own drafts too: once REQUEST_MIN_VERIFIED have been verified it drafts only
    while they gave more tokens (accepted + the model's own) than their batches cost in
    one-token decodes on the cost curve, sums decayed by REQUEST_DECAY a draft, and while they
    do not, only every REQUEST_EXPLORE_EVERY-th chance (the text may turn to quoting)."""

    def __init__(self) -> None:
        self.gained = 0.0  # tokens the verified drafting steps produced (decayed)
        self.spent = 0.0  # what those steps cost, in one-token decodes (decayed)
        self.verified = 0
        self._chances = 0

    def add(self, drafted: int, accepted: int, cost: CostCurve) -> None:
        self.gained = self.gained * REQUEST_DECAY + 1 + accepted
        self.spent = self.spent * REQUEST_DECAY + cost(1 + drafted)
        self.verified += 1

    def allows(self) -> bool:
        """Whether the next draft may go (counts a chance when drafting loses)."""
        if self.verified < REQUEST_MIN_VERIFIED or self.gained > self.spent:
            return True
        self._chances += 1
        return self._chances % REQUEST_EXPLORE_EVERY == 0


class PromptLookup:
    """N-gram drafting from the prompt and the reply so far (no second model).

    The last `ngram_min` tokens of the history are looked up among the last `candidates`
    earlier places where they occur; of those, the place whose preceding text agrees with the
    history's tail the longest wins (ties: the most recent), and what followed it there is the
    draft. How long the agreement is says how likely the copy is to go on, so it sets the
    draft length (`draft_len`): a long quote gets long drafts, a 2- or 3-token coincidence a
    short one; an equally backed place that continues differently cuts the draft where the two
    part. A match inside the reply itself (a list that repeats) is extended periodically.
    The index is built incrementally: O(new tokens) a step. The loop reports each verified
    draft (`verified`), and a request whose drafts do not pay stops drafting (`DraftYield`).
    """

    sets_length = True

    def __init__(
        self,
        ngram_max: int = 32,
        ngram_min: int = 2,
        candidates: int = 8,
        cost: CostCurve = COST_CPU,
    ) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise EngineError("prompt lookup needs 1 <= ngram_min <= ngram_max")
        self.cost = cost  # the loop swaps in its measured curve (engine.host.draft_gain)
        self.ngram_max = ngram_max  # agreement is measured up to this many tokens
        self.ngram_min = ngram_min
        self.candidates = candidates
        self._h: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0
        self.last_match = 0  # agreement length behind the last proposal (for tests, stats)
        self.yields = DraftYield()

    def begin(self, tokens: Sequence[int]) -> None:
        self._h = list(tokens)
        self._index = {}
        self._indexed = 0
        self.yields = DraftYield()

    def accept(self, token: int) -> None:
        self._h.append(token)

    def verified(self, drafted: int, accepted: int) -> None:
        """The loop verified `drafted` of this drafter's tokens; `accepted` were the model's."""
        self.yields.add(drafted, accepted, self.cost)

    @staticmethod
    def survival(agreement: int) -> tuple[float, float]:
        """(chance the first drafted token is right, chance each next one is) for a match
        backed by `agreement` tokens, measured on the benchmark's quoting answers: after 16+
        agreeing tokens 69% of copies still agree 16 tokens on; after 3-15 half break within
        4; after 2 a third break at once, then as after 3-15."""
        if agreement >= 16:
            return 0.977, 0.977
        if agreement >= 3:
            return 0.84, 0.84
        return 0.67, 0.84

    @staticmethod
    def draft_len(
        agreement: int, cost: CostCurve = COST_CPU, limit: int = DEFAULT_DRAFT_MAX
    ) -> int:
        """How many of a match's tokens to draft (0: decode plainly): the length that gives
        the most expected tokens per unit of decode cost, if that beats a plain step."""
        first, keep = PromptLookup.survival(agreement)
        best_k, best, expected, reach = 0, 1.0, 0.0, first
        for k in range(1, limit + 1):
            expected += reach
            reach *= keep
            value = (1 + expected) / cost(1 + k)
            if value > best:
                best_k, best = k, value
        return best_k

    def propose(self, n: int) -> list[int]:
        h = self._h
        g = self.ngram_min
        last = len(h) - 1
        # Index n-grams ending before the last token, so the tail can only match earlier text.
        index = self._index
        for end in range(max(self._indexed, g - 1), last):
            places = index.setdefault(tuple(h[end + 1 - g : end + 1]), [])
            places.append(end + 1)
            if len(places) > self.candidates:
                del places[0]
        self._indexed = max(self._indexed, last)
        self.last_match = 0
        if n <= 0 or len(h) < g:
            return []
        found = index.get(tuple(h[-g:]))
        if not found:
            return []
        n_h = len(h)
        best, start = 0, -1
        ties: list[int] = []
        for p in reversed(found):  # most recent first: it wins ties
            agree = g
            while (
                agree < self.ngram_max
                and p - 1 - agree >= 0
                and h[p - 1 - agree] == h[n_h - 1 - agree]
            ):
                agree += 1
            if agree > best:
                best, start, ties = agree, p, []
            elif agree == best:
                ties.append(p)
        self.last_match = best
        out: list[int] = []
        for j in range(min(n, DEFAULT_DRAFT_MAX)):
            i = start + j
            # Past the end of the history the match overlaps the tail: the text repeats
            # with period n_h - start, so continue the draft itself.
            out.append(h[i] if i < n_h else out[i - n_h])
        # An equally backed earlier place that goes on differently: the text is not sure
        # how it continues there, so draft only up to where the two part (at least one).
        for p in ties:
            j = 0
            while j < len(out) and p + j < n_h and h[p + j] == out[j]:
                j += 1
            if j < len(out):
                del out[max(j, 1) :]
        out = out[: self.draft_len(best, self.cost, len(out))]
        return out if out and self.yields.allows() else []

    def end(self) -> None:
        pass

    def rebind(self, seq: int) -> None:
        pass


def vocab_size_mismatch(n_target: int, n_draft: int) -> str | None:
    """The first check, from the file headers alone (the app runs it before loading)."""
    if abs(n_target - n_draft) > VOCAB_MAX_SIZE_DIFFERENCE:
        return f"its vocabulary has {n_draft} tokens, the model's has {n_target}"
    return None


def vocab_mismatch(target: VocabModel, draft: VocabModel) -> str | None:
    """Why `draft` cannot draft for `target`, or None when their vocabularies agree."""
    nt, nd = target.n_vocab, draft.n_vocab
    why = vocab_size_mismatch(nt, nd)
    if why is not None:
        return why
    ts, ds = target.special_tokens(), draft.special_tokens()
    for name, a, b in (("BOS", ts.bos, ds.bos), ("EOS", ts.eos, ds.eos)):
        if a != b:
            return f"its {name} token is {b}, the model's is {a}"
    n = min(nt, nd)
    step = max(1, n // _VOCAB_SAMPLE)
    ids = sorted({*range(0, min(n, 64)), *range(0, n, step), n - 1})
    for t in ids:
        if target.token_bytes(t, special=True) != draft.token_bytes(t, special=True):
            return (
                f"token {t} is {draft.token_text(t)!r} in it but {target.token_text(t)!r} "
                "in the model"
            )
    return None


def check_vocab(target: VocabModel, draft: VocabModel) -> None:
    why = vocab_mismatch(target, draft)
    if why is not None:
        raise EngineError(
            f"{draft.path.name} cannot be a draft model for {target.path.name}: {why}; "
            "pick a smaller model of the same family (same tokenizer)"
        )


def draft_params(target: LoadParams, *, n_ctx: int, n_seq_max: int) -> LoadParams:
    """How a draft model is loaded for `target`: a sequence per target slot, each as long as
    the target's (it must see the conversation to draft it), no KV snapshots, the target's
    threads, and no decode loop of its own (the target's drives it)."""
    return LoadParams(
        n_ctx=n_ctx,
        n_seq_max=n_seq_max,
        n_threads=target.n_threads,
        n_threads_batch=target.n_threads_batch,
        n_gpu_layers="auto",
        extra_buffers=target.extra_buffers,
        state_cache_mb=0,
    )


class DraftSeq:
    """Greedy drafting for one slot with the draft model's sequence of the same id.

    Before each proposal the draft's sequence is brought to the history by its common prefix
    (rejected drafts of the previous step are dropped there), then it decodes greedily. What
    the sequence holds is kept by the `Speculator` between requests, so a chat's next turn
    only feeds the draft its new tokens.
    """

    sets_length = False

    def __init__(self, spec: Speculator, seq: int) -> None:
        self._spec = spec
        self.seq = seq
        self._h: list[int] = []
        # The greedy chain and the backend that made it (which frees it).
        self._chain: tuple[ContextBackend, Sampler] | None = None

    def begin(self, tokens: Sequence[int]) -> None:
        backend = self._spec.backend()
        self._chain = (backend, backend.greedy_sampler())
        self._h = list(tokens)

    def accept(self, token: int) -> None:
        self._h.append(token)

    def rebind(self, seq: int) -> None:
        """The slot's request moved to sequence `seq`: draft there from now on."""
        self._spec.drop(self.seq)
        self._spec.drop(seq)
        self.seq = seq

    def propose(self, n: int) -> list[int]:
        spec = self._spec
        d = spec.draft
        if n <= 0 or len(self._h) + n >= d.n_ctx_seq:
            return []  # the conversation outgrew the draft's context: plain decoding
        spec.sync(self.seq, self._h)
        backend = spec.backend()
        assert self._chain is not None
        chain = self._chain[1]
        cached = spec.tokens(self.seq)
        out: list[int] = []
        for j in range(n):
            tok = backend.sample(chain, -1)
            if tok >= spec.limit or backend.is_eog(tok):
                break
            out.append(tok)
            if j < n - 1:
                spec.decode(self.seq, [tok], len(cached))
                cached.append(tok)
        return out

    def end(self) -> None:
        if self._chain is not None:
            owner, chain = self._chain
            self._chain = None
            owner.sampler_free(chain)


class Speculator:
    """A loaded draft model serving the target's slots: sequence i of the draft follows slot
    i of the target. Driven from the target's decode thread only."""

    def __init__(self, target: VocabModel, draft: DraftModel) -> None:
        check_vocab(target, draft)
        self.draft = draft
        self.limit = target.n_vocab
        self._tokens: dict[int, list[int]] = {}
        self._batch: TokenBatch | None = self.backend().batch(draft.n_batch)

    def backend(self) -> ContextBackend:
        """The draft's context now (it is recreated when the target's is)."""
        backend = self.draft.backend
        if backend is None:
            raise EngineError(f"{self.draft.path.name} has been unloaded")
        return backend

    def drafter(self, seq: int) -> DraftSeq:
        return DraftSeq(self, seq)

    def tokens(self, seq: int) -> list[int]:
        return self._tokens.setdefault(seq, [])

    def drop(self, seq: int) -> None:
        self.backend().seq_rm(seq)
        self._tokens.pop(seq, None)

    def clear(self) -> None:
        self.backend().clear()
        self._tokens.clear()

    def decode(self, seq: int, tokens: Sequence[int], pos: int) -> None:
        """Decode `tokens` at `pos...` into sequence `seq`, logits for the last one."""
        b = self._batch
        if b is None:
            raise EngineError(f"{self.draft.path.name} has been unloaded")
        last = len(tokens) - 1
        for i, t in enumerate(tokens):
            b.put(i, t, pos + i, seq, i == last)
        b.n_tokens = len(tokens)
        try:
            self.backend().decode(b)
        except DecodeFailed as e:
            self.drop(seq)
            raise EngineError(f"draft model: {e}") from e

    def sync(self, seq: int, history: list[int]) -> None:
        """Bring sequence `seq` to history[:-1] + the last token decoded with logits."""
        d = self.draft
        backend = self.backend()
        cached = self.tokens(seq)
        n_common = min(common_prefix(cached, history), len(history) - 1)
        if n_common < len(cached) and not backend.seq_rm(seq, n_common, -1):
            backend.seq_rm(seq)  # e.g. sliding-window caches
            n_common = 0
        del cached[n_common:]
        rest = history[n_common:]
        decode_guard.check_room(n_common, len(rest), d.n_ctx_seq)
        for i in range(0, len(rest), d.n_batch):
            chunk = rest[i : i + d.n_batch]
            self.decode(seq, chunk, len(cached))
            cached.extend(chunk)

    def recreate(self, n_seq_max: int, n_ctx_seq: int) -> None:
        """Follow the target's new context: a sequence per slot, as long as the target's."""
        self._tokens.clear()
        self.draft.recreate_context(n_seq_max, n_ctx_seq * n_seq_max)

    def close(self) -> None:
        if self._batch is not None:
            self._batch.close()
            self._batch = None
        with contextlib.suppress(Exception):
            self.draft.close()


def propose_drafts(drafter: Drafter, backend: ContextBackend, room: int) -> list[int]:
    """Up to `room` drafted tokens, cut before the first that must never be decoded: an
    end-of-generation token, or an id outside the model's vocabulary."""
    drafts = drafter.propose(room) if room > 0 else []
    n_vocab = backend.n_vocab
    for j, t in enumerate(drafts):
        if not 0 <= t < n_vocab or backend.is_eog(t):
            return drafts[:j]
    return drafts


def trim_sequence(backend: ContextBackend, seq: int, tokens: list[int], keep: int) -> None:
    """Drop sequence `seq`'s KV cells from position `keep` on, and `tokens` (what the caller
    knows it holds) with them. A cache that cannot drop a tail (some recurrent and
    sliding-window layouts) loses the whole sequence rather than keep cells nobody knows of."""
    if len(tokens) <= keep:
        return
    if not backend.seq_rm(seq, keep, -1):
        backend.seq_rm(seq)
        keep = 0
    del tokens[keep:]


def verify_cost(m: CostModel) -> VerifyCost:
    """The verification cost curve of this model's kernels (COST_*)."""
    if m.load_info.n_gpu_layers > 0:
        return COST_GPU
    if not m.amx_weights:
        return COST_COLUMNS if m.column_kernels else COST_CPU
    return COST_AMX_SMALL_BATCH if cpu_kernels.detect().amx_small_batch else COST_AMX


def acceptance_rate(stats: GenerationStats) -> float | None:
    """Accepted / drafted, or None when nothing was drafted."""
    if stats.draft_tokens <= 0:
        return None
    return stats.draft_accepted / stats.draft_tokens


def spec_stats(stats: GenerationStats) -> dict[str, Any]:
    """The speculative figures for a performance panel or a JSON response."""
    rate = acceptance_rate(stats)
    gain = stats.draft_gain
    return {
        "draft_tokens": stats.draft_tokens,
        "draft_accepted": stats.draft_accepted,
        "acceptance_rate": None if rate is None else round(rate, 4),
        "draft_gain": None if gain is None else round(gain, 3),
    }


__all__ = [
    "COST_AMX",
    "COST_AMX_SMALL_BATCH",
    "COST_COLUMNS",
    "COST_CPU",
    "COST_GPU",
    "DEFAULT_MODEL_DRAFT_MAX",
    "REQUEST_DECAY",
    "REQUEST_EXPLORE_EVERY",
    "REQUEST_MIN_VERIFIED",
    "CostCurve",
    "CostModel",
    "DraftModel",
    "DraftSeq",
    "DraftYield",
    "Drafter",
    "PromptLookup",
    "Speculator",
    "VerifyCost",
    "VocabModel",
    "acceptance_rate",
    "check_vocab",
    "draft_params",
    "propose_drafts",
    "spec_stats",
    "trim_sequence",
    "verify_cost",
    "vocab_mismatch",
    "vocab_size_mismatch",
]
