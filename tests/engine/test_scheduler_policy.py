"""The decode loop's policy without a model: the real `Scheduler` on a fake context.

Admission, priority, reserved slots, leases, KV layout and cancellation, run by the real loop
over `tests/fake_backend.py`, whose next token is a function of every KV cell its sequence
holds: a prefix copied wrong, a move that loses a cell or a trim that leaves one changes the
text, and the fake's cells are compared with the loop's bookkeeping after every test. The
same behaviour on SmolLM2 is in test_scheduler.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import pytest

import engine.host.loop_thread as loop_thread
from engine.errors import EngineError
from engine.host.requests import Event, Failed, Finished, Piece, QueueFull, Request, Started
from engine.host.scheduler import Scheduler
from engine.memory import cpu_kernels
from engine.settings import SamplingParams
from tests.fake_backend import FakeBackend, FakeLoopModel, FakeVocab, hash_next, paced
from tests.waiting import until

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
# A reply that runs until the test ends it (the fake model never ends one by itself).
ENDLESS = SamplingParams(temperature=0.0, max_tokens=100_000)
SYSTEM = list(range(1, 21))  # a 20-token "system prompt" that prompts share
VOCAB = FakeVocab()
NEXT = hash_next(len(VOCAB))


class Collector:
    """Records a request's events in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.started = threading.Event()
        self.first_piece = threading.Event()

    def __call__(self, ev: Event) -> None:
        self.events.append(ev)
        if isinstance(ev, Started):
            self.started.set()
        if isinstance(ev, Piece):
            self.first_piece.set()

    @property
    def finished(self) -> Finished:
        last = self.events[-1]
        assert isinstance(last, Finished), self.events
        return last


@pytest.fixture
def model() -> Iterator[FakeLoopModel]:
    # 2 ms a row: a long reply stays in flight while the test acts; a short one ends at once.
    m = FakeLoopModel(
        n_slots=4,
        n_ctx_seq=512,
        vocab=VOCAB,
        next_token=paced(NEXT, 0.002),
        state_cache_bytes=1 << 20,
    )
    yield m
    m.close()


@pytest.fixture
def sched(model: FakeLoopModel) -> Scheduler:
    return model.loop


def submit(
    sched: Scheduler, prompt: list[int], sampling: SamplingParams = GREEDY, **kw: object
) -> tuple[Request, Collector]:
    col = Collector()
    return sched.submit(prompt, sampling, col, **kw), col  # type: ignore[arg-type]


def wait(req: Request) -> None:
    assert req.done.wait(30), "request did not finish"


def backend(model: FakeLoopModel) -> FakeBackend:
    assert model.backend is not None
    return model.backend


def assert_no_leak(sched: Scheduler, model: FakeLoopModel) -> None:
    """Every slot idle, and each sequence's cells exactly the tokens the loop thinks it holds."""
    assert sched.wait_idle()
    snap = sched.snapshot()
    assert snap.busy_slots == 0 and snap.queue_depth == 0
    held = sched.slot_tokens()
    assert [backend(model).tokens(s) for s in range(len(held))] == held
    assert sched.kv_positions() == [len(t) for t in held]


@contextlib.contextmanager
def held(sched: Scheduler) -> Iterator[None]:
    """The loop's thread parked between two steps: what is submitted meanwhile queues."""
    parked, go = threading.Event(), threading.Event()

    def park() -> None:
        parked.set()
        go.wait(30)

    t = threading.Thread(target=sched.call_soon, args=(park,), name="park-the-loop")
    t.start()
    assert parked.wait(30)
    try:
        yield
    finally:
        go.set()
        t.join()


def alone(prompt: list[int], sampling: SamplingParams) -> list[int]:
    """The reply's tokens with the prompt decoded alone on a fresh context (the reference)."""
    fresh = FakeLoopModel(n_slots=1, n_ctx_seq=512, vocab=VOCAB, next_token=NEXT)
    try:
        req, _ = submit(fresh.loop, prompt, sampling)
        wait(req)
        return req.tokens
    finally:
        fresh.close()


# -- admission ----------------------------------------------------------------------------


def test_the_queue_holds_max_queue_beyond_the_free_slots(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    sched.configure(n_slots=2, max_queue=1)
    with held(sched):
        reqs = [submit(sched, [5, 6, 7], ENDLESS)[0] for _ in range(3)]  # 2 free + 1 queued
        with pytest.raises(QueueFull, match="2 slots are busy and 3 requests are waiting"):
            submit(sched, [5, 6, 7], ENDLESS)
        # A person waiting is never refused for a full queue.
        reqs.append(submit(sched, [5, 6, 7], GREEDY, interactive=True)[0])
    for r in reqs:
        r.cancel()
    for r in reqs:
        wait(r)
    assert_no_leak(sched, model)


def test_free_slots_not_all_slots_make_room_in_the_queue(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    sched.configure(n_slots=2, max_queue=1)
    first, col = submit(sched, [5, 6, 7], ENDLESS)
    assert col.first_piece.wait(30)
    with held(sched):
        # One slot is busy: one free slot plus a queue of one.
        queued = [submit(sched, [8, 9], ENDLESS)[0] for _ in range(2)]
        with pytest.raises(QueueFull):
            submit(sched, [8, 9], ENDLESS)
    for r in [first, *queued]:
        r.cancel()
        wait(r)
    assert_no_leak(sched, model)


def test_requests_that_can_never_run_are_refused_at_submit(sched: Scheduler) -> None:
    col = Collector()
    with pytest.raises(EngineError, match="empty"):
        sched.submit([], GREEDY, col)
    with pytest.raises(EngineError, match="context"):
        sched.submit([1] * sched.n_ctx_seq, GREEDY, col)
    with pytest.raises(EngineError, match="max_tokens"):
        sched.submit([1, 2], SamplingParams(max_tokens=0), col)
    with pytest.raises(EngineError):
        sched.submit([1, sched.model.backend.n_vocab], GREEDY, col)  # type: ignore[union-attr]
    with pytest.raises(EngineError, match="draft model"):
        sched.submit([1, 2], GREEDY, col, spec="draft")
    assert col.events == []


# -- priority and reserved slots ----------------------------------------------------------


def test_interactive_requests_go_first(sched: Scheduler, model: FakeLoopModel) -> None:
    sched.configure(n_slots=1)
    order: list[str] = []

    def note(name: str) -> Callable[[Event], None]:
        return lambda ev: order.append(name) if isinstance(ev, Started) else None

    with held(sched):
        reqs = [
            sched.submit([3, 4, 5], GREEDY, note(name), interactive=interactive)
            for name, interactive in (("api 1", False), ("api 2", False), ("chat", True))
        ]
    for r in reqs:
        wait(r)
    assert order == ["chat", "api 1", "api 2"]
    assert_no_leak(sched, model)


def test_reserved_slots_are_kept_for_interactive_requests(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    sched.configure(n_slots=2, reserved_slots=1)
    api1, c1 = submit(sched, [5, 6, 7], ENDLESS)
    api2, c2 = submit(sched, [8, 9, 10], ENDLESS)
    assert c1.first_piece.wait(30)
    snap = sched.snapshot()
    # One slot stays free for the chat: the second API request waits beside it.
    assert (snap.busy_slots, snap.queue_depth, snap.reserved_slots) == (1, 1, 1)
    assert not c2.started.is_set()
    chat, cc = submit(sched, [11, 12], GREEDY, interactive=True)
    wait(chat)
    assert cc.finished.stats.stop_reason == "length"
    assert not c2.started.is_set()  # the reserved slot went back to waiting for the chat
    api1.cancel()
    assert c2.started.wait(30)  # a slot an API request may use is free now
    api2.cancel()
    wait(api1)
    wait(api2)
    assert_no_leak(sched, model)


def test_reserving_every_slot_is_refused(sched: Scheduler) -> None:
    with pytest.raises(EngineError, match="reserved slots leave none"):
        sched.configure(reserved_slots=sched.n_slots)


# -- leases -------------------------------------------------------------------------------


def test_a_lease_reshapes_the_loop_and_release_puts_it_back(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    before = (sched.n_slots, sched.n_ctx_seq, sched.reserved_slots)
    sched.lease("local server", 3, 128, reserved_slots=1)
    assert sched.leased_by == "local server"
    assert (sched.n_slots, sched.n_ctx_seq, sched.reserved_slots) == (3, 128, 1)
    assert backend(model).n_seq_max == 3 and backend(model).n_ctx_seq == 128
    with pytest.raises(EngineError, match="the local server is using this model's slots"):
        sched.lease("benchmark", 1, 256)
    sched.release("benchmark")  # not the holder: nothing changes
    assert sched.leased_by == "local server"
    req, col = submit(sched, [4, 5, 6], GREEDY)
    wait(req)
    assert col.finished.stats.stop_reason == "length"
    sched.release("local server")
    assert sched.leased_by is None
    assert (sched.n_slots, sched.n_ctx_seq, sched.reserved_slots) == before
    sched.lease("benchmark", 1, 256)  # free again
    sched.release("benchmark")
    assert_no_leak(sched, model)


def test_a_lease_llama_cpp_refuses_leaves_the_old_shape(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    before = (sched.n_slots, sched.n_ctx_seq)
    model.refuse_contexts_over = 1024
    with pytest.raises(EngineError, match="could not make room"):
        sched.lease("local server", 8, 512)
    assert sched.leased_by is None
    assert (sched.n_slots, sched.n_ctx_seq) == before
    req, _ = submit(sched, [4, 5, 6], GREEDY)
    wait(req)
    assert_no_leak(sched, model)


def test_a_resize_keeps_an_idle_conversation_in_the_state_cache(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    """A chat's history survives a lease: saved before the context goes, restored into the
    new one by a state copy instead of being read again."""
    prompt = SYSTEM + list(range(21, 101))  # 100 tokens: worth a snapshot
    first, _ = submit(sched, prompt, GREEDY, interactive=True)
    wait(first)
    sched.lease("local server", 2, 256)
    saved = sched.snapshot().snapshots_saved
    assert saved >= 1
    again, c2 = submit(sched, [*prompt, *first.tokens, 7], GREEDY, interactive=True)
    wait(again)
    assert sched.snapshot().snapshots_restored == 1
    # Everything the first turn decoded: its prompt and reply but the last token (sampled,
    # never decoded).
    assert c2.finished.stats.cached_tokens == len(prompt) + len(first.tokens) - 1
    assert again.tokens == alone([*prompt, *first.tokens, 7], GREEDY)
    sched.release("local server")
    assert_no_leak(sched, model)


# -- KV layout ----------------------------------------------------------------------------


def test_a_prompt_prefix_is_reused_and_gives_the_same_reply(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    prompt = [*SYSTEM, 30, 31, 32]
    first, c1 = submit(sched, prompt)
    wait(first)
    second, c2 = submit(sched, prompt)
    wait(second)
    assert c1.finished.stats.cached_tokens == 0
    assert c2.finished.stats.cached_tokens == len(prompt) - 1
    assert second.tokens == first.tokens == alone(prompt, GREEDY)
    assert_no_leak(sched, model)


def test_an_api_prompt_comes_back_from_the_state_cache_after_a_burst(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    """Not only the chat's conversations are kept: an API client's prompt whose slot a burst
    of other requests took is saved first and restored when it comes again (llama-server's
    RAM prompt cache), so only its last token is read again."""
    prompt = [*SYSTEM, *range(200, 210)]
    first, _ = submit(sched, prompt)  # not interactive: an API client's request
    wait(first)
    burst_prompts = [[*SYSTEM, 300 + i, 301 + i] for i in range(sched.n_slots)]
    with held(sched):  # all admitted in one go: one of them must take the prompt's slot
        burst = [submit(sched, p)[0] for p in burst_prompts]
    for r in burst:
        wait(r)
    assert not any(t[: len(prompt)] == prompt for t in sched.slot_tokens())  # overwritten
    assert sched.snapshot().snapshots_saved >= 1
    again, col = submit(sched, prompt)
    wait(again)
    assert sched.snapshot().snapshots_restored == 1
    assert col.events[0] == Started(again.id, len(prompt) - 1)
    assert again.tokens == first.tokens == alone(prompt, GREEDY)
    assert_no_leak(sched, model)


def test_clearing_the_cache_drops_the_saved_prompts_too(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    """A benchmark that clears the cache before each request measures prompt reading, not a
    restore from the state cache."""
    prompt = [*SYSTEM, *range(200, 210)]
    first, _ = submit(sched, prompt)
    wait(first)
    with held(sched):
        burst = [submit(sched, [400 + i] * 20)[0] for i in range(sched.n_slots)]
    for r in burst:
        wait(r)
    assert sched.snapshot().snapshots_saved >= 1
    sched.clear_cache()
    again, col = submit(sched, prompt)
    wait(again)
    assert sched.snapshot().snapshots_restored == 0
    assert col.events[0] == Started(again.id, 0)
    assert_no_leak(sched, model)


def test_a_prefix_is_copied_to_a_slot_next_to_the_busy_ones(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    q = [*SYSTEM, 30, 31, 32]
    first, _ = submit(sched, q)
    wait(first)
    home = next(s["id"] for s in sched.snapshot().slots if s["cached_tokens"] > 0)
    long_req, long_col = submit(sched, [*SYSTEM, 40, 41], ENDLESS)
    assert long_col.first_piece.wait(30)
    # A new conversation takes an empty slot (the cached one is kept) but still skips the
    # system prompt it shares with the cached one: a copy of that slot's stream.
    long_slot = next(s["id"] for s in sched.snapshot().slots if s["busy"])
    assert long_slot != home
    copies = sched.snapshot().kv_copies
    assert copies >= 1
    assert long_col.events[0] == Started(long_req.id, len(SYSTEM))
    again, col = submit(sched, q, ENDLESS)  # in flight beside the long one, however slow
    assert col.first_piece.wait(30)
    ids = [s["id"] for s in sched.snapshot().slots if s["busy"]]
    assert len(ids) == 2 and ids[1] == ids[0] + 1, ids  # next to the busy one
    assert col.events[0] == Started(again.id, len(q) - 1)
    deadline = time.monotonic() + 60
    while len(again.tokens) < len(first.tokens):
        assert time.monotonic() < deadline, "the request stopped generating"
        time.sleep(0.01)
    assert again.tokens[: len(first.tokens)] == first.tokens
    assert sched.snapshot().kv_copies >= copies
    for r in (again, long_req):
        r.cancel()
        wait(r)
    assert_no_leak(sched, model)


def test_a_hole_is_closed_and_the_moved_request_is_unchanged(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    """Cancelling the middle one of three busy slots leaves a hole; an end slot's request moves
    into it (its KV cells copied) and goes on exactly as it would have alone."""
    n = 100
    prompts = [[50 + i, 51 + i, 52 + i] for i in range(3)]
    expected = [alone(p, SamplingParams(temperature=0.0, max_tokens=n)) for p in prompts]
    reqs = [submit(sched, p, ENDLESS) for p in prompts]  # in flight however slow the machine
    for _, col in reqs:
        assert col.first_piece.wait(30)
    snap = sched.snapshot()
    by_slot = {s["id"]: s["request"] for s in snap.slots if s["busy"]}
    ids = sorted(by_slot)
    assert len(ids) == 3 and ids == list(range(ids[0], ids[0] + 3)), ids
    middle = next(i for i, (r, _) in enumerate(reqs) if r.id == by_slot[ids[1]])
    copies = snap.kv_copies
    reqs[middle][0].cancel()
    wait(reqs[middle][0])
    others = [reqs[i][0] for i in range(3) if i != middle]
    deadline = time.monotonic() + 60
    while any(len(r.tokens) < n for r in others):
        assert time.monotonic() < deadline, "the requests stopped generating"
        time.sleep(0.01)
    snap = sched.snapshot()
    busy = [s["id"] for s in snap.slots if s["busy"]]
    assert len(busy) == 2 and busy[1] == busy[0] + 1, busy  # no hole left
    assert snap.kv_copies > copies  # closed by a move
    for r in others:
        r.cancel()
        wait(r)
    assert [r.tokens[:n] for r in others] == [e for i, e in enumerate(expected) if i != middle]
    assert_no_leak(sched, model)


def test_concurrent_requests_give_their_alone_replies(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    """Prompts read in chunks beside generating slots, replies sampled row by row: each
    request's tokens are what it gets alone (the fake has no batch-dependent kernels)."""
    prompts = [[*SYSTEM, 60 + i] * (i + 1) for i in range(6)]
    sp = SamplingParams(temperature=0.0, max_tokens=24)
    expected = [alone(p, sp) for p in prompts]
    reqs = [submit(sched, p, sp)[0] for p in prompts]
    for r in reqs:
        wait(r)
    assert [r.tokens for r in reqs] == expected
    assert_no_leak(sched, model)


def test_seeded_sampling_is_reproducible(sched: Scheduler, model: FakeLoopModel) -> None:
    sp = SamplingParams(temperature=1.0, seed=1234, max_tokens=20)
    runs = [submit(sched, [7, 8, 9], sp)[0] for _ in range(2)]
    for r in runs:
        wait(r)
    assert runs[0].tokens == runs[1].tokens
    assert_no_leak(sched, model)


@pytest.mark.parametrize("small_tiles", [False, True], ids=["upstream", "small-tiles"])
def test_a_reproducible_reply_past_256_positions_decodes_on_the_loads_thread_count(
    sched: Scheduler, model: FakeLoopModel, monkeypatch: pytest.MonkeyPatch, small_tiles: bool
) -> None:
    # Upstream's CPU flash attention splits one query's sums across the threads over 512+
    # cells (256+ positions, the cache viewed in steps of 256): those steps of a reproducible
    # reply must not run on whatever count the thread tuner chose, or Regenerate may change the
    # text. The project's build (small tiles) has no such path: nothing is pinned.
    features = dataclasses.replace(cpu_kernels.detect(), fa_small_tiles=small_tiles)
    monkeypatch.setattr(cpu_kernels, "detect", lambda: features)
    be = model.backend
    assert be is not None
    long_prompt = list(range(1, 241))  # the reply passes 256 positions at its 17th token
    sp = SamplingParams(temperature=0.0, max_tokens=40)
    model.flash_attn_on = False
    wait(submit(sched, long_prompt, sp, canonical=True)[0])
    assert be.fixed_thread_steps == 0
    model.flash_attn_on = True
    wait(submit(sched, long_prompt[:100], sp, canonical=True)[0])  # never that deep
    wait(submit(sched, long_prompt, sp)[0])  # the API's: nothing promised
    sampled = SamplingParams(temperature=0.8, max_tokens=40)
    wait(submit(sched, long_prompt, sampled, canonical=True)[0])  # not reproducible
    assert be.fixed_thread_steps == 0
    wait(submit(sched, long_prompt, sp, canonical=True)[0])
    if small_tiles:
        assert be.fixed_thread_steps == 0
    else:  # the steps from the 17th token on, not the ones before
        assert 20 <= be.fixed_thread_steps <= 24
    assert_no_leak(sched, model)


# -- stop and cancellation ----------------------------------------------------------------


def test_stop_strings_and_max_tokens(sched: Scheduler, model: FakeLoopModel) -> None:
    full, c1 = submit(sched, [9, 10, 11], SamplingParams(temperature=0.0, max_tokens=12))
    wait(full)
    text = c1.finished.text
    assert c1.finished.stats.stop_reason == "length" and c1.finished.stats.gen_tokens == 12
    words = text.split()
    stop = words[3]
    cut, c2 = submit(
        sched, [9, 10, 11], SamplingParams(temperature=0.0, max_tokens=12, stop=(stop,))
    )
    wait(cut)
    assert c2.finished.stats.stop_reason == "stop_string"
    assert c2.finished.text == text[: text.index(stop)]
    assert stop not in "".join(e.text for e in c2.events if isinstance(e, Piece))
    assert_no_leak(sched, model)


def test_end_of_generation_stops_a_reply() -> None:
    vocab = FakeVocab()
    script = vocab.tokenize(" one two three")
    m = FakeLoopModel(
        n_slots=1, vocab=vocab, next_token=lambda h: script[len(h) - 2] if len(h) < 5 else 0
    )
    try:
        req, col = submit(m.loop, [1, 2], SamplingParams(temperature=0.0, max_tokens=50))
        wait(req)
        assert col.finished.text == " one two three"
        assert col.finished.stats.stop_reason == "stop"
        assert_no_leak(m.loop, m)
    finally:
        m.close()


def test_cancel_frees_the_slot_and_its_cells(sched: Scheduler, model: FakeLoopModel) -> None:
    req, col = submit(sched, [5, 6, 7], ENDLESS)
    assert col.first_piece.wait(30)
    slot = next(s["id"] for s in sched.snapshot().slots if s["request"] == req.id)
    assert sched.kv_positions()[slot] > 0
    req.cancel()
    wait(req)
    assert col.finished.stats.stop_reason == "cancelled"
    assert sched.snapshot().slots[slot]["cached_tokens"] == 0
    assert backend(model).pos_max(slot) == -1  # the fake context holds no cell for it
    assert_no_leak(sched, model)


def test_a_queued_request_cancelled_or_timed_out_never_starts(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    stop = threading.Event()
    with held(sched):
        cancelled, c1 = submit(sched, [5, 6], ENDLESS)
        external, c2 = submit(sched, [5, 6], ENDLESS, cancel=stop)
        late, c3 = submit(sched, [5, 6], ENDLESS, timeout_s=0.01)
        cancelled.cancel()
        stop.set()
        time.sleep(0.05)  # past the third one's deadline
    for r in (cancelled, external, late):
        wait(r)
    assert [c.events for c in (c1, c2, c3)] == [
        [c1.finished],
        [c2.finished],
        [c3.finished],
    ]
    assert [c.finished.stats.stop_reason for c in (c1, c2, c3)] == [
        "cancelled",
        "cancelled",
        "timeout",
    ]
    assert_no_leak(sched, model)


def test_a_running_request_times_out(sched: Scheduler, model: FakeLoopModel) -> None:
    req, col = submit(sched, [5, 6, 7], ENDLESS, timeout_s=0.3)
    wait(req)
    assert col.finished.stats.stop_reason == "timeout"
    assert_no_leak(sched, model)


def test_a_failed_decode_fails_its_requests_and_frees_their_cells(
    sched: Scheduler, model: FakeLoopModel
) -> None:
    req, col = submit(sched, [5, 6, 7], ENDLESS)
    assert col.first_piece.wait(30)
    backend(model).fail_next = 1
    wait(req)
    assert isinstance(col.finished, Failed)
    assert "the context is full" in col.finished.message
    assert_no_leak(sched, model)
    after, c2 = submit(sched, [5, 6, 7])  # the loop goes on
    wait(after)
    assert c2.finished.stats.stop_reason == "length"


def test_a_broken_consumer_does_not_stop_the_loop(sched: Scheduler, model: FakeLoopModel) -> None:
    def explode(ev: Event) -> None:
        raise RuntimeError("consumer bug")

    bad = sched.submit([1, 2, 3], GREEDY, explode)
    wait(bad)
    req, col = submit(sched, [1, 2, 3])
    wait(req)
    assert col.finished.text
    assert_no_leak(sched, model)


def test_close_cancels_running_and_queued(model: FakeLoopModel) -> None:
    sched = model.loop
    sched.configure(n_slots=1)
    running, rcol = submit(sched, [5, 6], ENDLESS)
    queued, qcol = submit(sched, [7, 8], ENDLESS)
    assert rcol.first_piece.wait(30)
    sched.close()
    assert running.done.is_set() and queued.done.is_set()
    assert rcol.finished.stats.stop_reason == "cancelled"
    assert qcol.finished.stats.stop_reason == "cancelled"
    assert not qcol.started.is_set()
    with pytest.raises(EngineError):
        sched.submit([1, 2], GREEDY, rcol)


def test_one_loop_per_context(sched: Scheduler, model: FakeLoopModel) -> None:
    with pytest.raises(EngineError, match="n_seq_max"):
        sched.configure(n_slots=sched.n_slots + 1)
    with pytest.raises(EngineError, match="one decode loop"):
        Scheduler(model)


def test_an_idle_loop_thread_ends_while_another_loop_is_open(
    sched: Scheduler, model: FakeLoopModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # llama.cpp's CPU workers belong to the decoding thread: an idle model's loop thread ends,
    # so its workers do not slow another model's (engine.host.loop_thread.IDLE_THREAD_S).
    monkeypatch.setattr(loop_thread, "IDLE_THREAD_S", 0.05)
    req, col = submit(sched, [1, 2, 3])
    wait(req)
    first = sched.call_soon(threading.current_thread)
    assert first.name == "candlewick-decode"
    other = FakeLoopModel(n_slots=1, n_ctx_seq=64, vocab=VOCAB, next_token=NEXT)
    try:
        assert other.loop.n_slots == 1  # another model's loop
        assert until(lambda: not first.is_alive())
        again, col2 = submit(sched, [1, 2, 3])
        wait(again)
        assert col2.finished.text == col.finished.text
        second = sched.call_soon(threading.current_thread)
        assert second is not first and second.name == "candlewick-decode"
        assert_no_leak(sched, model)

        # A request in flight keeps its thread however long it takes.
        long, lcol = submit(sched, [4, 5], ENDLESS)
        assert lcol.first_piece.wait(30)
        running = sched.call_soon(threading.current_thread)
        time.sleep(0.3)  # six idle spells: not one of them is idle
        assert running.is_alive() and not long.done.is_set()
        long.cancel()
        wait(long)
        assert until(lambda: not running.is_alive())
        sched.close()  # with no thread left, close still ends the loop
        with pytest.raises(EngineError):
            sched.submit([1, 2], GREEDY, col)
    finally:
        other.close()


def test_a_lone_loop_keeps_its_idle_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # A new thread would only add its start to the next reply. The rule alone, on loops of
    # its own (the suite's other models are loaded in this process too).
    monkeypatch.setattr(loop_thread, "_open", weakref.WeakSet())
    first = loop_thread.LoopThread(lambda: None, "first")
    assert not first.retire()
    second = loop_thread.LoopThread(lambda: None, "second")
    assert first.retire() and second.retire()
    second.close()
    assert not first.retire()
    assert loop_thread.open_loop_threads() == [first]
