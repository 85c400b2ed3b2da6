"""The slots of a decode loop and the layout of their KV cells.

A slot is one sequence id of the context and the request it serves; `Slot.tokens` is exactly
what that sequence holds between two steps. `KvLayout` decides where cells go: which free slot
a request takes, when a prefix is copied from another slot or a saved prompt restored from
the model's `PromptStateCache` (every client's prompts, the chat's and the API's), and how busy
slots are kept on consecutive ids (a hole left by a finished request is closed by moving the
slot at the far end into it). It works through the `ContextBackend` only, so it runs on a
test backend too.

Why consecutive ids: with one KV stream per sequence (llama.cpp's default, `kv_unified =
false`), llama.cpp cuts a batch into one micro-batch per run of consecutive sequence ids;
eight generating slots on ids 0,2,...,14 cost eight passes over the weights per step instead
of one (SmolLM2: 8 scattered sequences decode at 1.0x the single-sequence speed, 8 consecutive
ones at 2x).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from engine.decoding.textstream import TextStream
from engine.errors import EngineError
from engine.host.loop_model import LoopModel
from engine.host.prompt_cache import common_prefix
from engine.host.requests import Request
from engine.host.speculative import Drafter
from engine.memory.cpu_kernels import SplitRule
from engine.native.backend import ContextBackend, Sampler

# Copying a KV stream from one slot to another moves the whole stream (every cell, used or not).
# Count a copy as costing one prompt token per this many bytes: SmolLM2's 512-cell stream
# (12 MiB) then needs a prefix of 8+ tokens to be worth copying, a 4,096-cell one 24+.
COPY_BYTES_PER_TOKEN = 4 << 20
MIN_COPY_GAIN = 8
# A request that will end within this many tokens is not worth moving to close a hole.
MIN_MOVE_TOKENS = 16
# Every client's prompts are kept, not only the chat's: an API client's repeated system prompt
# or agent preamble comes back after a burst of other requests took its slot (what
# llama-server's RAM prompt cache does). Saving or restoring a sequence's state copies its
# used cells only: SmolLM2, 145 tokens (3.3 MB) in ~0.8 ms, where reading one prompt token in
# a batch costs ~3 ms on a 2-core EPYC. A few tokens are cheaper to read again than to keep
# (a tiny history would only crowd the cache); a restore must gain a few tokens over what the
# slots already hold.
MIN_SNAPSHOT_TOKENS = 16
MIN_RESTORE_GAIN = 4


class SlotBusy(EngineError):
    """The slot asked for serves a request now; it is free again when that one ends."""


@dataclass
class LoopCounters:
    """What a loop has done since it started (kept across context changes)."""

    steps: int = 0
    tok_gen: int = 0
    tok_prompt: int = 0
    copies: int = 0  # KV streams copied between slots (prefix shares and moves)
    drafted: int = 0
    accepted: int = 0
    saved: int = 0  # KV states saved to / restored from the model's state cache
    restored: int = 0


class Slot:
    """One sequence id in the shared context and the request it is serving."""

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.tokens: list[int] = []  # exactly what sequence `seq` holds in the KV cache
        # How many of them were read the canonical way (engine.host.batch_plan).
        self.exact_len = 0
        # The LoRA scales its cells were made under: only a request with the same reuses them.
        self.lora: tuple[float, ...] = ()
        self.req: Request | None = None
        self.pending: list[int] = []  # prompt tokens not yet decoded
        self.plan: deque[int] | None = None  # canonical batch sizes for `pending` ("grid", "tiled")
        self.rule: SplitRule = "any"  # how this request's prompt may be cut (batch_plan)
        self.next_token: int | None = None  # sampled, to be decoded in the next step
        self.sampler: Sampler | None = None
        self.stream: TextStream | None = None  # UTF-8 reassembly and stop strings
        self.n_gen = 0
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.last_used = 0.0
        self.batch_idx = -1  # where this slot's logits are in the current batch
        self.n_in_batch = 0  # how many of its tokens the current batch holds
        self.prefilling = False  # whether they are prompt tokens
        self.drafter: Drafter | None = None
        self.draft_max = 0
        self.k = 0  # the draft length, for drafters that do not size their own
        self.drafts: list[int] = []  # decoded after next_token in the current batch

    def summary(self) -> dict[str, Any]:
        """What the scheduler's snapshot says of it (read under the scheduler's lock): its
        cells, and the request it serves: its prompt, what is read of it and from the cache,
        its sampling, the tokens generated and the text handed out (GET /slots)."""
        req = self.req
        out: dict[str, Any] = {
            "id": self.seq,
            "busy": req is not None,
            "cached_tokens": len(self.tokens),
            "request": req.id if req else None,
            "interactive": bool(req and req.interactive),
            "speculative": self.drafter is not None,
        }
        if req is not None:
            out.update(
                prompt=list(req.prompt),
                prompt_cached=req.stats.cached_tokens,
                prompt_pending=len(self.pending),
                sampling=req.sampling,
                stream=req.stream,
                n_decoded=self.n_gen,
                text=req.text,
            )
        return out

    def clear_request(self) -> None:
        self.req = None
        self.pending = []
        self.plan = None
        self.next_token = None
        self.sampler = None
        self.stream = None
        self.drafter = None
        self.drafts = []


# What `KvLayout.move` hands from one slot to another.
REQUEST_FIELDS = (
    "req",
    "pending",
    "plan",
    "rule",
    "next_token",
    "sampler",
    "stream",
    "n_gen",
    "t_first",
    "t_last",
    "drafter",
    "draft_max",
    "k",
    "exact_len",
    "lora",
)


class KvLayout:
    """Where each slot's cells go: slot choice, prefix copies, snapshots, compaction."""

    def __init__(
        self,
        model: LoopModel,
        backend: ContextBackend,
        slots: list[Slot],
        counters: LoopCounters,
        stream_bytes: int,
    ) -> None:
        self.model = model
        self.backend = backend
        self.slots = slots
        self.counters = counters
        self.stream_bytes = stream_bytes  # one sequence's KV stream

    @property
    def cached_lora(self) -> tuple[float, ...]:
        """The one LoRA setting whose KV the RAM prompt cache keeps: the scales the adapters
        were loaded with (its snapshots carry no setting, so they hold no other)."""
        return tuple(float(s) for _, s in self.model.params.loras)

    def choose(self, prompt: list[int], lora: tuple[float, ...] = ()) -> Slot | None:
        """A free slot for `prompt`. First, the one that keeps the busy slots in the fewest
        runs of consecutive ids. Then one whose cache is lost by nothing (empty, or all of it
        a prefix of the prompt), the longest shared prefix first; then the least recently used.
        A prefix held by any other slot is copied in afterwards (`take_prefix`)."""
        busy = [s.req is not None for s in self.slots]
        best: tuple[int, bool, int, float] | None = None
        choice: Slot | None = None
        for s in self.slots:
            if s.req is not None:
                continue
            busy[s.seq] = True
            own = common_prefix(s.tokens, prompt) if s.lora == lora else 0
            key = (runs(busy), own < len(s.tokens), -own, s.last_used)
            busy[s.seq] = False
            if best is None or key < best:
                best, choice = key, s
        return choice

    def take_prefix(self, slot: Slot, req: Request) -> int:
        """Bring the longest cached prefix of `req`'s prompt into `slot` (a saved
        prompt restored, or another slot's stream copied, when that gains enough), and
        return how many of the prompt's tokens the slot now holds. Only cells made under
        `req`'s LoRA scales count (the RAM cache holds those of `cached_lora`)."""
        prompt = req.prompt
        n_own = common_prefix(slot.tokens, prompt) if slot.lora == req.lora else 0
        src, n_src = slot, n_own
        for other in self.slots:
            n = common_prefix(other.tokens, prompt) if other.lora == req.lora else 0
            if n > n_src:
                src, n_src = other, n
        cache = self.model.state_cache if req.lora == self.cached_lora else None
        found = cache.best(prompt) if cache is not None else None
        if cache is not None and found is not None and found[1] >= n_src + MIN_RESTORE_GAIN:
            # A prompt or conversation seen earlier: keep what this slot holds, bring that
            # one back.
            self.save(slot)
            state = cache.get(found[0])
            if state is not None and self.restore(slot, found[0], state):
                n_own = found[1]
        elif src is not slot and n_src - n_own >= self.min_copy_gain():
            # Another slot (idle or busy: between steps its cells are exactly `tokens`) holds a
            # longer prefix: take its whole stream, then drop what does not match.
            self.save(slot)
            self.copy_stream(src, slot)
            n_own = n_src
        elif len(slot.tokens) - n_own >= MIN_SNAPSHOT_TOKENS:
            self.save(slot)  # about to overwrite a long history we may come back to
        # Its cells past `n_own` are cut: what it holds now was, or will be, made under these.
        slot.lora = req.lora
        return n_own

    def cut(self, slot: Slot, n_keep: int) -> bool:
        """Drop `slot`'s cells from `n_keep` on; False when the cache could only drop the
        whole sequence (some caches, sliding-window layers, cannot drop part of one)."""
        kept = True
        if n_keep < len(slot.tokens) and not self.backend.seq_rm(slot.seq, n_keep, -1):
            self.backend.seq_rm(slot.seq)
            n_keep, kept = 0, False
        del slot.tokens[n_keep:]
        slot.exact_len = min(slot.exact_len, n_keep)
        return kept

    def min_copy_gain(self) -> int:
        return max(MIN_COPY_GAIN, -(-self.stream_bytes // COPY_BYTES_PER_TOKEN))

    def copy_stream(self, src: Slot, dst: Slot) -> None:
        """Make `dst`'s sequence a copy of `src`'s. Only whole sequences: across KV streams
        llama.cpp copies the full buffer (at the start of the next decode) and asserts on a
        partial range."""
        self.backend.seq_cp(src.seq, dst.seq)
        dst.tokens = list(src.tokens)
        dst.exact_len = src.exact_len
        dst.lora = src.lora
        self.counters.copies += 1

    def save(self, s: Slot) -> None:
        """Snapshot slot `s`'s KV state into the model's state cache (if worth it)."""
        cache = self.model.state_cache
        key = tuple(s.tokens)
        if cache is None or len(key) < MIN_SNAPSHOT_TOKENS or cache.contains(key):
            return
        if s.lora != self.cached_lora:
            return
        state = self.backend.state_get(s.seq, cache.max_bytes)
        if state is not None:
            cache.put(key, state, exact=min(s.exact_len, len(key)))
            self.counters.saved += 1

    def restore(self, s: Slot, key: tuple[int, ...], state: bytes) -> bool:
        be = self.backend
        be.seq_rm(s.seq)
        if not be.state_set(s.seq, state):
            be.seq_rm(s.seq)
            s.tokens = []
            s.exact_len = 0
            return False
        s.tokens = list(key)
        s.lora = self.cached_lora
        cache = self.model.state_cache
        s.exact_len = cache.exact_prefix(key) if cache is not None else 0
        self.counters.restored += 1
        return True

    def idle_slot(self, seq: int) -> Slot:
        """Slot `seq`; EngineError when there is none, SlotBusy while it serves a request."""
        if not 0 <= seq < len(self.slots):
            raise EngineError(f"there is no slot {seq}: the slots are 0 to {len(self.slots) - 1}")
        slot = self.slots[seq]
        if slot.req is not None:
            raise SlotBusy(f"slot {seq} is serving a request")
        return slot

    def export(self, s: Slot) -> bytes:
        """Slot `s`'s KV state (llama.cpp's sequence state of exactly `s.tokens`), whole."""
        if not s.tokens:
            return b""
        state = self.backend.state_get(s.seq, 1 << 62)
        if state is None:
            raise EngineError(f"llama.cpp could not copy slot {s.seq}'s state")
        return state

    def load(self, s: Slot, tokens: list[int], state: bytes) -> None:
        """Make slot `s` hold `tokens` from a state `export` gave (this model and context);
        what it held is saved to the state cache first. EngineError when llama.cpp refuses
        the state (the slot is left empty)."""
        self.save(s)
        if not tokens:
            self.erase(s)
            return
        if not self.restore(s, tuple(tokens), state):
            raise EngineError("llama.cpp refused the saved state for this context")

    def erase(self, s: Slot) -> int:
        """Drop slot `s`'s cells; how many tokens it held."""
        n = len(s.tokens)
        self.backend.seq_rm(s.seq)
        s.tokens = []
        s.exact_len = 0
        return n

    def clear_all(self) -> None:
        """Drop every cell and every saved state: what follows starts from nothing."""
        self.backend.clear()
        cache = self.model.state_cache
        if cache is not None:
            cache.clear()
        for s in self.slots:
            s.tokens.clear()
            s.exact_len = 0
        spec = self.model.speculator
        if spec is not None:
            spec.clear()

    def compact(self) -> None:
        """Close holes between busy slots by moving the busy slot at the far end into the
        hole, so that a step stays one micro-batch. Idle slots' caches in a hole are given up."""
        while True:
            busy = [s.req is not None for s in self.slots]
            if runs(busy) <= 1:
                return
            first = busy.index(True)
            last = len(busy) - 1 - busy[::-1].index(True)
            holes = [i for i in range(first, last) if not busy[i]]
            # Move the end of the shorter side, into the hole farthest from it (one move).
            left = holes[0] - first
            right = last - holes[-1]
            mover, dst = (
                (self.slots[first], self.slots[holes[-1]])
                if left <= right
                else (self.slots[last], self.slots[holes[0]])
            )
            r = mover.req
            assert r is not None
            if r.sampling.max_tokens - mover.n_gen < MIN_MOVE_TOKENS:
                return
            self.move(mover, dst)

    def move(self, src: Slot, dst: Slot) -> None:
        """Hand `src`'s request, sampler and KV cells over to the free slot `dst`."""
        self.save(dst)
        self.copy_stream(src, dst)
        self.backend.seq_rm(src.seq)
        for name in REQUEST_FIELDS:
            setattr(dst, name, getattr(src, name))
        if dst.drafter is not None:
            dst.drafter.rebind(dst.seq)
        src.clear_request()
        src.tokens = []
        src.exact_len = 0
        src.last_used = time.perf_counter()


def runs(busy: list[bool]) -> int:
    """How many runs of consecutive busy slots there are (llama.cpp micro-batches per step)."""
    return sum(1 for i, b in enumerate(busy) if b and (i == 0 or not busy[i - 1]))


__all__ = [
    "COPY_BYTES_PER_TOKEN",
    "MIN_COPY_GAIN",
    "MIN_MOVE_TOKENS",
    "MIN_RESTORE_GAIN",
    "MIN_SNAPSHOT_TOKENS",
    "REQUEST_FIELDS",
    "KvLayout",
    "LoopCounters",
    "Slot",
    "SlotBusy",
    "runs",
]
