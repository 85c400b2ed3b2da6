"""The decode speed prediction without a model: the bytes a step reads from a header, the
arithmetic on a simulated machine (sampling at the chat's defaults included), the probe
models' weights, and the machine's figures measured once (a simulated decode timer) and kept
per machine."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from engine.bench.speed_model import (
    DecodeCost,
    MachineSpeed,
    base_key,
    kernel_key,
    layer_width,
    predict,
    split_key,
)
from engine.bench.speed_probe import (
    FIXED_LAYERS,
    SpeedProfile,
    _random_rows,
    write_probe_model,
)
from engine.memory.cpu_kernels import CpuFeatures
from engine.model.gguf import GGUFFile, read_gguf
from engine.settings import LoadParams
from tests.speed_machine import QUIET, SimulatedDecoder, sim_settings

AMX = CpuFeatures(avx=True, avx2=True, avx512=True, avx512_vnni=True, amx_int8=True)
MB = 1_000_000


def probe(tmp_path: Path, type_name: str = "Q8_0", n_layer: int = 2, e: int = 256) -> GGUFFile:
    path = tmp_path / f"{type_name}-{n_layer}.gguf"
    write_probe_model(path, n_layer=n_layer, n_embd=e, n_ff=2 * e, type_name=type_name)
    return read_gguf(path)


def test_cost_counts_every_product_once_and_one_embedding_row(tmp_path: Path) -> None:
    gf = probe(tmp_path)
    cost = DecodeCost.of(gf, features=CpuFeatures(), extra_buffers=True, n_past=100)
    embd = gf.tensor("token_embd.weight")
    assert embd is not None
    layers = [t for t in gf.tensors if t.name.startswith("blk.") and len(t.shape) == 2]
    norms = [t for t in gf.tensors if "norm" in t.name]
    # Tied embeddings: the embedding is the output matrix (read whole) and a lookup (a row).
    # The layers' products are keyed by their width class, the output matrix by its kernel.
    assert cost.matmul_bytes == {
        "Q8_0/generic@256x512": sum(t.n_bytes for t in layers),
        "Q8_0/generic": embd.n_bytes,
    }
    assert cost.other_bytes == sum(t.n_bytes for t in norms) + embd.n_bytes // embd.shape[1]
    # 2 layers, 4 heads of 64 kept for K and V, f16, 100 cached cells.
    assert cost.kv_bytes == 100 * 2 * (2 * 256 * 2)
    assert cost.bytes_per_token == cost.weight_bytes + cost.kv_bytes
    assert cost.n_layer == 2 and cost.n_past == 100


def test_cost_keys_follow_the_cpu_kernel_rules(tmp_path: Path) -> None:
    gf = probe(tmp_path)
    amx = DecodeCost.of(gf, features=AMX, extra_buffers=True)
    assert set(amx.matmul_bytes) == {"Q8_0/AMX@256x512", "Q8_0/AMX"}
    # Extra buffers off: the generic kernels whatever the CPU.
    off = DecodeCost.of(gf, features=AMX, extra_buffers=False)
    assert set(off.matmul_bytes) == {"Q8_0/generic@256x512", "Q8_0/generic"}
    assert sum(amx.matmul_bytes.values()) == sum(off.matmul_bytes.values())
    assert kernel_key("Q4_K", "CPU_REPACK") == "Q4_K/CPU_REPACK"


@pytest.mark.parametrize(
    ("type_name", "n_embd", "n_ff", "width"),
    [
        ("Q4_1", 576, 1536, (576, 1536)),  # whole 32-value blocks and 64-value heads already
        ("Q4_K", 640, 2048, (768, 2048)),  # 256-value blocks: the probe's rows must hold them
        ("F32", 100, 300, (128, 320)),  # whole heads
        ("Q4_1", 576, 0, None),  # no FFN width in the header: no class
    ],
)
def test_width_class_is_the_models_widths_in_whole_blocks_and_heads(
    type_name: str, n_embd: int, n_ff: int, width: tuple[int, int] | None
) -> None:
    assert layer_width(type_name, n_embd, n_ff) == width
    key = kernel_key(type_name, "AMX", width)
    assert split_key(key) == (type_name, "AMX", width) and base_key(key) == f"{type_name}/AMX"


def cost(**kw: object) -> DecodeCost:
    base: dict[str, object] = {
        "name": "m",
        "n_layer": 10,
        "matmul_bytes": {"A/AMX": 100 * MB, "B/generic": 50 * MB},
        "other_bytes": 1 * MB,
        "kv_bytes": 4 * MB,
        "n_past": 256,
    }
    base.update(kw)
    return DecodeCost(**base)  # type: ignore[arg-type]


def machine(**kw: object) -> MachineSpeed:
    base: dict[str, object] = {
        "cpu": "Simulated CPU",
        "threads": 2,
        "bandwidth_bytes_per_s": 10e9,
        "per_layer_s": 1e-4,
        "per_token_s": 5e-4,
        "rates": {"A/AMX": 20e9, "B/generic": 10e9},
    }
    base.update(kw)
    return MachineSpeed(**base)  # type: ignore[arg-type]


def test_compute_bound_step_is_kernels_plus_fixed_work() -> None:
    p = predict(cost(), machine())
    kernels = 100 * MB / 20e9 + 50 * MB / 10e9 + 5 * MB / 10e9  # 5 + 5 + 0.5 ms
    memory = 155 * MB / 10e9  # 15.5 ms
    assert p.kernel_s == pytest.approx(kernels) and p.memory_s == pytest.approx(memory)
    assert p.fixed_s == pytest.approx(10 * 1e-4 + 5e-4)
    assert p.tokens_per_s == pytest.approx(1 / (memory + 1.5e-3))  # memory is slower here
    assert p.bound == "memory" and p.unmeasured == ()
    fast_memory = predict(cost(), machine(bandwidth_bytes_per_s=100e9))
    k = 100 * MB / 20e9 + 50 * MB / 10e9 + 5 * MB / 100e9
    assert fast_memory.bound == "compute"
    assert fast_memory.tokens_per_s == pytest.approx(1 / (k + 1.5e-3))


def test_overhead_bound_and_unmeasured_kernels() -> None:
    tiny = cost(matmul_bytes={"A/AMX": 1 * MB, "C/generic": 1 * MB}, other_bytes=0, kv_bytes=0)
    p = predict(tiny, machine(per_token_s=0.01))
    assert p.bound == "overhead"
    # C was never measured: it counts at memory bandwidth and is named.
    assert p.unmeasured == ("C/generic",)
    assert p.kernel_s == pytest.approx(1 * MB / 20e9 + 1 * MB / 10e9)
    assert "C/generic" in p.basis() and "Simulated CPU" in p.basis()
    with pytest.raises(ValueError, match="bandwidth"):
        predict(tiny, machine(bandwidth_bytes_per_s=0))


def test_a_width_class_not_measured_takes_its_kernels_large_matrix_rate() -> None:
    c = cost(matmul_bytes={"A/AMX@576x1536": 100 * MB}, other_bytes=0, kv_bytes=0)
    p = predict(c, machine(rates={"A/AMX": 20e9, "A/AMX@576x1536": 0.0}))
    assert p.unmeasured == ("A/AMX@576x1536",)
    assert p.kernel_s == pytest.approx(100 * MB / 20e9)
    measured = predict(c, machine(rates={"A/AMX": 20e9, "A/AMX@576x1536": 5e9}))
    assert measured.unmeasured == () and measured.kernel_s == pytest.approx(100 * MB / 5e9)


def test_twice_the_fixed_work_is_slower_by_exactly_that() -> None:
    a, b = predict(cost(), machine()), predict(cost(), machine(per_layer_s=2e-4))
    assert 1 / b.tokens_per_s - 1 / a.tokens_per_s == pytest.approx(10 * 1e-4)


def test_machine_round_trips_through_its_dict() -> None:
    for m in (machine(), machine(per_vocab_s=3e-9)):
        assert MachineSpeed.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    m = machine()
    assert m.with_rates({"D/generic": 1.0}).rates["D/generic"] == 1.0


@pytest.mark.parametrize(
    "type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
)
def test_probe_weights_are_small_and_finite(type_name: str) -> None:
    rows = _random_rows(np.random.default_rng(1), 8, 512, type_name)
    values = dequantize(rows, GGMLQuantizationType[type_name])
    assert values.shape == (8, 512)
    # f16 scales below 2**-8, times sub-scales (Q6_K: 8 bits) and values (6 bits): < 16.
    assert np.isfinite(values).all() and np.abs(values).max() < 16.0
    assert np.abs(values).max() > 0  # random, not all zero


def test_probe_model_never_picks_end_of_sequence(tmp_path: Path) -> None:
    gf = probe(tmp_path)
    embd = gf.tensor("token_embd.weight")
    assert embd is not None and gf.metadata["tokenizer.ggml.eos_token_id"] == 2
    raw = (tmp_path / "Q8_0-2.gguf").read_bytes()
    row = embd.n_bytes // embd.shape[1]
    start = gf.data_offset + embd.offset + 2 * row
    assert raw[start : start + row] == bytes(row)  # its logit is exactly 0


def test_profile_measures_once_then_reads_its_file(tmp_path: Path) -> None:
    sim = SimulatedDecoder(2e-4, 1e-3, {"F32": 1e12, "Q8_0": 8e9})
    bandwidth_calls: list[int] = []

    def bandwidth() -> float:
        bandwidth_calls.append(1)
        return 12e9

    settings = sim_settings()
    file = tmp_path / "data" / "speed_profile.json"
    profile = SpeedProfile(
        file, settings, timer=sim, chat_timer=sim.chat, bandwidth=bandwidth, load=QUIET
    )
    assert profile.cached() is None and profile.known() is None
    m = profile.machine()
    assert m.bandwidth_bytes_per_s == 12e9 and m.threads == settings.threads
    # Two tiny models, FIXED_LAYERS apart: the simulated per-layer and per-token work back.
    assert sim.calls[: len(FIXED_LAYERS)] == [f"fixed-{n}.gguf" for n in FIXED_LAYERS]
    assert m.per_layer_s == pytest.approx(2e-4, rel=1e-3)
    assert m.per_token_s == pytest.approx(1e-3, rel=1e-2)
    # A kernel measured when a model needs it: generic kernels exist on every CPU.
    m2 = profile.machine(["Q8_0/generic"])
    assert m2.rates["Q8_0/generic"] == pytest.approx(8e9, rel=0.02)
    assert profile.known(["Q8_0/generic"]) == m2
    assert profile.known(["Q4_K/generic"]) is None
    # Kept in the file: a new profile on it measures nothing.
    calls = len(sim.calls)
    again = SpeedProfile(
        file, settings, timer=sim, chat_timer=sim.chat, bandwidth=bandwidth, load=QUIET
    )
    assert again.machine(["Q8_0/generic"]) == m2
    assert len(sim.calls) == calls and len(bandwidth_calls) == 1
    stored = json.loads(file.read_text(encoding="utf-8"))
    assert list(stored) == [profile._key] and settings.threads == stored[profile._key]["threads"]
    # Forgotten: measured again.
    again.forget()
    assert again.cached() is None
    again.machine()
    assert len(bandwidth_calls) == 2


def test_sampling_is_measured_per_vocabulary_entry_and_added_to_every_token(
    tmp_path: Path,
) -> None:
    sim = SimulatedDecoder(1e-4, 1e-3, {"F32": 1e12, "Q8_0": 10e9}, per_vocab=4e-9)
    file = tmp_path / "p.json"
    profile = SpeedProfile(
        file,
        sim_settings(),
        timer=sim,
        chat_timer=sim.chat,
        bandwidth=lambda: 10e9,
        load=QUIET,
    )
    m = profile.machine()
    assert sim.chat_calls == ["vocab-4096.gguf"]
    assert m.per_vocab_s == pytest.approx(4e-9, rel=1e-6)
    c = cost()
    plain = predict(c, machine())
    chat = predict(replace(c, n_vocab=262_144), replace(machine(), per_vocab_s=4e-9))
    assert chat.sample_s == pytest.approx(262_144 * 4e-9)
    assert 1 / chat.tokens_per_s == pytest.approx(1 / plain.tokens_per_s + chat.sample_s)
    assert "sampling 1.05 ms per token" in chat.basis() and "default sampling" in chat.basis()
    # A profile kept before sampling was measured: only that is measured, once.
    stored = json.loads(file.read_text(encoding="utf-8"))
    del stored[profile._key]["per_vocab_s"]
    file.write_text(json.dumps(stored), encoding="utf-8")
    calls, chat_calls = len(sim.calls), len(sim.chat_calls)
    again = SpeedProfile(
        file,
        sim_settings(),
        timer=sim,
        chat_timer=sim.chat,
        bandwidth=lambda: 10e9,
        load=QUIET,
    )
    assert again.machine().per_vocab_s == pytest.approx(4e-9, rel=1e-6)
    assert len(sim.calls) == calls and len(sim.chat_calls) == chat_calls + 1
    assert again.machine() == again.cached() and len(sim.chat_calls) == chat_calls + 1


@pytest.mark.parametrize(
    ("key", "refused"),
    [
        ("MXFP4/generic", False),  # a type the probe cannot write
        ("NOT_A_TYPE/generic", False),
        ("Q8_0/generic@wide", False),  # not a width class
        ("Q8_0/generic", True),  # llama.cpp refuses the probe model
    ],
)
def test_a_kernel_the_probe_cannot_run_is_remembered_as_unmeasured(
    tmp_path: Path, key: str, refused: bool
) -> None:
    sim = SimulatedDecoder(1e-4, 1e-3, {"F32": 1e12})

    def timer(path: Path, params: LoadParams) -> float:
        if refused and path.name.startswith("rate-"):
            raise RuntimeError("llama.cpp could not load the model")
        return sim(path, params)

    profile = SpeedProfile(
        tmp_path / "p.json",
        sim_settings(),
        timer=timer,
        chat_timer=sim.chat,
        bandwidth=lambda: 1e10,
        load=QUIET,
    )
    m = profile.machine([key])
    assert m.rates[key] == 0.0
    # Remembered: not tried again on every prediction.
    assert profile.known([key]) is not None
    p = predict(DecodeCost("x", 1, {key: 10 * MB}, 0, 0, 0), m)
    assert p.unmeasured == (key,)  # predicted at memory bandwidth


def test_a_width_class_is_measured_on_layers_of_its_own_shape(tmp_path: Path) -> None:
    # Small products go through slower than large ones: the simulated machine's Q4_1 runs at
    # 3 GB/s on 576-wide layers and 9 GB/s on a large matrix.
    narrow = "Q4_1/generic@576x1536"
    sim = SimulatedDecoder(1e-4, 1e-3, {"F32": 1e12, narrow: 3e9, "Q4_1": 9e9})
    profile = SpeedProfile(
        tmp_path / "p.json",
        sim_settings(),
        timer=sim,
        chat_timer=sim.chat,
        bandwidth=lambda: 1e10,
        load=QUIET,
    )
    m = profile.machine([narrow, "Q4_1/generic"])
    assert "rate-Q4_1-576x1536.gguf" in sim.calls
    # The probe's own small output matrix goes at the large rate: within 2%.
    assert m.rates[narrow] == pytest.approx(3e9, rel=0.02)
    assert m.rates["Q4_1/generic"] == pytest.approx(9e9, rel=0.02)


def test_a_broken_profile_file_is_measured_again(tmp_path: Path) -> None:
    file = tmp_path / "p.json"
    file.write_text("{not json", encoding="utf-8")
    sim = SimulatedDecoder(1e-4, 1e-3, {"F32": 1e12})
    profile = SpeedProfile(
        file,
        sim_settings(),
        timer=sim,
        chat_timer=sim.chat,
        bandwidth=lambda: 1e10,
        load=QUIET,
    )
    assert profile.cached() is None
    assert profile.machine().bandwidth_bytes_per_s == 1e10
    assert json.loads(file.read_text(encoding="utf-8"))  # rewritten whole


def test_figures_measured_on_a_busy_machine_are_measured_again_once_it_is_quiet(
    tmp_path: Path,
) -> None:
    slow = SimulatedDecoder(1e-3, 1e-2, {"F32": 1e12})  # threads waiting for cores
    load = [3.0]
    profile = SpeedProfile(
        tmp_path / "p.json",
        sim_settings(),
        timer=slow,
        chat_timer=slow.chat,
        bandwidth=lambda: 1e9,
        load=lambda: load[0],
    )
    busy = profile.machine()
    assert busy.measured_busy and busy.load_per_core == 3.0
    p = predict(DecodeCost("x", 1, {}, 1000, 0, 0), busy)
    assert p.measured_busy and "busy" in p.basis()
    load[0] = 2.0  # still busy: kept
    assert profile.machine() == busy
    load[0] = 0.2  # quiet now: measured again
    slow.per_layer, slow.per_token = 1e-4, 1e-3
    quiet = profile.machine()
    assert not quiet.measured_busy and quiet.per_layer_s == pytest.approx(1e-4, rel=1e-2)
