"""Continuous batching: several requests share one llama.cpp context, one decode per step.

The context is created with `n_seq_max = N`; each of the N slots owns one sequence id. Every
step builds one `llama_batch` holding the next token of every generating slot plus chunks of
prompts still being read, runs one `llama_decode`, then samples each slot from its own row of
logits with its own sampler chain. Requests join and leave between steps, so a short request
never waits for a long one to finish.

One worker thread owns the context; other threads only `submit()` and `cancel()`. Results go
back through a callback the caller supplies (the HTTP server hands them to its event loop).
A finished slot keeps its KV cells so that a later request with the same prompt prefix (a chat's
next turn, a shared system prompt) skips that prefix; a cancelled request's cells are freed at
once.

Busy slots are kept on consecutive sequence ids. With one KV stream per sequence (llama.cpp's
default, `kv_unified = false`), llama.cpp cuts a batch into one micro-batch per run of
consecutive sequence ids: eight generating slots on ids 0,2,4,...,14 cost eight full passes over
the weights per step instead of one (measured on SmolLM2: 8 scattered sequences decode at 1.0x
the single-sequence speed, 8 consecutive ones at 2x). So a request goes to a free slot next to
the busy ones; a prompt prefix cached in another slot is copied over (one stream copy, far
cheaper than prefilling it again); and when a finished request leaves a hole, the busy slot at
the end moves into it.

Prompt lookup (the model loaded with `speculative=lookup`): while exactly one request is in
flight and no prompt is being read, its step decodes the next token plus drafts from its own
prompt and reply (`engine.host.speculative.PromptLookup`) and keeps the prefix the model agrees
with, as `Model.generate` does. With more requests the batch already keeps the hardware busy
and every drafted position would cost the others, so they decode plainly.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from engine.decoding.textstream import TextStream
from engine.errors import EngineError
from engine.host import decode_guard
from engine.host.prompt_cache import common_prefix
from engine.host.runtime import Model
from engine.host.speculative import PromptLookup, propose_drafts, trim_sequence, verify_cost
from engine.native import llama_lib
from engine.settings import DEFAULT_DRAFT_MAX, SamplingParams

log = logging.getLogger("candlewick.scheduler")

# Copying a KV stream from one slot to another moves the whole stream (every cell, used or not).
# Count a copy as costing one prompt token per this many bytes: SmolLM2's 512-cell stream
# (12 MiB) then needs a prefix of 8+ tokens to be worth copying, a 4,096-cell one 24+.
COPY_BYTES_PER_TOKEN = 4 << 20
MIN_COPY_GAIN = 8
# A request that will end within this many tokens is not worth moving to close a hole.
MIN_MOVE_TOKENS = 16

FinishReason = Literal[
    "stop", "length", "stop_string", "context_full", "cancelled", "timeout", "error"
]


class QueueFull(EngineError):
    """The scheduler's wait queue is full; the caller should retry later."""


class SchedulerClosed(EngineError):
    """The scheduler has been shut down."""


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the slot's KV cache
    completion_tokens: int = 0
    queue_s: float = 0.0  # submit -> given a slot
    ttft_s: float = 0.0  # submit -> first text piece (total_s if there was none)
    total_s: float = 0.0
    finish_reason: FinishReason = "stop"
    error: str | None = None
    draft_tokens: int = 0  # prompt lookup: drafted and verified
    draft_accepted: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Piece:
    text: str


@dataclass(frozen=True)
class Finished:
    text: str  # the whole reply
    stats: RequestStats


Event = Piece | Finished
EventCallback = Callable[[Event], None]


class Request:
    """One submitted generation. Thread-safe to cancel; events arrive via `on_event`."""

    def __init__(self, rid: int, prompt: list[int], sampling: SamplingParams,
                 on_event: EventCallback, stream: bool, deadline: float | None,
                 wake: Callable[[], None]) -> None:
        self.id = rid
        self.prompt = prompt
        self.sampling = sampling
        self.stream = stream
        self.deadline = deadline
        self._on_event = on_event
        self._wake = wake
        self._cancel = threading.Event()
        self.done = threading.Event()
        self.t_submit = time.perf_counter()
        self.stats = RequestStats(prompt_tokens=len(prompt))
        self.text = ""

    def cancel(self) -> None:
        """Stop this request; its slot and KV cells are freed before the next step."""
        self._cancel.set()
        self._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def _emit(self, ev: Event) -> None:
        try:
            self._on_event(ev)
        except Exception:  # a broken consumer must not take the scheduler down
            log.debug("event callback failed for request %d", self.id, exc_info=True)


class _Slot:
    """One sequence id in the shared context and the request it is serving."""

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.tokens: list[int] = []  # exactly what sequence `seq` holds in the KV cache
        self.req: Request | None = None
        self.pending: list[int] = []  # prompt tokens not yet decoded
        self.next_token: int | None = None  # sampled, to be decoded in the next step
        self.sampler: Any = None
        self.stream: TextStream | None = None  # UTF-8 reassembly and stop strings
        self.n_gen = 0
        self.t_first: float | None = None
        self.last_used = 0.0
        self.batch_idx = -1  # where this slot's logits are in the current batch
        self.drafter: PromptLookup | None = None  # prompt lookup, when the model drafts
        self.drafts: list[int] = []  # decoded after next_token in the current batch


@dataclass
class SchedulerSnapshot:
    n_slots: int
    busy_slots: int
    queue_depth: int
    kv_used: int  # KV cells held by all sequences (including idle slots' reusable prefixes)
    kv_capacity: int
    steps: int
    tokens_generated: int
    tokens_prompt: int
    slots: list[dict[str, Any]] = field(default_factory=list)
    kv_copies: int = 0  # KV streams copied between slots (shared prefixes, closed holes)
    draft_tokens: int = 0  # prompt lookup: drafted and verified, over all requests
    draft_accepted: int = 0


class Scheduler:
    """Continuous batching over `model`, whose context must have `n_seq_max >= n_slots`."""

    def __init__(self, model: Model, *, n_slots: int | None = None, max_queue: int = 64,
                 n_batch: int | None = None) -> None:
        self.model = model
        self._C = C = llama_lib.lib()
        ctx = model.ctx_ptr
        if not ctx:
            raise EngineError("the model is not loaded")
        n_seq_max = int(model.params.n_seq_max)
        self.n_slots = n_slots or n_seq_max
        if self.n_slots > n_seq_max:
            raise EngineError(f"{self.n_slots} slots need a context with n_seq_max >= "
                              f"{self.n_slots} (it has {n_seq_max})")
        if max_queue < 0:
            raise EngineError("the queue size must be 0 or more")
        self.max_queue = max_queue
        self.n_batch = min(n_batch or model.params.n_batch, int(C.llama_n_batch(ctx)))
        self.n_ctx_seq = int(C.llama_n_ctx_seq(ctx))
        self._n_seq_max = int(C.llama_n_seq_max(ctx))
        self._ctx = ctx
        self._mem = C.llama_get_memory(ctx)
        self._slots = [_Slot(i) for i in range(self.n_slots)]
        self._queue: deque[Request] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._next_id = 0
        self._steps = 0
        self._tok_gen = 0
        self._tok_prompt = 0
        self._batch = C.llama_batch_init(self.n_batch, 0, 1)
        kv_bytes = int(getattr(getattr(model, "memory_actual", None), "kv_bytes", 0) or 0)
        self._stream_bytes = kv_bytes // max(n_seq_max, 1)
        self._copies = 0  # KV stream copies made (prefix shares and moves), for tests and stats
        spec = model.params.speculative
        # Server-side speculation is prompt lookup only: a draft model would need a KV
        # stream per slot of its own.
        self._lookup = spec is not None and spec.mode == "lookup"
        self._draft_max = max(1, min((spec.draft_max if spec else None) or DEFAULT_DRAFT_MAX,
                                     self.n_batch - 1))
        self._cost = verify_cost(model)
        self._drafted = 0
        self._accepted = 0
        model.reset_cache()
        self._thread = threading.Thread(target=self._run, name="candlewick-scheduler",
                                        daemon=True)
        self._thread.start()

    # -- public API (any thread) -----------------------------------------------------------

    def submit(self, prompt: list[int], sampling: SamplingParams, on_event: EventCallback, *,
               stream: bool = True, timeout_s: float | None = None) -> Request:
        """Queue a generation. Raises QueueFull when the wait queue is full, EngineError when
        the request can never run (empty prompt, longer than a slot's context)."""
        sampling.validate()
        if not prompt:
            raise EngineError("the prompt is empty")
        if len(prompt) >= self.n_ctx_seq:
            raise EngineError(f"the prompt is {len(prompt)} tokens; each slot's context holds "
                              f"{self.n_ctx_seq}")
        deadline = time.perf_counter() + timeout_s if timeout_s else None
        with self._cond:
            if self._stop:
                raise SchedulerClosed("the server is shutting down")
            free = sum(1 for s in self._slots if s.req is None)
            if len(self._queue) >= self.max_queue + free:
                raise QueueFull(f"all {self.n_slots} slots are busy and {len(self._queue)} "
                                "requests are waiting")
            self._next_id += 1
            req = Request(self._next_id, list(prompt), sampling, on_event, stream, deadline,
                          self._wake)
            self._queue.append(req)
            self._cond.notify()
        return req

    def snapshot(self) -> SchedulerSnapshot:
        with self._cond:
            slots = [{"id": s.seq, "busy": s.req is not None, "cached_tokens": len(s.tokens),
                      "request": s.req.id if s.req else None} for s in self._slots]
            return SchedulerSnapshot(
                n_slots=self.n_slots,
                busy_slots=sum(1 for s in self._slots if s.req is not None),
                queue_depth=len(self._queue),
                kv_used=sum(len(s.tokens) for s in self._slots),
                kv_capacity=self.n_ctx_seq * self.n_slots,
                steps=self._steps,
                tokens_generated=self._tok_gen,
                tokens_prompt=self._tok_prompt,
                slots=slots,
                kv_copies=self._copies,
                draft_tokens=self._drafted,
                draft_accepted=self._accepted,
            )

    def kv_positions(self) -> list[int]:
        """For each slot, how many positions llama.cpp itself holds (pos_max + 1).

        Independent of the scheduler's own bookkeeping: tests compare the two to prove that no
        cells leak. Only meaningful while the scheduler is idle."""
        return [int(self._C.llama_memory_seq_pos_max(self._mem, s.seq)) + 1 for s in self._slots]

    def wait_idle(self, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            snap = self.snapshot()
            if snap.busy_slots == 0 and snap.queue_depth == 0:
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        """Cancel everything, stop the worker and free the batch. Idempotent."""
        with self._cond:
            if self._stop:
                return
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        self._C.llama_batch_free(self._batch)
        # Leave the model's own cache state consistent for a later `Model.generate`.
        self.model.reset_cache()

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- worker ----------------------------------------------------------------------------

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._queue and not any(
                    s.req for s in self._slots
                ):
                    self._cond.wait()
                if self._stop:
                    break
                self._admit()
            try:
                self._reap()
                self._step()
            except Exception as e:  # never let one bad step kill the server
                log.exception("scheduler step failed")
                self._fail_all(f"generation failed: {e}")
        for s in self._slots:
            if s.req is not None:
                self._finish(s, "cancelled")
        with self._cond:
            queued = list(self._queue)
            self._queue.clear()
        for r in queued:
            self._finish_unscheduled(r, "cancelled")

    def _admit(self) -> None:
        """Give queued requests free slots (caller holds the lock). FIFO: the oldest first."""
        now = time.perf_counter()
        while self._queue:
            req = self._queue[0]
            if req.cancelled or (req.deadline is not None and now > req.deadline):
                self._queue.popleft()
                self._finish_unscheduled(req, "cancelled" if req.cancelled else "timeout")
                continue
            slot = self._choose_slot(req.prompt)
            if slot is None:
                return
            self._queue.popleft()
            self._start(slot, req, now)
        self._compact()

    def _choose_slot(self, prompt: list[int]) -> _Slot | None:
        """A free slot for `prompt`. First, the one that keeps the busy slots in the fewest
        runs of consecutive ids. Then one whose cache is lost by nothing (empty, or all of it
        a prefix of the prompt), the longest shared prefix first; then the least recently used.
        A prefix held by any other slot is copied in afterwards (`_start`)."""
        busy = [s.req is not None for s in self._slots]
        best: tuple[int, bool, int, float] | None = None
        choice: _Slot | None = None
        for s in self._slots:
            if s.req is not None:
                continue
            busy[s.seq] = True
            own = common_prefix(s.tokens, prompt)
            key = (_runs(busy), own < len(s.tokens), -own, s.last_used)
            busy[s.seq] = False
            if best is None or key < best:
                best, choice = key, s
        return choice

    def _start(self, slot: _Slot, req: Request, now: float) -> None:
        C = self._C
        n_own = common_prefix(slot.tokens, req.prompt)
        src, n_src = slot, n_own
        for other in self._slots:
            n = common_prefix(other.tokens, req.prompt)
            if n > n_src:
                src, n_src = other, n
        if src is not slot and n_src - n_own >= self._min_copy_gain():
            # Another slot (idle or busy: between steps its cells are exactly `tokens`) holds a
            # longer prefix: take its whole stream, then drop what does not match.
            self._copy_stream(src, slot)
            n_own = n_src
        n_common = min(n_own, len(req.prompt) - 1)
        if n_common < len(slot.tokens) and not C.llama_memory_seq_rm(
            self._mem, slot.seq, n_common, -1
        ):
            # Some caches (sliding-window layers) cannot drop part of a sequence.
            C.llama_memory_seq_rm(self._mem, slot.seq, -1, -1)
            n_common = 0
        del slot.tokens[n_common:]
        slot.req = req
        slot.pending = req.prompt[n_common:]
        slot.next_token = None
        slot.sampler = self.model._make_sampler(req.sampling)
        s = req.sampling
        if s.repeat_penalty != 1.0:
            for t in req.prompt[-s.repeat_last_n:]:
                C.llama_sampler_accept(slot.sampler, t)
        slot.stream = TextStream(s.stop)
        slot.n_gen = 0
        slot.t_first = None
        slot.drafts = []
        slot.drafter = None
        if self._lookup:
            slot.drafter = PromptLookup(cost=self._cost)
            slot.drafter.begin(req.prompt)
        req.stats.cached_tokens = n_common
        req.stats.queue_s = now - req.t_submit

    def _min_copy_gain(self) -> int:
        return max(MIN_COPY_GAIN, -(-self._stream_bytes // COPY_BYTES_PER_TOKEN))

    def _copy_stream(self, src: _Slot, dst: _Slot) -> None:
        """Make `dst`'s sequence a copy of `src`'s. Only whole sequences: across KV streams
        llama.cpp copies the full buffer (at the start of the next decode) and asserts on a
        partial range."""
        self._C.llama_memory_seq_cp(self._mem, src.seq, dst.seq, -1, -1)
        dst.tokens = list(src.tokens)
        self._copies += 1

    def _compact(self) -> None:
        """Close holes between busy slots by moving the busy slot at the far end into the
        hole, so that a step stays one micro-batch. Idle slots' caches in a hole are given up."""
        while True:
            busy = [s.req is not None for s in self._slots]
            if _runs(busy) <= 1:
                return
            first = busy.index(True)
            last = len(busy) - 1 - busy[::-1].index(True)
            holes = [i for i in range(first, last) if not busy[i]]
            # Move the end of the shorter side, into the hole farthest from it (one move).
            left = holes[0] - first
            right = last - holes[-1]
            mover, dst = ((self._slots[first], self._slots[holes[-1]]) if left <= right
                          else (self._slots[last], self._slots[holes[0]]))
            r = mover.req
            assert r is not None
            if r.sampling.max_tokens - mover.n_gen < MIN_MOVE_TOKENS:
                return
            self._move(mover, dst)

    def _move(self, src: _Slot, dst: _Slot) -> None:
        """Hand `src`'s request, sampler and KV cells over to the free slot `dst`."""
        self._copy_stream(src, dst)
        self._C.llama_memory_seq_rm(self._mem, src.seq, -1, -1)
        for name in ("req", "pending", "next_token", "sampler", "stream", "n_gen", "t_first",
                     "drafter"):
            setattr(dst, name, getattr(src, name))
        src.drafter = None
        src.tokens = []
        src.req = None
        src.pending = []
        src.next_token = None
        src.sampler = None
        src.stream = None
        src.last_used = time.perf_counter()

    def _reap(self) -> None:
        """Finish cancelled and timed-out requests before building the next batch."""
        now = time.perf_counter()
        for s in self._slots:
            r = s.req
            if r is None:
                continue
            if r.cancelled:
                self._finish(s, "cancelled")
            elif r.deadline is not None and now > r.deadline:
                self._finish(s, "timeout")

    def _step(self) -> None:
        C = self._C
        b = self._batch
        # Every generating slot gets its next token; the rest of the batch goes to prompt
        # chunks, oldest request first.
        room = self.n_batch - sum(
            1 for s in self._slots if s.req is not None and s.next_token is not None)
        chunk_len: dict[int, int] = {}
        prefill = [s for s in self._slots if s.req is not None and s.pending]
        if prefill:
            prefill.sort(key=lambda s: s.req.t_submit if s.req else 0.0)
            for s in prefill:
                if room <= 0:
                    break
                chunk_len[s.seq] = k = min(room, len(s.pending))
                room -= k
        drafting = self._drafting_slot(prefill)
        # Written in sequence-id order: llama.cpp splits a batch at every break in the ids.
        n = 0
        rows: list[_Slot] = []
        for s in self._slots:
            s.batch_idx = -1
            if s.req is None:
                continue
            if s.next_token is not None:
                s.drafts = self._propose(s) if s is drafting else []
                refused = self._refusal(s, n, 1 + len(s.drafts))
                if refused:
                    self._finish(s, "error", refused)
                    continue
                s.batch_idx = n
                for tok in (s.next_token, *s.drafts):
                    self._put(b, n, tok, len(s.tokens), s.seq, True)
                    s.tokens.append(tok)
                    n += 1
                s.next_token = None
                rows.append(s)
                continue
            k = chunk_len.get(s.seq, 0)
            if not k:
                continue
            refused = self._refusal(s, n, k)
            if refused:
                self._finish(s, "error", refused)
                continue
            chunk = s.pending[:k]
            del s.pending[:k]
            last = not s.pending
            pos = len(s.tokens)
            for j, tok in enumerate(chunk):
                self._put(b, n, tok, pos + j, s.seq, last and j == k - 1)
                n += 1
            s.tokens.extend(chunk)
            self._tok_prompt += k
            if last:
                s.batch_idx = n - 1
                rows.append(s)
        if n == 0:
            return
        b.n_tokens = n
        rc = C.llama_decode(self._ctx, b)
        self._steps += 1
        if rc != 0:
            # The batch was not applied: drop what each slot thought it added.
            for s in self._slots:
                if s.req is not None:
                    self._finish(s, "error", decode_guard.decode_error(rc))
            return
        for s in rows:
            self._sample(s)

    def _seq_ok(self, s: _Slot) -> bool:
        return 0 <= s.seq < self._n_seq_max

    def _refusal(self, s: _Slot, n: int, k: int) -> str | None:
        """Why `k` more tokens of slot `s` after `n` in the batch must not be decoded: the
        batch buffer holds n_batch tokens (llama.cpp does not check what is written into
        it), a sequence holds n_ctx_seq positions, ids stop at n_seq_max."""
        try:
            decode_guard.check_batch(n + k, self.n_batch)
            decode_guard.check_seq(s.seq, self._n_seq_max)
            decode_guard.check_room(len(s.tokens), k, self.n_ctx_seq)
        except decode_guard.DecodeRefused as e:
            return str(e)
        return None

    @staticmethod
    def _put(b: Any, i: int, tok: int, pos: int, seq: int, logits: bool) -> None:
        b.token[i] = tok
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq
        b.logits[i] = 1 if logits else 0

    def _drafting_slot(self, prefill: list[_Slot]) -> _Slot | None:
        """The one slot that drafts this step: only with prompt lookup on, one request in
        flight and no prompt being read (see the module doc)."""
        if not self._lookup or prefill:
            return None
        busy = [s for s in self._slots if s.req is not None]
        if len(busy) != 1 or busy[0].next_token is None or busy[0].drafter is None:
            return None
        return busy[0]

    def _propose(self, s: _Slot) -> list[int]:
        assert s.drafter is not None
        # Room for the drafts: the batch, and the context with a free cell left after them.
        return propose_drafts(s.drafter, self.model,
                              min(self._draft_max, self.n_ctx_seq - 2 - len(s.tokens)))

    def _sample(self, s: _Slot) -> None:
        """Sample the slot's row(s): its next token, and with drafts, the model's token at
        each drafted position while the drafts agree (the rest of their cells are dropped)."""
        C = self._C
        req = s.req
        assert req is not None
        drafts, s.drafts = s.drafts, []
        base = len(s.tokens) - len(drafts)  # cells through the token decoded before the drafts
        req.stats.draft_tokens += len(drafts)
        self._drafted += len(drafts)
        for i in range(len(drafts) + 1):
            tok = int(C.llama_sampler_sample(s.sampler, self._ctx, s.batch_idx + i))
            accepted = i < len(drafts) and tok == drafts[i]
            if accepted:
                req.stats.draft_accepted += 1
                self._accepted += 1
            else:
                self._trim(s, base + i)  # the drafts after the model's own token are dead
            # Finishing inside the accepted drafts leaves the later ones dead too.
            if not self._emit_token(s, tok, keep=base + i + accepted):
                return
            if not accepted:
                s.next_token = tok
                return

    def _emit_token(self, s: _Slot, tok: int, keep: int) -> bool:
        """Hand out one generated token; False when the request finished with it. Finishing
        first drops the slot's cells from `keep` on: the request is reported done (and its
        slot free) only once the cache holds exactly the slot's tokens."""
        req = s.req
        assert req is not None
        if self.model.is_eog(tok):
            self._trim(s, keep)
            self._finish(s, "stop")
            return False
        s.n_gen += 1
        self._tok_gen += 1
        if s.drafter is not None:
            s.drafter.accept(tok)
        assert s.stream is not None
        self._out(s, s.stream.push(self.model.token_bytes(tok)))
        reason: FinishReason | None = None
        if s.stream.stopped:
            reason = "stop_string"
        elif s.n_gen >= req.sampling.max_tokens:
            reason = "length"
        elif len(s.tokens) + 1 >= self.n_ctx_seq:
            reason = "context_full"
        if reason is None:
            return True
        self._trim(s, keep)
        self._finish(s, reason)
        return False

    def _trim(self, s: _Slot, keep: int) -> None:
        trim_sequence(self._C, self._mem, s.seq, s.tokens, keep)

    def _out(self, s: _Slot, text: str) -> None:
        req = s.req
        if not text or req is None:
            return
        if s.t_first is None:
            s.t_first = time.perf_counter()
            req.stats.ttft_s = s.t_first - req.t_submit
        req.text += text
        if req.stream:
            req._emit(Piece(text))

    def _finish(self, s: _Slot, reason: FinishReason, error: str | None = None) -> None:
        C = self._C
        req = s.req
        assert req is not None
        if reason not in ("stop_string", "cancelled", "error") and s.stream is not None:
            self._out(s, s.stream.flush())
        if reason in ("cancelled", "error") and self._seq_ok(s):
            # The client is gone (or the cache is suspect): free the cells now.
            C.llama_memory_seq_rm(self._mem, s.seq, -1, -1)
            s.tokens.clear()
        if s.sampler is not None:
            C.llama_sampler_free(s.sampler)
            s.sampler = None
        st = req.stats
        st.completion_tokens = s.n_gen
        st.total_s = time.perf_counter() - req.t_submit
        if s.t_first is None:
            st.ttft_s = st.total_s
        st.finish_reason = reason
        st.error = error
        with self._cond:
            s.req = None
            s.pending = []
            s.next_token = None
            s.last_used = time.perf_counter()
        req._emit(Finished(req.text, st))
        req.done.set()

    def _finish_unscheduled(self, req: Request, reason: FinishReason) -> None:
        st = req.stats
        st.total_s = st.ttft_s = st.queue_s = time.perf_counter() - req.t_submit
        st.finish_reason = reason
        req._emit(Finished("", st))
        req.done.set()

    def _fail_all(self, message: str) -> None:
        for s in self._slots:
            if s.req is not None:
                with contextlib.suppress(Exception):
                    self._finish(s, "error", message)
        # After an unknown failure nothing in the cache can be trusted.
        self._C.llama_memory_clear(self._mem, True)
        for s in self._slots:
            s.tokens.clear()


def _runs(busy: list[bool]) -> int:
    """How many runs of consecutive busy slots there are (llama.cpp micro-batches per step)."""
    return sum(1 for i, b in enumerate(busy) if b and (i == 0 or not busy[i - 1]))





__all__ = [
    "Event",
    "FinishReason",
    "Finished",
    "Piece",
    "QueueFull",
    "Request",
    "RequestStats",
    "Scheduler",
    "SchedulerClosed",
    "SchedulerSnapshot",
]
