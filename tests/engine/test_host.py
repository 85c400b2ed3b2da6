"""One engine, many clients: the chat, the HTTP API, embeddings and the benchmark share one
loaded SmolLM2, one context and one decode loop."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import engine.host.loop_thread as loop_thread
from engine.errors import EngineError
from engine.host.host import ModelHost, ModelNotLoaded
from engine.host.requests import Event, Finished, Piece, Started
from engine.host.runtime import Model
from engine.native import llama_lib
from engine.server import ServedModel, ServerConfig, ServerState, ServerThread
from engine.settings import LoadParams, SamplingParams
from tests.fake_backend import FakeLoopModel, FakeVocab, hash_next
from tests.waiting import until

GREEDY = SamplingParams(temperature=0, max_tokens=24)
ASK = [{"role": "user", "content": "What is the capital of France? One word."}]


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> Iterator[Model]:
    m = Model(smollm2_path, LoadParams(n_ctx=3 * 1024, n_seq_max=3, n_threads=2))
    yield m
    m.close()


@pytest.fixture(scope="module")
def served(model: Model) -> Iterator[tuple[ServedModel, openai.OpenAI]]:
    loaded = ServedModel.build(model, "smollm2", max_queue=16)
    state = ServerState(ServerConfig(port=0, model_id="smollm2"))
    state.set_loaded(loaded)
    with (
        ServerThread(state) as srv,
        openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=120) as c,
    ):
        yield loaded, c
    loaded.close()


def idle_and_clean(m: Model) -> None:
    loop = m.loop
    assert loop.wait_idle(60)
    assert loop.kv_positions() == [len(t) for t in loop.slot_tokens()]


def test_chat_and_api_requests_interleave_on_one_model(
    model: Model, served: tuple[ServedModel, openai.OpenAI]
) -> None:
    _, client = served
    model.reset_cache()
    alone = model.generate(ASK, GREEDY).consume()  # the chat's answer with nothing else on
    api_alone = client.chat.completions.create(
        model="smollm2",
        messages=ASK,  # type: ignore
        max_tokens=24,
        temperature=0,
    )
    steps = model.loop.snapshot().steps
    answers: list[str] = []

    def api_call() -> None:
        r = client.chat.completions.create(
            model="smollm2",
            messages=ASK,  # type: ignore
            max_tokens=24,
            temperature=0,
        )
        answers.append(r.choices[0].message.content or "")

    threads = [threading.Thread(target=api_call) for _ in range(2)]
    for t in threads:
        t.start()
    gen = model.generate(ASK, GREEDY)
    chat = gen.consume()
    for t in threads:
        t.join(120)
    # Each answer is the one it gets alone, up to where batched kernels may part
    # (tests/exactness.py): the first words at least.
    assert chat.split()[:1] == alone.split()[:1]
    assert len(answers) == 2
    for a in answers:
        assert a.split()[:1] == (api_alone.choices[0].message.content or "").split()[:1]
    st = gen.stats
    assert st.stop_reason in ("stop", "length") and st.gen_tokens > 0
    assert st.prompt_tokens == len(model.chat_tokens(ASK))
    assert 0 < st.ttft_s <= st.total_s and st.gen_tps > 0
    # They ran together: fewer steps than three requests one after the other would take.
    assert model.loop.snapshot().steps - steps < 3 * 24
    idle_and_clean(model)


def test_cancelling_either_frees_its_cells(
    model: Model, served: tuple[ServedModel, openai.OpenAI]
) -> None:
    loaded, client = served
    model.reset_cache()
    story = [{"role": "user", "content": "Write a very long story about a dragon."}]
    long = SamplingParams(temperature=0, max_tokens=400)
    # An API stream, dropped after a few chunks...
    stream = client.chat.completions.create(
        model="smollm2",
        messages=story,  # type: ignore
        max_tokens=400,
        stream=True,
    )
    cancel = threading.Event()
    gen = model.generate(story, long, cancel=cancel)
    it = iter(gen)
    next(it)
    for i, _chunk in enumerate(stream):
        if i == 3:
            break
    stream.close()
    # ...and the chat's reply, stopped from another thread.
    threading.Timer(0.2, cancel.set).start()
    for _ in it:
        pass
    assert gen.stats.stop_reason == "cancelled"
    assert loaded.scheduler.wait_idle(60)
    snap = model.loop.snapshot()
    assert snap.busy_slots == 0
    assert model.loop.kv_positions() == [0, 0, 0]  # both cancelled: every cell freed
    idle_and_clean(model)


def test_every_decode_runs_on_the_one_loop_thread(
    model: Model, served: tuple[ServedModel, openai.OpenAI], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, client = served
    C = llama_lib.lib()
    real = C.llama_decode
    threads: set[str] = set()

    def recording(ctx: Any, batch: Any) -> int:
        threads.add(threading.current_thread().name)
        return int(real(ctx, batch))

    monkeypatch.setattr(C, "llama_decode", recording)
    model.generate(ASK, GREEDY).consume()
    client.chat.completions.create(
        model="smollm2",
        messages=ASK,  # type: ignore
        max_tokens=8,
    )
    client.embeddings.create(model="smollm2", input="bread and butter")
    assert threads == {"candlewick-decode"}


def process_threads() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_an_idle_loop_takes_its_cpu_workers_along(
    model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    # llama.cpp's CPU workers (an OpenMP team) belong to the thread that decodes. Were they
    # left behind by an idle model, a second model's workers would exceed the cores and
    # decode several times slower (docs/benchmarks.md, "Two models in one process").
    if "libgomp" not in Path("/proc/self/maps").read_text():
        pytest.skip("this llama.cpp build keeps no OpenMP team per thread")
    C = llama_lib.lib()
    real = C.llama_decode
    seen: list[tuple[threading.Thread, set[int]]] = []

    def recording(ctx: Any, batch: Any) -> int:
        rc = int(real(ctx, batch))
        seen.append((threading.current_thread(), process_threads()))  # with its team
        return rc

    monkeypatch.setattr(C, "llama_decode", recording)
    model.generate(ASK, GREEDY).consume()
    monkeypatch.setattr(C, "llama_decode", real)
    decode_thread, with_team = seen[-1]
    monkeypatch.setattr(loop_thread, "IDLE_THREAD_S", 0.05)
    other = FakeLoopModel(n_slots=1, n_ctx_seq=64, vocab=FakeVocab(), next_token=hash_next(8))
    try:  # another model's loop, without weights: the idle one's thread ends
        assert other.loop.n_slots == 1
        assert until(lambda: not decode_thread.is_alive())
        # The loop thread and its n_threads - 1 workers, however other threads come and go.
        workers = model.load_info.n_threads
        assert until(lambda: len(with_team - process_threads()) >= workers)
        assert model.generate(ASK, GREEDY).consume()  # the next request starts another
    finally:
        other.close()


def test_the_chat_never_waits_behind_queued_api_requests(model: Model) -> None:
    loop = model.loop
    loop.configure(reserved_slots=1, max_queue=16)
    try:
        model.reset_cache()
        events: list[tuple[str, Event]] = []
        lock = threading.Lock()

        def note(who: str) -> Any:
            def on(ev: Event) -> None:
                with lock:
                    events.append((who, ev))

            return on

        long = SamplingParams(temperature=0, max_tokens=120)
        prompts = [
            model.chat_tokens([{"role": "user", "content": f"Story number {i}."}]) for i in range(4)
        ]
        api = [loop.submit(p, long, note(f"api{i}")) for i, p in enumerate(prompts)]
        time.sleep(0.3)
        snap = loop.snapshot()
        # Two slots for API requests, one kept for the chat: two wait.
        assert snap.busy_slots == 2 and snap.queue_depth == 2
        chat = loop.submit(
            model.chat_tokens(ASK),
            SamplingParams(temperature=0, max_tokens=8),
            note("chat"),
            interactive=True,
        )
        assert chat.done.wait(120)
        with lock:
            started = [who for who, ev in events if isinstance(ev, Started)]
            done = [who for who, ev in events if isinstance(ev, Finished)]
        # Given the reserved slot ahead of the two API requests queued before it.
        assert started[:3] == ["api0", "api1", "chat"] or started[:3] == ["api1", "api0", "chat"]
        assert done[0] == "chat"
        for r in api:
            r.cancel()
        idle_and_clean(model)
    finally:
        loop.configure(reserved_slots=0, max_queue=64)


def test_events_carry_their_request_id(model: Model) -> None:
    loop = model.loop
    got: dict[int, list[Event]] = {}
    lock = threading.Lock()

    def on(ev: Event) -> None:
        with lock:
            got.setdefault(ev.rid, []).append(ev)

    reqs = [
        loop.submit(model.chat_tokens([{"role": "user", "content": q}]), GREEDY, on)
        for q in ("Name a fruit.", "Name a color.")
    ]
    for r in reqs:
        assert r.done.wait(300)  # a state, not a speed: generous on a busy machine
    assert set(got) == {r.id for r in reqs}
    for r in reqs:
        evs = got[r.id]
        assert isinstance(evs[0], Started) and isinstance(evs[-1], Finished)
        text = "".join(e.text for e in evs if isinstance(e, Piece))
        assert text == evs[-1].text == r.text  # nothing of the other's in it


def test_the_host_refuses_a_model_it_has_not_loaded(model: Model) -> None:
    host = ModelHost()
    with pytest.raises(ModelNotLoaded) as exc:
        host.get("smollm2")
    assert str(exc.value) == "model 'smollm2' is not loaded (no model is loaded)"
    host.add("smollm2", model)
    assert host.get("smollm2") is model
    with pytest.raises(ModelNotLoaded, match=r"^model 'qwen' is not loaded \(loaded: smollm2\)$"):
        host.get("qwen")
    with pytest.raises(EngineError, match="already loaded as 'smollm2'"):
        host.add("again", model)  # one file, one loaded instance
    assert host.remove("smollm2") is model and host.names() == []


def test_a_lease_resizes_the_loop_and_gives_the_chat_its_history_back(smollm2_path: Path) -> None:
    with Model(smollm2_path, LoadParams(n_ctx=1024, n_threads=2)) as m:
        loop = m.loop
        talk = [{"role": "user", "content": "Write a paragraph about Paris."}]
        # Sampled, not greedy: the prompt is not re-read the canonical way (batch_plan),
        # so every cached cell counts. Top-k 1 keeps it short of surprises.
        sampling = SamplingParams(temperature=0.7, top_k=1, max_tokens=80)
        first = m.generate(talk, sampling)
        answer = first.consume()
        assert len(first.prompt) + first.stats.gen_tokens > 64  # worth a snapshot
        follow = [
            *talk,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And of Rome?"},
        ]
        kv0 = m.memory_actual.kv_bytes
        loop.lease("server", 3, 1024, reserved_slots=1)
        assert (loop.n_slots, loop.n_ctx_seq, loop.reserved_slots) == (3, 1024, 1)
        assert m.memory_actual.kv_bytes == 3 * kv0  # only the new slots' KV was added
        with pytest.raises(EngineError, match="the server is using this model's slots"):
            loop.lease("benchmark", 2, 512)
        loop.release("server")
        assert (loop.n_slots, loop.n_ctx_seq, loop.reserved_slots) == (1, 1024, 0)
        assert m.memory_actual.kv_bytes == kv0
        # The conversation came back from its snapshot: the follow-up reads only its news.
        gen = m.generate(follow, sampling)
        gen.consume()
        assert gen.stats.cached_tokens >= len(first.prompt)
        assert loop.snapshot().snapshots_restored >= 1


def test_a_paced_reader_gets_the_whole_text_in_fewer_wakeups(model: Model) -> None:
    """`Generation.paced`: the same text as reading piece by piece, gathered in chunks."""
    sampling = SamplingParams(temperature=0, max_tokens=48, stop=())
    one_by_one = model.generate(ASK, sampling)
    pieces = list(one_by_one)
    paced = model.generate(ASK, sampling)
    # Long enough that the loop makes several tokens while the reader sleeps, on any machine.
    chunks = list(paced.paced(0.5))
    assert "".join(chunks) == paced.text == one_by_one.text == "".join(pieces)
    assert paced.done and paced.stats.gen_tokens == one_by_one.stats.gen_tokens
    assert len(chunks) < len(pieces)


def test_a_paced_reader_sees_a_cancel_and_the_end(model: Model) -> None:
    # A long greedy reply (as test_cancelling_either_frees_its_cells uses): a one-word answer
    # could end before the loop sees the flag.
    story = [{"role": "user", "content": "Write a very long story about a dragon."}]
    cancel = threading.Event()
    gen = model.generate(story, SamplingParams(temperature=0, max_tokens=400), cancel=cancel)
    got = []
    for chunk in gen.paced(0.05):
        got.append(chunk)
        cancel.set()
    assert gen.done and gen.stats.stop_reason == "cancelled"
    assert "".join(got) == gen.text
