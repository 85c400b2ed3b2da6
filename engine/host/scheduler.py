"""The decode loop: every request to a loaded model, from every client, runs here.

A `Model` owns exactly one `Scheduler`, and the scheduler's thread makes every llama.cpp call
on the model's context: the chat (`Model.generate` and `EmbeddedEngine`), the HTTP API, the
benchmark, `candlewick run`, embeddings. Nothing else decodes. One thread at a time: while
other models are loaded, an idle loop's thread ends after `IDLE_THREAD_S` and the next request
or task starts the next one, so an idle model holds no llama.cpp CPU workers that would slow
another model's (engine.host.loop_thread).

Continuous batching. The context is created with `n_seq_max = N`; each of the N slots owns one
sequence id. Every step decodes one batch holding the next token of every generating slot plus
chunks of prompts still being read, then samples each slot from its own row of logits with its
own sampler chain. Requests join and leave between steps, so a short request never waits for a
long one to finish.

Other threads only `submit()`, `cancel()` and hand over work (`call_idle`, `call_soon`).
Every event about a request (`Started`, `Piece`, `Finished`, `Failed`, engine.host.requests)
carries its id and goes back through a callback the caller supplies (the HTTP server hands
them to its event loop, the chat to a queue). A finished slot keeps its KV cells so that a
later request with the same prompt prefix (a chat's next turn, a shared system prompt) skips
that prefix; a cancelled request's cells are freed at once.

Interactive requests (the desktop chat) go before queued API requests, and `reserved_slots`
slots are kept for them: the chat never waits behind a queue of API requests.

Reproducible chat requests (greedy, or a fixed seed) read their prompt the canonical way
(`engine.host.batch_plan`): where the kernels need it, in the planned batches, each decoded
alone; a cached prefix is reused only as far as it was itself read that way. So the same
prompt gives the same reply however the cache was left.

The loop by concern:

- this module: the policy and the thread (admission, priority, reserved slots, slot choice,
  leases and context changes, starting a request, cancellation and deadlines);
- `engine.host.slots`: slots and their KV layout (prefix copies between slots, snapshots in
  the model's `PromptStateCache`, busy slots kept on consecutive ids);
- `engine.host.batch_builder`: what one step decodes (and speculative drafting, for each
  slot whose request asks, while it measures faster: engine.host.draft_gain);
- `engine.host.finishing`: sampling, drafts verified, stop strings and finishing.

The seam. The loop sees the model only through `LoopModel` (engine.host.loop_model) and its
context only through `ContextBackend` (engine.native.backend): it never imports `runtime`
nor calls llama.cpp. So a test builds a real `Scheduler` without a model: an object with
`backend` (a fake `ContextBackend`: batch, decode, sample, KV operations), `params`
(`LoadParams`), `split_rule`, `state_cache`, `speculator` (None), `memory_actual`,
`load_info.n_gpu_layers`, `amx_weights`, `grammar_mask`, `recreate_context` (which replaces
`backend`) and `scheduler` still None: `Scheduler(fake_model, n_slots=..., reserved_slots=...)`
(tests/fake_backend.py is one).
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
from engine.decoding.thinking_budget import BudgetKeeper
from engine.errors import EngineError
from engine.host import batch_plan, loop_thread
from engine.host.batch_builder import BatchBuilder
from engine.host.finishing import Finisher, finish_unscheduled
from engine.host.greedy_pick import chain_spec
from engine.host.logprobs import MAX_TOP_LOGPROBS
from engine.host.loop_model import LoopModel
from engine.host.loop_thread import LoopThread
from engine.host.media_steps import check_prompt
from engine.host.requests import (
    EventCallback,
    QueueFull,
    Request,
    SchedulerClosed,
    SchedulerSnapshot,
    Started,
)
from engine.host.slots import KvLayout, LoopCounters, Slot
from engine.host.speculative import (
    DEFAULT_MODEL_DRAFT_MAX,
    Drafter,
    PromptLookup,
    verify_cost,
)
from engine.media.prompt import MediaPrompt, is_placeholder
from engine.settings import DEFAULT_DRAFT_MAX, SamplingParams, SpecMode

log = logging.getLogger("candlewick.scheduler")
T = TypeVar("T")


def lora_scales(base: tuple[float, ...], over: dict[int, float] | None) -> tuple[float, ...]:
    """A request's adapter scales: the model's when `over` names none, else the scales it
    names and 0 for the others (llama-server's construct_lora_list)."""
    if not over:
        return base
    bad = [i for i in over if not 0 <= i < len(base)]
    if bad:
        raise EngineError(
            f"lora: no adapter with id {bad[0]} "
            f"({len(base)} loaded{f', ids 0 to {len(base) - 1}' if base else ''})"
        )
    return tuple(float(over.get(i, 0.0)) for i in range(len(base)))


def check_request(prompt: list[int], n_ctx_seq: int, logprobs: int | None) -> None:
    """An EngineError for a request that can never run, before anything is queued."""
    if not prompt:
        raise EngineError("the prompt is empty")
    if len(prompt) >= n_ctx_seq:
        raise EngineError(
            f"the prompt is {len(prompt)} tokens, the context holds {n_ctx_seq}; "
            "shorten the conversation or load the model with a larger context"
        )
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise EngineError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")


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
        if model.scheduler is not None:
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
        self._counts = LoopCounters()
        self._lease: tuple[str, tuple[int, int, int]] | None = None
        self._builder: BatchBuilder | None = None
        self._bind(n_slots, reserved_slots)
        self._runner = LoopThread(self._run, "candlewick-decode")
        with self._cond:
            self._runner.ensure()

    def _bind(self, n_slots: int | None, reserved: int) -> None:
        """Take the model's (new) context: slots, their KV layout, the batch, limits."""
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
        self._be = backend
        self._slots = [Slot(i) for i in range(n)]
        stream_bytes = model.memory_actual.kv_bytes // max(n_seq_max, 1)
        self._layout = KvLayout(model, backend, self._slots, self._counts, stream_bytes)
        self._fin = Finisher(backend, self.n_ctx_seq, self._counts, self._cond)
        if self._builder is not None:
            self._builder.close()
        self._builder = BatchBuilder(
            model, backend, self._slots, self.n_batch, self._counts, self._fin
        )
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
        media: MediaPrompt | None = None,
        logprobs: int | None = None,
        lora: dict[int, float] | None = None,
        thinking: BudgetKeeper | None = None,
    ) -> Request:
        """Queue a generation. Raises QueueFull when the wait queue is full, EngineError when
        the request can never run (empty prompt, longer than a slot's context, a draft model
        that is not loaded). `interactive`: a person waits on it (the chat): it goes first and
        may use the reserved slots. `spec`: speculative decoding for this request (None: the
        model's setting). `canonical` (default: `interactive`): a reproducible request reads
        its prompt the canonical way, so regenerating an answer gives the same text; the API
        does not ask for it, as llama-server does not, and keeps every cached prefix.
        `media`: the prompt's images and audio (`prompt` is its `tokens`). `logprobs`: each
        token's log probability and this many alternatives (engine.host.logprobs). `lora`:
        adapter scales by id (unnamed ones 0; None: the model's `lora_scales`)."""
        sampling.validate()
        check_request(prompt, self.n_ctx_seq, logprobs)
        check_prompt(prompt, media, self._be.n_vocab, min(self.n_batch, self.model.params.n_ubatch))
        if media is not None:  # read in any batches, never drafted
            spec, canonical = "off", False
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
                logprobs=logprobs,
                lora=lora_scales(self.model.lora_scales, lora),
            )
            req.mask, req.media, req.thinking = mask, media, thinking
            if media is not None:
                req.stats.media_tokens = media.media_tokens
            self._queue.append(req)
            self._runner.ensure()
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
        if self._runner.is_current():
            return fn()
        fut: Future[T] = Future()
        with self._cond:
            if self._stop:
                raise SchedulerClosed("the model is being unloaded")
            self._tasks.append((fn, fut, idle))
            self._runner.ensure()
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
            self._layout.clear_all()
            self._bind(n_slots, reserved)

        self.call_idle(rebind)

    def clear_cache(self) -> None:
        """Drop every slot's KV cells and saved prompt states (once requests in flight end)."""
        self.call_idle(self._layout.clear_all)

    def resize(self, n_slots: int, n_ctx_seq: int, *, reserved_slots: int = 0) -> None:
        """Recreate the context with `n_slots` sequences of `n_ctx_seq` cells each, on the
        same weights (nothing is loaded again), once requests in flight have ended. Idle
        slots' histories are saved to the state cache first, so a chat continues from a
        memory copy. Raises EngineError (the old context stays) when llama.cpp refuses."""
        if n_slots < 1 or n_ctx_seq < 1:
            raise EngineError("a context needs at least one slot and one cell")

        def swap() -> None:
            for s in self._slots:
                self._layout.save(s)
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
        c = self._counts
        builder = self._builder
        gains = builder.gain.gains() if builder is not None else {}
        with self._cond:
            slots = [s.summary() for s in self._slots]
            return SchedulerSnapshot(
                n_slots=self.n_slots,
                busy_slots=sum(1 for s in self._slots if s.req is not None),
                queue_depth=len(self._queue),
                kv_used=sum(len(s.tokens) for s in self._slots),
                kv_capacity=self.n_ctx_seq * self.n_slots,
                steps=c.steps,
                tokens_generated=c.tok_gen,
                tokens_prompt=c.tok_prompt,
                slots=slots,
                kv_copies=c.copies,
                draft_tokens=c.drafted,
                draft_accepted=c.accepted,
                draft_gain=gains,
                reserved_slots=self.reserved_slots,
                snapshots_saved=c.saved,
                snapshots_restored=c.restored,
            )

    def kv_positions(self) -> list[int]:
        """Each slot's positions in llama.cpp (pos_max + 1): tests check the bookkeeping."""
        return self.call_soon(lambda: [self._be.pos_max(s.seq) + 1 for s in self._slots])

    def with_idle_slot(self, seq: int, fn: Callable[[KvLayout, Slot], T]) -> T:
        """`fn(layout, slot)` on the decode thread between steps (the server's /slots actions)."""
        return self.call_soon(lambda: fn(self._layout, self._layout.idle_slot(seq)))

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
            self._runner.close()
        self._runner.join()
        if self._builder is not None:
            self._builder.close()

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

    def _idle(self) -> bool:
        return not self._stop and not self._queue and not self._tasks and not self._busy()

    def _run(self) -> None:
        while True:
            task = None
            with self._cond:
                while self._idle():
                    idle = not self._cond.wait(loop_thread.IDLE_THREAD_S) and self._idle()
                    if idle and self._runner.retire():
                        return  # the next request or task starts another thread
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
            builder = self._builder
            assert builder is not None
            try:
                self._fin.reap(self._slots)
                builder.step()
            except Exception as e:  # never let one bad step kill the loop
                log.exception("decode step failed")
                self._fail_all(f"generation failed: {e}")
        for s in self._slots:
            if s.req is not None:
                self._fin.finish(s, "cancelled")
        with self._cond:
            queued = list(self._queue)
            self._queue.clear()
            tasks = list(self._tasks)
            self._tasks.clear()
        for r in queued:
            finish_unscheduled(r, "cancelled")
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
                finish_unscheduled(req, "cancelled" if req.cancelled else "timeout")
        order = sorted(self._queue, key=lambda r: not r.interactive)  # stable: FIFO within
        for req in order:
            if not req.interactive:
                others = sum(1 for s in self._slots if s.req is not None and not s.req.interactive)
                if others >= self.n_slots - self.reserved_slots:
                    break
            slot = self._layout.choose(req.prompt, req.lora)
            if slot is None:
                break
            self._queue.remove(req)
            self._start(slot, req, now)
        self._layout.compact()

    def _start(self, slot: Slot, req: Request, now: float) -> None:
        """Give `req` the slot: its cached prefix, its prompt's batches, sampler, drafter."""
        be = self._be
        model = self.model
        prompt = req.prompt
        n_own = self._layout.take_prefix(slot, req)
        rule = model.split_rule if req.canonical else "any"
        reusable = n_own if rule == "any" else min(n_own, slot.exact_len)
        reusable = req.media.boundary(reusable) if req.media is not None else reusable
        # Planned in micro-batches: llama.cpp cuts a larger batch at n_ubatch, and those cuts
        # are what the kernels see.
        n_batch = min(self.n_batch, model.params.n_ubatch)
        plan = batch_plan.plan(len(prompt), reusable, n_batch, rule)
        if not self._layout.cut(slot, plan.start):
            plan = batch_plan.plan(len(prompt), 0, n_batch, rule)
        n_common = plan.start
        slot.req = req
        slot.pending = prompt[n_common:]
        slot.rule = rule
        slot.plan = deque(plan.sizes) if rule in ("grid", "tiled") else None
        slot.next_token = None
        s = req.sampling
        chain = chain_spec(s)  # a repeat penalty alone is applied by the Finisher
        slot.sampler = sampler = be.sampler(chain)
        if chain.penalizes and chain.repeat_last_n > 0:
            for t in (t for t in prompt[-s.repeat_last_n :] if not is_placeholder(t)):
                be.sampler_accept(sampler, t)  # (a media row is no word to penalize)
        slot.stream = TextStream(s.stop)
        slot.n_gen = 0
        slot.t_first = slot.t_last = None
        slot.drafts = []
        slot.drafter = self._make_drafter(req, slot)
        req.stats.cached_tokens = n_common
        req.stats.queue_s = now - req.t_submit
        req.emit(Started(req.id, n_common))

    def _make_drafter(self, req: Request, slot: Slot) -> Drafter | None:
        if req.mask is not None or req.thinking is not None:
            return None  # drafts would need the grammar's or the budget's state at each step
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

    def _fail_all(self, message: str) -> None:
        for s in self._slots:
            if s.req is not None:
                with contextlib.suppress(Exception):
                    self._fin.finish(s, "error", message)
        # After an unknown failure nothing in the cache can be trusted.
        self._layout.clear_all()


__all__ = ["Scheduler"]
