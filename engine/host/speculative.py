"""Speculative decoding: a cheap drafter proposes tokens, the model checks them in one batch.

Each step decodes [last token, d1..dk] in one `llama_decode` with logits at every position,
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
- `DraftModel`: a second, smaller GGUF with the same vocabulary, drafting greedily with its own
  KV cache kept in step with the conversation.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.errors import EngineError
from engine.host import decode_guard
from engine.host.prompt_cache import common_prefix
from engine.host.runtime import Generation, GenerationStats, Model, TokenSource
from engine.settings import DEFAULT_DRAFT_MAX, LoadParams, SpeculativeSettings

DEFAULT_MODEL_DRAFT_MAX = 5


@dataclass(frozen=True)
class VerifyCost:
    """What decoding n tokens in one verification batch costs, in one-token decodes: `first`
    for two tokens, `step` for each one more. Measured inside the speculative loop
    (docs/speculative.md), graph changes between batch shapes included."""

    first: float
    step: float

    def __post_init__(self) -> None:
        if self.first <= 0 or self.step < 0:
            raise EngineError("a verification cost needs first > 0 and step >= 0")

    def __call__(self, n: int) -> float:
        return 1.0 if n <= 1 else self.first + self.step * (n - 2)


# SmolLM2, 2 threads. Generic CPU kernels: every position costs about the same again.
COST_CPU = VerifyCost(1.43, 0.43)
# AMX weights: two tokens already take the 16-row tile path (the one-token path is a cheaper
# vector kernel), after which positions are cheap.
COST_AMX = VerifyCost(1.81, 0.17)
# Not measured for verification: the H200's batched decode (8 sequences for 2.6 decodes).
COST_GPU = VerifyCost(1.2, 0.2)

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


class PromptLookup:
    """N-gram drafting from the prompt and the reply so far (no second model).

    The last `ngram_min` tokens of the history are looked up among the last `candidates`
    earlier places where they occur; of those, the place whose preceding text agrees with the
    history's tail the longest wins (ties: the most recent), and what followed it there is the
    draft. How long the agreement is says how likely the copy is to go on, so it sets the
    draft length (`draft_len`): a long quote gets long drafts, a 2- or 3-token coincidence a
    short one; an equally backed place that continues differently cuts the draft where the two
    part. A match inside the reply itself (a list that repeats) is extended periodically.
    The index is built incrementally: O(new tokens) a step.
    """

    sets_length = True

    def __init__(self, ngram_max: int = 32, ngram_min: int = 2, candidates: int = 8,
                 cost: VerifyCost = COST_CPU) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise EngineError("prompt lookup needs 1 <= ngram_min <= ngram_max")
        self.cost = cost
        self.ngram_max = ngram_max  # agreement is measured up to this many tokens
        self.ngram_min = ngram_min
        self.candidates = candidates
        self._h: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0
        self.last_match = 0  # agreement length behind the last proposal (for tests, stats)

    def begin(self, tokens: Sequence[int]) -> None:
        self._h = list(tokens)
        self._index = {}
        self._indexed = 0

    def accept(self, token: int) -> None:
        self._h.append(token)

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
    def draft_len(agreement: int, cost: VerifyCost = COST_CPU,
                  limit: int = DEFAULT_DRAFT_MAX) -> int:
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
            while (agree < self.ngram_max and p - 1 - agree >= 0
                   and h[p - 1 - agree] == h[n_h - 1 - agree]):
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
                del out[max(j, 1):]
        return out[:self.draft_len(best, self.cost, len(out))]

    def end(self) -> None:
        pass


def vocab_size_mismatch(n_target: int, n_draft: int) -> str | None:
    """The first check, from the file headers alone (the app runs it before loading)."""
    if abs(n_target - n_draft) > VOCAB_MAX_SIZE_DIFFERENCE:
        return f"its vocabulary has {n_draft} tokens, the model's has {n_target}"
    return None


def vocab_mismatch(target: Model, draft: Model) -> str | None:
    """Why `draft` cannot draft for `target`, or None when their vocabularies agree."""
    nt, nd = target.n_vocab, draft.n_vocab
    why = vocab_size_mismatch(nt, nd)
    if why is not None:
        return why
    C = target._lib
    for name in ("llama_vocab_bos", "llama_vocab_eos"):
        a = int(getattr(C, name)(target._vocab))
        b = int(getattr(C, name)(draft._vocab))
        if a != b:
            return f"its {name[-3:].upper()} token is {b}, the model's is {a}"
    n = min(nt, nd)
    step = max(1, n // _VOCAB_SAMPLE)
    ids = sorted({*range(0, min(n, 64)), *range(0, n, step), n - 1})
    for t in ids:
        if target.token_bytes(t, special=True) != draft.token_bytes(t, special=True):
            return (f"token {t} is {draft.token_text(t)!r} in it but {target.token_text(t)!r} "
                    "in the model")
    return None


def check_vocab(target: Model, draft: Model) -> None:
    why = vocab_mismatch(target, draft)
    if why is not None:
        raise EngineError(
            f"{draft.path.name} cannot be a draft model for {target.path.name}: {why}; "
            "pick a smaller model of the same family (same tokenizer)"
        )


def load_draft_model(path: str | os.PathLike[str], target: Model, *,
                     n_ctx: int | None = None, n_threads: int | None = None,
                     n_gpu_layers: Any = "auto") -> Model:
    """Load `path` as a draft for `target`; refused (and closed) when the vocabularies differ.

    The draft gets the target's context length by default (it must see the conversation to
    draft it), no KV snapshot cache, and the target's thread count.
    """
    params = LoadParams(
        n_ctx=n_ctx or target.n_ctx,
        n_threads=n_threads or target.params.n_threads,
        n_threads_batch=n_threads or target.params.n_threads_batch,
        n_gpu_layers=n_gpu_layers,
        extra_buffers=target.params.extra_buffers,
        state_cache_mb=0,
    )
    draft = Model(path, params, first_loads=target.first_loads)
    try:
        check_vocab(target, draft)
    except BaseException:
        draft.close()
        raise
    return draft


class DraftModel:
    """Greedy drafting with a second model whose KV cache follows the conversation.

    Before each proposal the draft's cache is brought to the history by its common prefix
    (rejected drafts of the previous step are dropped there), then it decodes greedily.
    """

    sets_length = False

    def __init__(self, draft: Model, target: Model) -> None:
        check_vocab(target, draft)
        self.draft = draft
        self._limit = target.n_vocab
        self._h: list[int] = []
        self._chain: Any = None
        self._locked = False

    def begin(self, tokens: Sequence[int]) -> None:
        d = self.draft
        if not d._lock.acquire(blocking=False):
            raise EngineError("the draft model is busy with another generation")
        self._locked = True
        C = d._lib
        self._chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        C.llama_sampler_chain_add(self._chain, C.llama_sampler_init_greedy())
        self._h = list(tokens)

    def accept(self, token: int) -> None:
        self._h.append(token)

    def _sync(self) -> None:
        """Bring the draft's KV cache to history[:-1] + the last token decoded with logits."""
        d = self.draft
        C = d._lib
        h = self._h
        cached = d._cached
        n_common = min(common_prefix(cached, h), len(h) - 1)
        if n_common < len(cached) and not C.llama_memory_seq_rm(d._memory, 0, n_common, -1):
            C.llama_memory_clear(d._memory, True)  # e.g. sliding-window caches
            n_common = 0
        del cached[n_common:]
        rest = h[n_common:]
        decode_guard.check_room(n_common, len(rest), d.n_ctx_seq)
        for i in range(0, len(rest), d.n_batch):
            chunk = rest[i : i + d.n_batch]
            arr = (C.llama_token * len(chunk))(*chunk)
            rc = C.llama_decode(d._ctx, C.llama_batch_get_one(arr, len(chunk)))
            if rc != 0:
                d.reset_cache()
                raise EngineError("draft model: " + decode_guard.decode_error(rc))
            cached.extend(chunk)

    def propose(self, n: int) -> list[int]:
        d = self.draft
        if n <= 0 or len(self._h) + n >= d.n_ctx:
            return []  # the conversation outgrew the draft's context: plain decoding
        self._sync()
        C = d._lib
        ctx = d._ctx
        arr = (C.llama_token * 1)()
        one = C.llama_batch_get_one(arr, 1)
        out: list[int] = []
        for j in range(n):
            tok = int(C.llama_sampler_sample(self._chain, ctx, -1))
            if tok >= self._limit or C.llama_vocab_is_eog(d._vocab, tok):
                break
            out.append(tok)
            if j < n - 1:
                arr[0] = tok
                rc = C.llama_decode(ctx, one)
                if rc != 0:
                    d.reset_cache()
                    raise EngineError("draft model: " + decode_guard.decode_error(rc))
                d._cached.append(tok)
        return out

    def end(self) -> None:
        if self._chain is not None:
            self.draft._lib.llama_sampler_free(self._chain)
            self._chain = None
        if self._locked:
            self._locked = False
            self.draft._lock.release()


def speculative_tokens(gen: Generation, chain: Any, drafter: Drafter,
                       draft_max: int = DEFAULT_DRAFT_MAX) -> Generator[int, None, None]:
    """A token source for `Generation`: draft, verify in one batch, keep the agreed prefix.

    Invariant at every yield: `model._cached` minus the drafts not yet confirmed equals the
    committed conversation; `keep` is that length, and the `finally` trims KV cache and
    `_cached` to it however the consumer stops (max tokens, stop string, close, error).
    """
    if draft_max < 1:
        raise EngineError("the draft length must be at least 1")
    m = gen.model
    C = m._lib
    ctx = m._ctx
    vocab = m._vocab
    cancel = gen.cancel
    st = gen.stats
    sample = C.llama_sampler_sample
    is_eog = C.llama_vocab_is_eog
    n_ctx = m.n_ctx_seq
    # One decode holds at most n_batch tokens (llama.cpp asserts it): with a small context
    # the batch limit is the context's, e.g. 64 for n_ctx 64.
    draft_max = max(1, min(draft_max, m.n_batch - 1))
    cached = m._cached
    keep = len(cached)
    # Unless the drafter sizes its drafts itself, the length adapts: grows by 1 after a fully
    # accepted draft, shrinks to one more than what was accepted otherwise, so a drafter on a
    # bad streak costs ~a 2-token batch a step.
    adapt = not drafter.sets_length
    k = draft_max
    batch = C.llama_batch_init(draft_max + 1, 0, 1)
    b_tok, b_pos, b_nseq, b_seq, b_logits = (batch.token, batch.pos, batch.n_seq_id,
                                             batch.seq_id, batch.logits)
    for i in range(draft_max + 1):
        b_nseq[i] = 1
        b_seq[i][0] = 0
        b_logits[i] = 1  # verification samples at every position
    drafter.begin(cached)
    try:
        if cancel.is_set():
            gen._reason = "cancelled"
            return
        cur = sample(chain, ctx, -1)
        if is_eog(vocab, cur):
            gen._reason = "stop"
            return
        yield cur
        drafter.accept(cur)
        while True:
            if cancel.is_set():
                gen._reason = "cancelled"
                return
            base = len(cached)
            if base + 1 >= n_ctx:
                gen._reason = "context_full"
                return
            # After the decode the cache must still have a free cell, as in plain decoding:
            # drafts never push past the context.
            drafts = propose_drafts(drafter, m, min(k, n_ctx - 2 - base))
            nd = len(drafts)
            # A drafter is outside code: the batch buffer holds draft_max + 1 tokens.
            decode_guard.check_batch(nd + 1, draft_max + 1)
            decode_guard.check_room(base, nd + 1, n_ctx)
            b_tok[0] = cur
            b_pos[0] = base
            for j, t in enumerate(drafts, 1):
                b_tok[j] = t
                b_pos[j] = base + j
            batch.n_tokens = nd + 1
            rc = C.llama_decode(ctx, batch)
            if rc != 0:
                m.reset_cache()
                raise EngineError(decode_guard.decode_error(rc))
            cached.append(cur)
            cached.extend(drafts)
            keep = base + 1
            st.draft_tokens += nd
            for i in range(nd + 1):
                tok = sample(chain, ctx, i)
                if i < nd and tok == drafts[i]:
                    st.draft_accepted += 1
                    keep = base + 2 + i
                    yield tok
                    drafter.accept(tok)
                    continue
                # The model's own token at this position: drafts after it are dead.
                if nd and adapt:
                    k = min(draft_max, k + 1) if i == nd else i + 1
                if len(cached) > keep:
                    _trim(m, cached, keep)
                if is_eog(vocab, tok):
                    gen._reason = "stop"
                    return
                cur = tok
                yield tok
                drafter.accept(tok)
                break
    finally:
        try:
            if m._cached is cached and len(cached) > keep:
                _trim(m, cached, keep)
        finally:
            C.llama_batch_free(batch)
            drafter.end()


def propose_drafts(drafter: Drafter, m: Model, room: int) -> list[int]:
    """Up to `room` drafted tokens, cut before the first that must never be decoded: an
    end-of-generation token, or an id outside the model's vocabulary."""
    drafts = drafter.propose(room) if room > 0 else []
    for j, t in enumerate(drafts):
        if not 0 <= t < m.n_vocab or m.is_eog(t):
            return drafts[:j]
    return drafts


def _trim(m: Model, cached: list[int], keep: int) -> None:
    trim_sequence(m._lib, m._memory, 0, cached, keep)


def trim_sequence(lib: Any, memory: Any, seq: int, tokens: list[int], keep: int) -> None:
    """Drop sequence `seq`'s KV cells from position `keep` on, and `tokens` (what the caller
    knows it holds) with them. A cache that cannot drop a tail (some recurrent and
    sliding-window layouts) loses the whole sequence rather than keep cells nobody knows of."""
    if len(tokens) <= keep:
        return
    if not lib.llama_memory_seq_rm(memory, seq, keep, -1):
        lib.llama_memory_seq_rm(memory, seq, -1, -1)
        keep = 0
    del tokens[keep:]


def verify_cost(m: Model) -> VerifyCost:
    """The verification cost curve of this model's kernels (COST_*)."""
    if m.load_info.n_gpu_layers > 0:
        return COST_GPU
    return COST_AMX if m.amx_weights else COST_CPU


def lookup_source(draft_max: int = DEFAULT_DRAFT_MAX, *, ngram_max: int = 32,
                  ngram_min: int = 2, cost: VerifyCost | None = None) -> TokenSource:
    """Token source for `Model.generate(..., token_source=...)` with prompt-lookup drafting.
    `cost` (default: the model's, `verify_cost`) sets the draft lengths."""
    if draft_max < 1:
        raise EngineError("the draft length must be at least 1")
    PromptLookup(ngram_max, ngram_min)  # validate now, not at the first token

    def source(gen: Generation, chain: Any) -> Generator[int, None, None]:
        drafter = PromptLookup(ngram_max, ngram_min,
                               cost=verify_cost(gen.model) if cost is None else cost)
        return speculative_tokens(gen, chain, drafter, draft_max)

    return source


def draft_model_source(draft: Model, target: Model,
                       draft_max: int = DEFAULT_MODEL_DRAFT_MAX) -> TokenSource:
    """Token source drafting with `draft` (checked against `target`'s vocabulary now)."""
    if draft_max < 1:
        raise EngineError("the draft length must be at least 1")
    check_vocab(target, draft)

    def source(gen: Generation, chain: Any) -> Generator[int, None, None]:
        if gen.model is not target:
            raise EngineError("this draft model was checked against another model")
        return speculative_tokens(gen, chain, DraftModel(draft, target), draft_max)

    return source


class Speculator:
    """Holds what a mode needs (the loaded draft model) and hands out token sources."""

    def __init__(self, target: Model, settings: SpeculativeSettings,
                 draft: Model | None = None) -> None:
        settings.validate()
        self.target = target
        self.settings = settings
        self._own_draft = False
        self.draft = draft
        if settings.mode == "draft" and draft is None:
            assert settings.draft_model is not None
            self.draft = load_draft_model(settings.draft_model, target)
            self._own_draft = True
        elif draft is not None:
            check_vocab(target, draft)
        self._lock = threading.Lock()

    def token_source(self) -> TokenSource | None:
        s = self.settings
        if s.mode == "lookup":
            return lookup_source(s.draft_max or DEFAULT_DRAFT_MAX)
        if s.mode == "draft" and self.draft is not None:
            return draft_model_source(self.draft, self.target,
                                      s.draft_max or DEFAULT_MODEL_DRAFT_MAX)
        return None

    def close(self) -> None:
        if self._own_draft and self.draft is not None:
            with contextlib.suppress(Exception):
                self.draft.close()
            self.draft = None


def acceptance_rate(stats: GenerationStats) -> float | None:
    """Accepted / drafted, or None when nothing was drafted."""
    if stats.draft_tokens <= 0:
        return None
    return stats.draft_accepted / stats.draft_tokens


def spec_stats(stats: GenerationStats) -> dict[str, Any]:
    """The speculative figures for a performance panel or a JSON response."""
    rate = acceptance_rate(stats)
    return {
        "draft_tokens": stats.draft_tokens,
        "draft_accepted": stats.draft_accepted,
        "acceptance_rate": None if rate is None else round(rate, 4),
    }


__all__ = [
    "COST_AMX",
    "COST_CPU",
    "COST_GPU",
    "DEFAULT_MODEL_DRAFT_MAX",
    "DraftModel",
    "Drafter",
    "PromptLookup",
    "Speculator",
    "VerifyCost",
    "acceptance_rate",
    "check_vocab",
    "draft_model_source",
    "load_draft_model",
    "lookup_source",
    "propose_drafts",
    "spec_stats",
    "speculative_tokens",
    "trim_sequence",
    "verify_cost",
    "vocab_mismatch",
    "vocab_size_mismatch",
]
