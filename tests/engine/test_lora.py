"""LoRA adapters on a loaded model: loaded with it, counted with its weights, scaled per
request, and never two settings in one batch or one reused prefix.

The loop's rules run first on the fake context (tests/fake_backend.py records the scales each
decode ran under); then SmolLM2 with the seeded random adapter of tests/lora_gguf.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.host.requests import Event, Finished, Started
from engine.host.runtime import Model, with_adapters
from engine.host.scheduler import lora_scales
from engine.memory.buffer_log import device_of
from engine.memory.estimate import estimate
from engine.memory.params import EstimateParams
from engine.native.lora import adapter_tensor_bytes
from engine.settings import LoadParams, SamplingParams
from tests.fake_backend import FakeLoopModel
from tests.lora_gguf import tensor_bytes

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
PROMPT = "The capital of France is"


class Events:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, ev: Event) -> None:
        self.events.append(ev)

    def started(self) -> Started:
        return next(e for e in self.events if isinstance(e, Started))


def test_request_scales_override_the_models_by_id() -> None:
    assert lora_scales((1.0, 0.5), None) == (1.0, 0.5)
    assert lora_scales((1.0, 0.5), {1: 0.25}) == (0.0, 0.25)  # the others 0, as llama-server
    assert lora_scales((1.0, 0.5), {}) == (1.0, 0.5)
    assert lora_scales((), None) == ()
    with pytest.raises(EngineError, match=r"lora: no adapter with id 2 \(2 loaded, ids 0 to 1\)"):
        lora_scales((1.0, 0.5), {2: 1.0})
    with pytest.raises(EngineError, match=r"lora: no adapter with id 0 \(0 loaded\)"):
        lora_scales((), {0: 1.0})


def test_batches_and_prefixes_hold_one_setting() -> None:
    model = FakeLoopModel(n_slots=4, n_ctx_seq=256)
    model.lora_scales = (1.0,)
    try:
        be = model.backend
        assert be is not None
        prompt = list(range(1, 40))
        sp = SamplingParams(temperature=0.0, max_tokens=30)
        a, b = Events(), Events()
        ra = model.loop.submit(prompt, sp, a)
        rb = model.loop.submit(prompt, sp, b, lora={0: 0.0})
        for r in (ra, rb):
            assert r.done.wait(30)
        assert (ra.lora, rb.lora) == ((1.0,), (0.0,))
        # Every decode ran one setting, and each request's rows only under its own.
        by_seq: dict[int, set[tuple[float, ...]]] = {}
        for scales, seqs in be.lora_batches:
            for seq in seqs:
                by_seq.setdefault(seq, set()).add(scales)
        assert sorted(by_seq.values(), key=str) == [{(0.0,)}, {(1.0,)}]
        # The second read the whole prompt again: the first's cells were made under 1.0.
        assert b.started().cached_tokens == 0
        c = Events()
        rc = model.loop.submit(prompt, sp, c, lora={0: 0.0})
        assert rc.done.wait(30)
        assert c.started().cached_tokens > 0  # the same setting's cells are reused
        assert isinstance(c.events[-1], Finished)
        with pytest.raises(EngineError, match="lora: no adapter with id 3"):
            model.loop.submit(prompt, sp, Events(), lora={3: 1.0})
    finally:
        model.close()


def test_the_prompt_cache_keeps_only_the_loads_setting() -> None:
    """Saved states carry no setting: only KV made under the load's scales is saved or
    restored."""
    model = FakeLoopModel(n_slots=1, n_ctx_seq=512, state_cache_bytes=1 << 20)
    model.params = replace(model.params, loras=(("adapter.gguf", 1.0),))
    model.lora_scales = (1.0,)
    sp = SamplingParams(temperature=0.0, max_tokens=4)
    first, other = list(range(1, 101)), list(range(200, 300))

    def run(prompt: list[int], scale: float) -> tuple[int, int, int]:
        ev = Events()
        req = model.loop.submit(prompt, sp, ev, lora={0: scale})
        assert req.done.wait(30)
        snap = model.loop.snapshot()
        return ev.started().cached_tokens, snap.snapshots_saved, snap.snapshots_restored

    try:
        assert run(first, 1.0) == (0, 0, 0)
        assert run(other, 0.5) == (0, 1, 0)  # the slot's cells under 1.0 saved, then dropped
        assert run(first, 0.5) == (0, 1, 0)  # not restored under 0.5; 0.5's cells not saved
        assert run(other, 1.0) == (0, 1, 0)  # nor these
        # The load's setting comes back from the cache (but the last prompt token, read again),
        # the slot's cells under 1.0 saved before.
        assert run(first, 1.0) == (len(first) - 1, 2, 1)
    finally:
        model.close()


def test_a_model_file_is_no_adapter(smollm2_path: Path) -> None:
    with pytest.raises(EngineError, match="is not a LoRA adapter"):
        adapter_tensor_bytes(smollm2_path)


@pytest.fixture(scope="module")
def lora_model(smollm2_path: Path, smollm2_lora_path: Path) -> Iterator[Model]:
    params = LoadParams(
        n_ctx=2048, n_seq_max=2, n_threads=2, loras=((str(smollm2_lora_path), 1.0),)
    )
    model = Model(smollm2_path, params)
    yield model
    model.close()


def answer(model: Model, lora: dict[int, float] | None = None) -> str:
    return "".join(model.complete(PROMPT, GREEDY, lora=lora))


def test_adapter_is_counted_with_the_weights(
    lora_model: Model, smollm2: Model, smollm2_lora_path: Path
) -> None:
    size = tensor_bytes(smollm2_lora_path)
    assert size == adapter_tensor_bytes(smollm2_lora_path) > 1 << 20
    (adapter,) = lora_model.loras
    # llama.cpp's log of its buffer rounds to 0.01 MiB. The adapter takes the base weights'
    # buffer type: "CPU_Mapped" where they are mapped from the file, "CPU" where they were
    # copied into an extra one (AMX); both are RAM on this CPU build.
    (buffer,) = adapter.buffers
    assert device_of(buffer) == "CPU" and buffer in ("CPU", "CPU_Mapped")
    in_ram = adapter.buffers[buffer]
    assert abs(in_ram - size) <= 0.005 * (1 << 20)
    mine, base = lora_model.memory_actual, smollm2.memory_actual
    assert mine.weights_bytes == base.weights_bytes + in_ram
    # The host's figures (engine.host.budget) are the devices': the adapter is in RAM's.
    added = with_adapters(base, [adapter])
    assert added.devices["CPU"] == base.devices["CPU"] + in_ram
    assert added.weights_bytes == mine.weights_bytes
    assert [a.path for a in lora_model.loras] == [smollm2_lora_path]
    assert lora_model.lora_scales == (1.0,)


def test_estimate_counts_the_adapter(smollm2_path: Path, smollm2_lora_path: Path) -> None:
    base = LoadParams(n_ctx=2048, n_seq_max=2, n_threads=2)
    params = EstimateParams(load=replace(base, loras=((str(smollm2_lora_path), 1.0),)))
    bare = estimate(smollm2_path, EstimateParams(load=base), method="analytic")
    est = estimate(smollm2_path, params, method="analytic")
    assert est.total_bytes - bare.total_bytes == tensor_bytes(smollm2_lora_path)
    assert any("RAM includes 1 LoRA adapter: 1.8 MiB of tensors" in n for n in est.notes)


def test_scale_zero_is_the_base_model_and_one_is_not(lora_model: Model, smollm2: Model) -> None:
    smollm2.reset_cache()
    base = answer(smollm2)
    assert answer(lora_model, {0: 0.0}) == base
    adapted = answer(lora_model)  # the load's scale, 1
    assert adapted != base
    assert answer(lora_model, {0: 1.0}) == adapted


def test_concurrent_requests_with_other_scales_answer_as_alone(lora_model: Model) -> None:
    alone = {s: answer(lora_model, {0: s}) for s in (0.0, 1.0)}
    lora_model.reset_cache()
    out: dict[float, str] = {}
    gate = threading.Barrier(2)

    def run(scale: float) -> None:
        gate.wait()
        out[scale] = answer(lora_model, {0: scale})

    threads = [threading.Thread(target=run, args=(s,)) for s in (0.0, 1.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert out == alone
    assert alone[0.0] != alone[1.0]
