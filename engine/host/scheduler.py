"""The decode loop: every request to a loaded model, from every client, runs here.

A `Model` owns exactly one `Scheduler`, and the scheduler's thread makes every llama.cpp call
on the model's context: the chat (`Model.generate` and `EmbeddedEngine`), the HTTP API, the
benchmark, `candlewick run`, embeddings. Nothing else decodes.

Continuous batching. The context is created with `n_seq_max = N`; each of the N slots owns one
sequence id. Every step builds one `llama_batch` holding the next token of every generating
slot plus chunks of prompts still being read, runs one `llama_decode`, then samples each slot
from its own row of logits with its own sampler chain. Requests join and leave between steps,
so a short request never waits for a long one to finish.

Other threads only `submit()`, `cancel()` and hand over work (`call_idle`, `call_soon`).
Every event about a request (`Started`, `Piece`, `Finished`, `Failed`) carries its id and goes
back through a callback the caller supplies (the HTTP server hands them to its event loop, the
chat to a queue). A finished slot keeps its KV cells so that a later request with the same
prompt prefix (a chat's next turn, a shared system prompt) skips that prefix; a cancelled
request's cells are freed at once. Before a slot's long history is overwritten, its KV state is
saved in the model's `PromptStateCache`; a prompt that continues a saved history gets it back
with a memory copy.

Interactive requests (the desktop chat) go before queued API requests, and `reserved_slots`
slots are kept for them: the chat never waits behind a queue of API requests.

Reproducible chat requests (greedy, or a fixed seed) read their prompt the canonical way
(`engine.host.batch_plan`): where the kernels need it, in the planned batches, each decoded
alone; a cached prefix is reused only as far as it was itself read that way. So the same
prompt gives the same reply however the cache was left.

Busy slots are kept on consecutive sequence ids. With one KV stream per sequence (llama.cpp's
default, `kv_unified = false`), llama.cpp cuts a batch into one micro-batch per run of
consecutive sequence ids: eight generating slots on ids 0,2,4,...,14 cost eight full passes over
the weights per step instead of one (measured on SmolLM2: 8 scattered sequences decode at 1.0x
the single-sequence speed, 8 consecutive ones at 2x). So a request goes to a free slot next to
the busy ones; a prompt prefix cached in another slot is copied over (one stream copy, far
cheaper than prefilling it again); and when a finished request leaves a hole, the busy slot at
the end moves into it.

Speculative decoding (per request: prompt lookup, or the model's draft model with a KV sequence
per slot): while exactly one request is in flight and no prompt is being read, its step
decodes the next token plus drafts and keeps the prefix the model agrees with
(engine.host.speculative). With more requests the batch already keeps the hardware busy and
every drafted position would cost the others, so they decode plainly.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from engine.decoding.textstream import TextStream
from engine.errors import EngineError
from engine.host import batch_plan, decode_guard
from engine.host.loop_model import LoopModel
from engine.host.prompt_cache import common_prefix
from engine.host.requests import (
    EventCallback,
    Failed,
    Finished,
    Piece,
    QueueFull,
    Request,
    SchedulerClosed,
    SchedulerSnapshot,
    Started,
)
from engine.host.speculative import (
    DEFAULT_MODEL_DRAFT_MAX,
    Drafter,
    PromptLookup,
    propose_drafts,
    trim_sequence,
    verify_cost,
)
from engine.host.stats import StopReason
from engine.memory.cpu_kernels import SplitRule
from engine.native.backend import DecodeFailed, Sampler, TokenBatch
from engine.settings import DEFAULT_DRAFT_MAX, SamplingParams, SpecMode

log = logging.getLogger("candlewick.scheduler")

T = TypeVar("T")

# Copying a KV stream from one slot to another moves the whole stream (every cell, used or not).
# Count a copy as costing one prompt token per this many bytes: SmolLM2's 512-cell stream
# (12 MiB) then needs a prefix of 8+ tokens to be worth copying, a 4,096-cell one 24+.
COPY_BYTES_PER_TOKEN = 4 << 20
MIN_COPY_GAIN = 8
# A request that will end within this many tokens is not worth moving to close a hole.
MIN_MOVE_TOKENS = 16
# Histories shorter than this are cheaper to read again than to snapshot; a snapshot is
# restored only when it saves at least MIN_RESTORE_GAIN tokens over what the slots hold.
MIN_SNAPSHOT_TOKENS = 64
MIN_RESTORE_GAIN = 32


class _Slot:
    """One sequence id in the shared context and the request it is serving."""

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.tokens: list[int] = []  # exactly what sequence `seq` holds in the KV cache
        # How many of them were read the canonical way (engine.host.batch_plan).
        self.exact_len = 0
        # Whether they are a person's conversation, worth a snapshot before they are
        # overwritten (not a benchmark's or an API client's prompt).
        self.conversation = False
        self.req: Request | None = None
        self.pending: list[int] = []  # prompt tokens not yet decoded
        self.plan: deque[int] | None = None  # canonical batch sizes for `pending` ("grid")
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

    def clear_request(self) -> None:
        self.req = None
        self.pending = []
        self.plan = None
        self.next_token = None
        self.sampler = None
        self.stream = None
        self.drafter = None
        self.drafts = []


# What `_move` hands from one slot to another.
_REQUEST_FIELDS = (
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
)


class Scheduler:
    """The one decode loop of `model`; its context must have `n_seq_max >= n_slots`."""

    def __init__(
        self,
        model: LoopModel,
        *,
        n_slots: int | None = None,
        max_queue: int = 64,
        n_batch: int | None = None,
        reserved_slots: int = 0,
    ) -> None:
        self.model = model
        if model.backend is None:
            raise EngineError("the model is not loaded")
        if getattr(model, "scheduler", None) is not None:
            raise EngineError(
                "a model has one decode loop (model.loop); a second one on the "
                "same context would corrupt it"
            )
        if max_queue < 0:
            raise EngineError("the queue size must be 0 or more")
        self.max_queue = max_queue
        self._n_batch_req = n_batch
        self._cond = threading.Condition()
        self._queue: deque[Request] = deque()
        self._tasks: deque[tuple[Callable[[], Any], Future[Any], bool]] = deque()
        self._stop = False
        self._next_id = 0
        self._steps = 0
        self._tok_gen = 0
        self._tok_prompt = 0
        self._copies = 0  # KV stream copies made (prefix shares and moves)
        self._drafted = 0
        self._accepted = 0
        self._saved = 0
        self._restored = 0
        self._lease: tuple[str, tuple[int, int, int]] | None = None
        self._batch: TokenBatch | None = None
        self._bind(n_slots, reserved_slots)
        self._thread = threading.Thread(target=self._run, name="candlewick-decode", daemon=True)
        self._thread.start()

    def _bind(self, n_slots: int | None, reserved: int) -> None:
        """Take the model's (new) context: slots, batch buffer, limits."""
        model = self.model
        backend = model.backend
        if backend is None:
            raise EngineError("the model is not loaded")
        n_seq_max = backend.n_seq_max
        n = n_slots or n_seq_max
        if n > n_seq_max:
            raise EngineError(
                f"{n} slots need a context with n_seq_max >= {n} (it has {n_seq_max})"
            )
        if reserved < 0 or (reserved and reserved >= n):
            raise EngineError(f"{reserved} reserved slots leave none of {n} for other requests")
        self.n_slots = n
        self.reserved_slots = reserved
        self.n_batch = min(self._n_batch_req or model.params.n_batch, backend.n_batch)
        self.n_ctx_seq = backend.n_ctx_seq
        self._n_seq_max = n_seq_max
        self._be = backend
        self._slots = [_Slot(i) for i in range(n)]
        if self._batch is not None:
            self._batch.close()
        self._batch = backend.batch(self.n_batch)
        kv_bytes = int(getattr(getattr(model, "memory_actual", None), "kv_bytes", 0) or 0)
        self._stream_bytes = kv_bytes // max(n_seq_max, 1)
        self._cost = verify_cost(model)

    # -- public API (any thread) -----------------------------------------------------------

    def submit(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        on_event: EventCallback,
        *,
        stream: bool = True,
        timeout_s: float | None = None,
        cancel: threading.Event | None = None,
        interactive: bool = False,
        spec: SpecMode | None = None,
        canonical: bool | None = None,
    ) -> Request:
        """Queue a generation. Raises QueueFull when the wait queue is full, EngineError when
        the request can never run (empty prompt, longer than a slot's context, a draft model
        that is not loaded). `interactive`: a person waits on it (the chat): it goes first and
        may use the reserved slots. `spec`: speculative decoding for this request (None: the
        model's setting). `canonical` (default: `interactive`): a reproducible request reads
        its prompt the canonical way, so regenerating an answer gives the same text; the API
        does not ask for it, as llama-server does not, and keeps every cached prefix."""
        sampling.validate()
        if not prompt:
            raise EngineError("the prompt is empty")
        if len(prompt) >= self.n_ctx_seq:
            raise EngineError(
                f"the prompt is {len(prompt)} tokens, the context holds {self.n_ctx_seq}; "
                "shorten the conversation or load the model with a larger context"
            )
        decode_guard.check_tokens(prompt, self._be.n_vocab)
        if spec == "draft" and self.model.speculator is None:
            raise EngineError("no draft model is loaded for this model")
        # Compiled here, on the caller's thread: a large grammar must not stall the loop.
        mask = self.model.grammar_mask(sampling.grammar) if sampling.grammar else None
        deadline = time.perf_counter() + timeout_s if timeout_s else None
        with self._cond:
            if self._stop:
                raise SchedulerClosed("the model is being unloaded")
            free = sum(1 for s in self._slots if s.req is None)
            if not interactive and len(self._queue) >= self.max_queue + free:
                raise QueueFull(
                    f"all {self.n_slots} slots are busy and {len(self._queue)} requests are waiting"
                )
            self._next_id += 1
            req = Request(
                self._next_id,
                list(prompt),
                sampling,
                on_event,
                stream=stream,
                deadline=deadline,
                wake=self._wake,
                cancel=cancel,
                interactive=interactive,
                spec=spec,
                canonical=interactive if canonical is None else canonical,
            )
            req.mask = mask
            self._queue.append(req)
            self._cond.notify()
        return req

    def call_idle(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run `fn` on the decode thread once no request is in flight (queued ones wait), and
        return its result: for work that needs the whole context (clearing it, recreating it
        with other slots)."""
        return self._call(fn, idle=True, timeout=timeout)

    def call_soon(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run `fn` on the decode thread between two steps (embeddings on a second context
        of the same weights decode here too, so one thread drives llama.cpp)."""
        return self._call(fn, idle=False, timeout=timeout)

    def _call(self, fn: Callable[[], T], *, idle: bool, timeout: float | None) -> T:
        if threading.current_thread() is self._thread:
            return fn()
        fut: Future[T] = Future()
        with self._cond:
            if self._stop:
                raise SchedulerClosed("the model is being unloaded")
            self._tasks.append((fn, fut, idle))
            self._cond.notify()
        return fut.result(timeout)

    def configure(
        self,
        *,
        n_slots: int | None = None,
        max_queue: int | None = None,
        reserved_slots: int | None = None,
    ) -> None:
        """Serve with `n_slots` of the context's sequences (None: all of them), queue up to
        `max_queue` waiting requests, keep `reserved_slots` for interactive ones. Changing
        the slots drops every cached prefix (waits for requests in flight)."""
        if max_queue is not None:
            if max_queue < 0:
                raise EngineError("the queue size must be 0 or more")
            self.max_queue = max_queue
        if n_slots is None and reserved_slots is None:
            return
        reserved = self.reserved_slots if reserved_slots is None else reserved_slots

        def rebind() -> None:
            self._clear_all()
            self._bind(n_slots, reserved)

        self.call_idle(rebind)

    def clear_cache(self) -> None:
        """Drop every slot's KV cells (waits for requests in flight to end)."""
        self.call_idle(self._clear_all)

    def resize(self, n_slots: int, n_ctx_seq: int, *, reserved_slots: int = 0) -> None:
        """Recreate the context with `n_slots` sequences of `n_ctx_seq` cells each, on the
        same weights (nothing is loaded again), once requests in flight have ended. Idle
        slots' histories are saved to the state cache first, so a chat continues from a
        memory copy. Raises EngineError (the old context stays) when llama.cpp refuses."""
        if n_slots < 1 or n_ctx_seq < 1:
            raise EngineError("a context needs at least one slot and one cell")

        def swap() -> None:
            for s in self._slots:
                self._save(s)
            self.model.recreate_context(n_slots, n_ctx_seq * n_slots)
            self._bind(n_slots, reserved_slots)

        self.call_idle(swap)

    def lease(self, owner: str, n_slots: int, n_ctx_seq: int, *, reserved_slots: int = 0) -> None:
        """Give `owner` (the local server, the benchmark) the loop's slots in this shape
        until `release(owner)` puts the previous one back. One owner at a time: another
        gets EngineError saying who has them."""
        with self._cond:
            if self._lease is not None:
                raise EngineError(
                    f"the {self._lease[0]} is using this model's slots; stop it first"
                )
            shape = (self.n_slots, self.n_ctx_seq, self.reserved_slots)
            self._lease = (owner, shape)
        try:
            self.resize(n_slots, n_ctx_seq, reserved_slots=reserved_slots)
        except BaseException:
            with self._cond:
                self._lease = None
            raise

    def release(self, owner: str) -> None:
        """Put back the shape the loop had before `owner`'s lease (no-op without one, or
        once the model is unloaded)."""
        with self._cond:
            if self._lease is None or self._lease[0] != owner:
                return
            _, (n_slots, n_ctx_seq, reserved) = self._lease
            self._lease = None
        if not self._stop:
            self.resize(n_slots, n_ctx_seq, reserved_slots=reserved)

    @property
    def leased_by(self) -> str | None:
        lease = self._lease
        return lease[0] if lease is not None else None

    def snapshot(self) -> SchedulerSnapshot:
        with self._cond:
            slots = [
                {
                    "id": s.seq,
                    "busy": s.req is not None,
                    "cached_tokens": len(s.tokens),
                    "request": s.req.id if s.req else None,
                    "interactive": bool(s.req and s.req.interactive),
                }
                for s in self._slots
            ]
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
                reserved_slots=self.reserved_slots,
                snapshots_saved=self._saved,
                snapshots_restored=self._restored,
            )

    def kv_positions(self) -> list[int]:
        """For each slot, how many positions llama.cpp itself holds (pos_max + 1).

        Independent of the scheduler's own bookkeeping: tests compare the two to prove that no
        cells leak. Taken between two steps, when each slot's cells are exactly its tokens."""
        return self.call_soon(lambda: [self._be.pos_max(s.seq) + 1 for s in self._slots])

    def slot_tokens(self) -> list[list[int]]:
        """What each slot's sequence holds, by the scheduler's bookkeeping (for tests)."""
        return self.call_soon(lambda: [list(s.tokens) for s in self._slots])

    def wait_idle(self, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            snap = self.snapshot()
            if snap.busy_slots == 0 and snap.queue_depth == 0:
                return True
            time.sleep(0.01)
        return False

    @property
    def closed(self) -> bool:
        return self._stop

    def close(self) -> None:
        """Cancel everything, stop the loop and free the batch. Idempotent."""
        with self._cond:
            if self._stop:
                return
            self._stop = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        if self._batch is not None:
            self._batch.close()
            self._batch = None

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop --------------------------------------------------------------------------

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _busy(self) -> bool:
        return any(s.req is not None for s in self._slots)

    def _run(self) -> None:
        while True:
            task = None
            with self._cond:
                while not self._stop and not self._queue and not self._tasks and not self._busy():
                    self._cond.wait()
                if self._stop:
                    break
                busy = self._busy()
                if self._tasks and (not self._tasks[0][2] or not busy):
                    task = self._tasks.popleft()
                elif not any(idle for _, _, idle in self._tasks):
                    # Work that needs the context idle holds new requests back until then.
                    self._admit()
            if task is not None:
                fn, fut, _ = task
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as e:
                        fut.set_exception(e)
                continue
            try:
                self._reap()
                self._step()
            except Exception as e:  # never let one bad step kill the loop
                log.exception("decode step failed")
                self._fail_all(f"generation failed: {e}")
        for s in self._slots:
            if s.req is not None:
                self._finish(s, "cancelled")
        with self._cond:
            queued = list(self._queue)
            self._queue.clear()
            tasks = list(self._tasks)
            self._tasks.clear()
        for r in queued:
            self._finish_unscheduled(r, "cancelled")
        for _, fut, _ in tasks:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(SchedulerClosed("the model is being unloaded"))

    def _admit(self) -> None:
        """Give queued requests free slots (caller holds the lock): interactive requests
        first, then the rest oldest first; the reserved slots only to interactive ones."""
        now = time.perf_counter()
        for req in list(self._queue):
            if req.cancelled or (req.deadline is not None and now > req.deadline):
                self._queue.remove(req)
                self._finish_unscheduled(req, "cancelled" if req.cancelled else "timeout")
        order = sorted(self._queue, key=lambda r: not r.interactive)  # stable: FIFO within
        for req in order:
            if not req.interactive:
                others = sum(1 for s in self._slots if s.req is not None and not s.req.interactive)
                if others >= self.n_slots - self.reserved_slots:
                    break
            slot = self._choose_slot(req.prompt)
            if slot is None:
                break
            self._queue.remove(req)
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
        be = self._be
        model = self.model
        prompt = req.prompt
        n_own = common_prefix(slot.tokens, prompt)
        src, n_src = slot, n_own
        for other in self._slots:
            n = common_prefix(other.tokens, prompt)
            if n > n_src:
                src, n_src = other, n
        cache = model.state_cache
        found = cache.best(prompt) if cache is not None else None
        if cache is not None and found is not None and found[1] > n_src + MIN_RESTORE_GAIN:
            # A conversation left earlier: keep what this slot holds, bring that one back.
            self._save(slot)
            state = cache.get(found[0])
            if state is not None and self._restore(slot, found[0], state):
                n_own = found[1]
        elif src is not slot and n_src - n_own >= self._min_copy_gain():
            # Another slot (idle or busy: between steps its cells are exactly `tokens`) holds a
            # longer prefix: take its whole stream, then drop what does not match.
            self._save(slot)
            self._copy_stream(src, slot)
            n_own = n_src
        elif len(slot.tokens) - n_own >= MIN_SNAPSHOT_TOKENS:
            self._save(slot)  # about to overwrite a long history we may come back to
        rule = model.split_rule if req.canonical else "any"
        reusable = n_own if rule == "any" else min(n_own, slot.exact_len)
        plan = batch_plan.plan(len(prompt), reusable, self.n_batch, rule)
        n_common = plan.start
        if n_common < len(slot.tokens) and not be.seq_rm(slot.seq, n_common, -1):
            # Some caches (sliding-window layers) cannot drop part of a sequence.
            be.seq_rm(slot.seq)
            plan = batch_plan.plan(len(prompt), 0, self.n_batch, rule)
            n_common = 0
        del slot.tokens[n_common:]
        slot.exact_len = min(slot.exact_len, n_common)
        slot.conversation = req.interactive
        slot.req = req
        slot.pending = prompt[n_common:]
        slot.rule = rule
        slot.plan = deque(plan.sizes) if rule == "grid" else None
        slot.next_token = None
        slot.sampler = sampler = be.sampler(req.sampling)
        s = req.sampling
        if s.penalizes:
            for t in prompt[-s.repeat_last_n :]:
                be.sampler_accept(sampler, t)
        slot.stream = TextStream(s.stop)
        slot.n_gen = 0
        slot.t_first = slot.t_last = None
        slot.drafts = []
        slot.drafter = self._make_drafter(req, slot)
        req.stats.cached_tokens = n_common
        req.stats.queue_s = now - req.t_submit
        req._emit(Started(req.id, n_common))

    def _make_drafter(self, req: Request, slot: _Slot) -> Drafter | None:
        if req.mask is not None:
            return None  # drafts would need the grammar's state at every drafted position
        spec = self.model.speculator
        settings = self.model.params.speculative
        mode = req.spec if req.spec is not None else (settings.mode if settings else "off")
        own_max = settings.draft_max if settings is not None and settings.mode == mode else None
        drafter: Drafter
        if mode == "lookup":
            drafter = PromptLookup(cost=self._cost)
            slot.draft_max = own_max or DEFAULT_DRAFT_MAX
        elif mode == "draft" and spec is not None:
            drafter = spec.drafter(slot.seq)
            slot.draft_max = own_max or DEFAULT_MODEL_DRAFT_MAX
        else:
            return None
        slot.draft_max = max(1, min(slot.draft_max, self.n_batch - 1))
        slot.k = slot.draft_max
        drafter.begin(req.prompt)
        return drafter

    # -- KV state: copies between slots, snapshots ----------------------------------------

    def _min_copy_gain(self) -> int:
        return max(MIN_COPY_GAIN, -(-self._stream_bytes // COPY_BYTES_PER_TOKEN))

    def _copy_stream(self, src: _Slot, dst: _Slot) -> None:
        """Make `dst`'s sequence a copy of `src`'s. Only whole sequences: across KV streams
        llama.cpp copies the full buffer (at the start of the next decode) and asserts on a
        partial range."""
        self._be.seq_cp(src.seq, dst.seq)
        dst.tokens = list(src.tokens)
        dst.exact_len = src.exact_len
        dst.conversation = src.conversation
        self._copies += 1

    def _save(self, s: _Slot) -> None:
        """Snapshot slot `s`'s KV state into the model's state cache (if worth it)."""
        cache = self.model.state_cache
        key = tuple(s.tokens)
        if (
            cache is None
            or not s.conversation
            or len(key) < MIN_SNAPSHOT_TOKENS
            or cache.contains(key)
        ):
            return
        state = self._be.state_get(s.seq, cache.max_bytes)
        if state is not None:
            cache.put(key, state, exact=min(s.exact_len, len(key)))
            self._saved += 1

    def _restore(self, s: _Slot, key: tuple[int, ...], state: bytes) -> bool:
        be = self._be
        be.seq_rm(s.seq)
        if not be.state_set(s.seq, state):
            be.seq_rm(s.seq)
            s.tokens = []
            s.exact_len = 0
            return False
        s.tokens = list(key)
        s.conversation = True
        cache = self.model.state_cache
        s.exact_len = cache.exact_prefix(key) if cache is not None else 0
        self._restored += 1
        return True

    def _clear_all(self) -> None:
        self._be.clear()
        for s in self._slots:
            s.tokens.clear()
            s.exact_len = 0
        spec = self.model.speculator
        if spec is not None:
            spec.clear()

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
            mover, dst = (
                (self._slots[first], self._slots[holes[-1]])
                if left <= right
                else (self._slots[last], self._slots[holes[0]])
            )
            r = mover.req
            assert r is not None
            if r.sampling.max_tokens - mover.n_gen < MIN_MOVE_TOKENS:
                return
            self._move(mover, dst)

    def _move(self, src: _Slot, dst: _Slot) -> None:
        """Hand `src`'s request, sampler and KV cells over to the free slot `dst`."""
        self._save(dst)
        self._copy_stream(src, dst)
        self._be.seq_rm(src.seq)
        for name in _REQUEST_FIELDS:
            setattr(dst, name, getattr(src, name))
        if dst.drafter is not None:
            dst.drafter.rebind(dst.seq)
        src.clear_request()
        src.tokens = []
        src.exact_len = 0
        src.last_used = time.perf_counter()

    # -- one step --------------------------------------------------------------------------

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

    def _chunks(self) -> tuple[dict[int, int], bool]:
        """How many prompt tokens each prefilling slot reads this step, and whether the step
        is one canonical chunk alone (the generating slots then wait one step). A "grid"
        prompt goes in its planned batches, alone; a "multi" one in cuts of two or more
        tokens, beside the others."""
        prefill = sorted(
            (s for s in self._slots if s.req is not None and s.pending),
            key=lambda s: s.req.t_submit if s.req else 0.0,
        )
        if prefill and prefill[0].plan:
            first = prefill[0]
            assert first.plan is not None
            return {first.seq: first.plan[0]}, True
        room = self.n_batch - sum(
            1 for s in self._slots if s.req is not None and s.next_token is not None
        )
        out: dict[int, int] = {}
        for s in prefill:
            if room <= 0:
                break
            if s.plan:
                continue  # canonical chunks wait until they can go alone
            k = min(room, len(s.pending))
            if s.rule == "multi" and len(s.pending) > 1:
                # Any cut of two or more tokens reads the same: never leave one alone.
                if len(s.pending) - k == 1:
                    k -= 1
                if k < 2:
                    continue
            out[s.seq] = k
            room -= k
        return out, False

    def _step(self) -> None:
        b = self._batch
        assert b is not None
        put = b.put
        chunk_len, solo = self._chunks()
        drafting = None if solo else self._drafting_slot()
        # Written in sequence-id order: llama.cpp splits a batch at every break in the ids.
        n = 0
        rows: list[_Slot] = []
        for s in self._slots:
            s.batch_idx = -1
            s.n_in_batch = 0
            if s.req is None:
                continue
            if s.next_token is not None:
                if solo:
                    continue
                s.drafts = self._propose(s) if s is drafting else []
                refused = self._refusal(s, n, 1 + len(s.drafts))
                if refused:
                    self._finish(s, "error", refused)
                    continue
                s.batch_idx = n
                for tok in (s.next_token, *s.drafts):
                    put(n, tok, len(s.tokens), s.seq, True)
                    s.tokens.append(tok)
                    n += 1
                s.n_in_batch = 1 + len(s.drafts)
                s.prefilling = False
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
            if s.plan:
                s.plan.popleft()
            last = not s.pending
            pos = len(s.tokens)
            for j, tok in enumerate(chunk):
                put(n, tok, pos + j, s.seq, last and j == k - 1)
                n += 1
            s.tokens.extend(chunk)
            s.n_in_batch = k
            s.prefilling = True
            self._tok_prompt += k
            if last:
                s.batch_idx = n - 1
                rows.append(s)
        if n == 0:
            return
        b.n_tokens = n
        t0 = time.perf_counter()
        try:
            self._be.decode(b)
        except DecodeFailed as e:
            self._steps += 1
            # The batch was not applied: drop what each slot thought it added.
            for s in self._slots:
                if s.req is not None:
                    self._finish(s, "error", str(e))
            return
        dt_ms = (time.perf_counter() - t0) * 1000
        self._steps += 1
        for s in self._slots:
            if s.req is None or not s.n_in_batch:
                continue
            st = s.req.stats
            if s.prefilling:
                st.prompt_eval_ms += dt_ms
                st.n_prompt_eval += s.n_in_batch
                if (
                    not s.pending
                    and s.req.canonical
                    and (len(s.req.prompt) > 1 or self.model.split_rule != "multi")
                ):
                    s.exact_len = len(s.tokens)  # read the canonical way, all of it
            else:
                st.eval_ms += dt_ms
                st.n_eval += s.n_in_batch
        for s in rows:
            self._sample(s)

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

    def _drafting_slot(self) -> _Slot | None:
        """The one slot that drafts this step: only with one request in flight and no
        prompt being read (see the module doc)."""
        busy = [s for s in self._slots if s.req is not None]
        if len(busy) != 1 or busy[0].next_token is None or busy[0].drafter is None:
            return None
        return busy[0]

    def _propose(self, s: _Slot) -> list[int]:
        assert s.drafter is not None
        limit = s.draft_max if s.drafter.sets_length else s.k
        # Room for the drafts: the batch, and the context with a free cell left after them.
        return propose_drafts(s.drafter, self._be, min(limit, self.n_ctx_seq - 2 - len(s.tokens)))

    def _sample(self, s: _Slot) -> None:
        """Sample the slot's row(s): its next token, and with drafts, the model's token at
        each drafted position while the drafts agree (the rest of their cells are dropped)."""
        be = self._be
        req = s.req
        assert req is not None and s.sampler is not None
        drafts, s.drafts = s.drafts, []
        base = len(s.tokens) - len(drafts)  # cells through the token decoded before the drafts
        req.stats.draft_tokens += len(drafts)
        self._drafted += len(drafts)
        if req.mask is not None:  # (no drafts: _make_drafter)
            req.mask.apply(be.logits(s.batch_idx))
        for i in range(len(drafts) + 1):
            tok = be.sample(s.sampler, s.batch_idx + i)
            accepted = i < len(drafts) and tok == drafts[i]
            if accepted:
                req.stats.draft_accepted += 1
                self._accepted += 1
            else:
                self._trim(s, base + i)  # the drafts after the model's own token are dead
                if drafts and s.drafter is not None and not s.drafter.sets_length:
                    # Grow after a fully accepted draft, else one more than was accepted.
                    s.k = min(s.draft_max, s.k + 1) if i == len(drafts) else i + 1
            # Finishing inside the accepted drafts leaves the later ones dead too.
            if not self._emit_token(s, tok, keep=base + i + accepted, pos=base + i):
                return
            if not accepted:
                s.next_token = tok
                return

    def _emit_token(self, s: _Slot, tok: int, keep: int, pos: int) -> bool:
        """Hand out one generated token, which goes at position `pos`; False when the
        request finished with it. Finishing first drops the slot's cells from `keep` on: the
        request is reported done (and its slot free) only once the cache holds exactly the
        slot's tokens."""
        req = s.req
        assert req is not None
        if self._be.is_eog(tok):
            self._trim(s, keep)
            self._finish(s, "stop")
            return False
        if req.mask is not None and not req.mask.consume(tok):
            self._trim(s, keep)
            self._finish(s, "error", f"the reply left its grammar: {req.mask.error}")
            return False
        s.n_gen += 1
        self._tok_gen += 1
        req.tokens.append(tok)
        s.t_last = time.perf_counter()
        if s.drafter is not None:
            s.drafter.accept(tok)
        assert s.stream is not None
        self._out(s, s.stream.push(self._be.token_to_piece(tok, req.sampling.special_text)))
        reason: StopReason | None = None
        if s.stream.stopped:
            reason = "stop_string"
        elif req.mask is not None and req.mask.complete:
            reason = "stop"  # the grammar allows nothing more: no need to wait for EOG
        elif s.n_gen >= req.sampling.max_tokens:
            reason = "length"
        elif pos + 1 >= self.n_ctx_seq:  # (not len(tokens): they hold this step's drafts)
            reason = "context_full"
        if reason is None:
            return True
        self._trim(s, keep)
        self._finish(s, reason)
        return False

    def _trim(self, s: _Slot, keep: int) -> None:
        trim_sequence(self._be, s.seq, s.tokens, keep)
        s.exact_len = min(s.exact_len, len(s.tokens))

    def _out(self, s: _Slot, text: str) -> None:
        req = s.req
        if not text or req is None:
            return
        if s.t_first is None:
            s.t_first = time.perf_counter()
            req.stats.ttft_s = s.t_first - req.t_submit
        req.text += text
        if req.stream:
            req._emit(Piece(req.id, text, s.n_gen))

    def _finish(self, s: _Slot, reason: StopReason, error: str | None = None) -> None:
        be = self._be
        req = s.req
        assert req is not None
        if reason not in ("stop_string", "cancelled", "error") and s.stream is not None:
            self._out(s, s.stream.flush())
        if reason in ("cancelled", "error") and 0 <= s.seq < self._n_seq_max:
            # The client is gone (or the cache is suspect): free the cells now.
            be.seq_rm(s.seq)
            s.tokens.clear()
            s.exact_len = 0
        if s.sampler is not None:
            be.sampler_free(s.sampler)
        if s.drafter is not None:
            s.drafter.end()
        st = req.stats
        st.gen_tokens = s.n_gen
        st.total_s = time.perf_counter() - req.t_submit
        if s.t_first is None:
            st.ttft_s = st.total_s
        if s.t_first is not None and s.t_last is not None and s.n_gen > 1 and s.t_last > s.t_first:
            st.gen_tps_wall = (s.n_gen - 1) / (s.t_last - s.t_first)
        st.stop_reason = reason
        st.error = error
        st.finalize_rates()
        with self._cond:
            s.clear_request()
            s.last_used = time.perf_counter()
        req._emit((Failed if reason == "error" else Finished)(req.id, req.text, st))
        req.done.set()

    def _finish_unscheduled(self, req: Request, reason: StopReason) -> None:
        st = req.stats
        st.total_s = st.ttft_s = st.queue_s = time.perf_counter() - req.t_submit
        st.stop_reason = reason
        req._emit(Finished(req.id, "", st))
        req.done.set()

    def _fail_all(self, message: str) -> None:
        for s in self._slots:
            if s.req is not None:
                with contextlib.suppress(Exception):
                    self._finish(s, "error", message)
        # After an unknown failure nothing in the cache can be trusted.
        self._clear_all()


def _runs(busy: list[bool]) -> int:
    """How many runs of consecutive busy slots there are (llama.cpp micro-batches per step)."""
    return sum(1 for i, b in enumerate(busy) if b and (i == 0 or not busy[i - 1]))


__all__ = ["Scheduler"]
