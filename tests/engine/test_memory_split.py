"""GPU offload planning with simulated devices: layer placement, auto-fit and verdicts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from engine.host.model_build import resolve_gpu_layers
from engine.memory.cpu_kernels import CpuFeatures
from engine.memory.estimate import estimate, fit_gpu_layers
from engine.memory.hardware import CPU, Device, GiB, MiB, cpu_only, simulate
from engine.memory.model_spec import ModelSpec
from engine.memory.params import EstimateParams
from engine.memory.placement import layer_devices
from engine.memory.result import MemoryEstimate
from engine.model.gguf import read_gguf
from engine.native import llama_lib
from engine.settings import LoadParams

RAM = 32 * GiB


def _gpu(name: str, gib: float) -> Device:
    size = int(gib * GiB)
    return Device(name, name, "gpu", size, size, simulated=True)


def test_layer_placement_follows_llama_cpp() -> None:
    one = [_gpu("GPU0", 8)]
    # n_gpu_layers counts from the top: the output layer (index n_layer) goes first.
    assert layer_devices(30, 0, one) == [CPU] * 31
    assert layer_devices(30, 1, one) == [CPU] * 30 + ["GPU0"]
    assert layer_devices(30, 10, one) == [CPU] * 21 + ["GPU0"] * 10
    assert layer_devices(30, 31, one) == ["GPU0"] * 31
    assert layer_devices(30, 999, one) == ["GPU0"] * 31
    assert layer_devices(30, 31, []) == [CPU] * 31
    # Two GPUs share the offloaded layers in proportion to their free memory:
    # splits = [0.25, 1.0]; layer il goes to upper_bound(splits, (il - start) / act).
    two = [_gpu("GPU0", 8), _gpu("GPU1", 24)]
    placed = layer_devices(30, 31, two)
    assert placed == ["GPU0"] * 8 + ["GPU1"] * 23
    partial = layer_devices(30, 12, two)
    assert partial == [CPU] * 19 + ["GPU0"] * 3 + ["GPU1"] * 9


@pytest.fixture(scope="module")
def specs(smollm2_path: Path, gemma_path: Path) -> dict[str, Path]:
    return {"smollm2": smollm2_path, "gemma": gemma_path}


def _plan(
    path: Path, gpus: list[float], cpu: CpuFeatures | None = None, **kw: object
) -> MemoryEstimate:
    """An analytic plan on simulated GPUs. Without extra-buffer copies unless asked: whether
    the CPU keeps them depends on the CPU and build, not on the plan under test; `cpu` plans
    for another CPU's rules."""
    hw = replace(simulate([int(g * GiB) for g in gpus], cpu_only(RAM)), cpu=cpu)
    kw.setdefault("extra_buffers", False)
    margin = kw.pop("margin_bytes", None)
    load = LoadParams(**kw)  # type: ignore[arg-type]
    return estimate(path, EstimateParams(load, margin_bytes=margin), hardware=hw, method="analytic")  # type: ignore[arg-type]


XEON_AMX = CpuFeatures(
    avx=True,
    avx2=True,
    f16c=True,
    avx512=True,
    avx512_vnni=True,
    amx_int8=True,
    llamafile=True,
    repack=True,
)


def test_extra_copies_follow_the_cpu_layers(specs: dict[str, Path]) -> None:
    """With AMX (planned for an AMX Xeon on any machine), llama.cpp keeps a repacked copy of
    the matrices of every layer left on the CPU (and of the output matrix when it stays
    there); offloaded layers have none."""
    spec = ModelSpec.from_gguf(read_gguf(specs["smollm2"]), XEON_AMX)
    assert sum(spec.copy_layer_bytes) > 0 and spec.copy_output_bytes > 0
    plain = _plan(specs["smollm2"], [], XEON_AMX, n_ctx=512, n_gpu_layers=0)
    amx = _plan(specs["smollm2"], [], XEON_AMX, n_ctx=512, n_gpu_layers=0, extra_buffers=None)
    copies = sum(spec.copy_layer_bytes) + spec.copy_output_bytes
    assert amx.weights_bytes - plain.weights_bytes == copies
    assert any("AMX copy" in n for n in amx.notes) and not any("AMX" in n for n in plain.notes)
    # 11 of 31 layers on a GPU (the output layer first): the CPU keeps copies of 20 layers.
    split = _plan(specs["smollm2"], [24], XEON_AMX, n_ctx=512, n_gpu_layers=11, extra_buffers=None)
    cpu = split.device(CPU)
    split_plain = _plan(specs["smollm2"], [24], XEON_AMX, n_ctx=512, n_gpu_layers=11)
    plain_cpu = split_plain.device(CPU)
    assert cpu is not None and plain_cpu is not None
    assert cpu.weights_bytes - plain_cpu.weights_bytes == sum(spec.copy_layer_bytes[:20])
    # The same file on an AVX2 machine: nothing to copy (Q4_1 is not repacked there).
    avx2 = replace(XEON_AMX, amx_int8=False, avx512=False, avx512_vnni=False)
    assert (
        _plan(
            specs["smollm2"], [], avx2, n_ctx=512, n_gpu_layers=0, extra_buffers=None
        ).weights_bytes
        == plain.weights_bytes
    )
    # Gemma-3 there: its Q4_K matrices get a CPU_REPACK copy.
    g_plain = _plan(specs["gemma"], [], avx2, n_ctx=512, n_gpu_layers=0)
    g = _plan(specs["gemma"], [], avx2, n_ctx=512, n_gpu_layers=0, extra_buffers=None)
    assert 12 * MiB < g.weights_bytes - g_plain.weights_bytes < 13 * MiB
    assert any("CPU_REPACK copy" in n for n in g.notes)


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
@pytest.mark.parametrize("ctx", [512, 4096, 16384])
@pytest.mark.parametrize("gpu_gib", [0.2, 1, 24])
def test_auto_fit_never_exceeds_free_memory_and_is_maximal(
    specs: dict[str, Path], model: str, ctx: int, gpu_gib: float
) -> None:
    est = _plan(specs[model], [gpu_gib], n_ctx=ctx, n_gpu_layers="auto")
    gpu = est.device("GPU0")
    assert gpu is not None and gpu.free_bytes is not None
    assert gpu.required_bytes <= gpu.free_bytes or est.gpu_layers == 0
    assert gpu.layers == est.gpu_layers
    if est.gpu_layers < est.n_layers:
        # One more layer would not have fitted.
        more = _plan(specs[model], [gpu_gib], n_ctx=ctx, n_gpu_layers=est.gpu_layers + 1)
        more_gpu = more.device("GPU0")
        assert more_gpu is not None and not more_gpu.fits
    # Offloading moves memory, it does not create or lose any (bar the tied output copy).
    cpu_only_plan = _plan(specs[model], [], n_ctx=ctx, n_gpu_layers=0)
    assert est.kv_bytes == cpu_only_plan.kv_bytes
    assert est.weights_bytes >= cpu_only_plan.weights_bytes
    expected = {0: "ram_only", est.n_layers: "fits_gpu"}.get(est.gpu_layers, "partial_offload")
    assert est.verdict == expected
    if gpu_gib == 24:
        assert est.verdict == "fits_gpu"
    if gpu_gib == 0.2:
        # A driver context alone fills a 0.2 GiB card: nothing goes there.
        assert est.verdict == "ram_only" and "not even one layer" in est.reason


def test_partial_offload_on_a_small_gpu(specs: dict[str, Path]) -> None:
    est = _plan(specs["smollm2"], [0.6], n_ctx=16384, n_gpu_layers="auto")
    assert est.verdict == "partial_offload"
    assert 0 < est.gpu_layers < est.n_layers
    assert f"{est.gpu_layers} of {est.n_layers} layers" in est.reason
    cpu = est.device(CPU)
    assert cpu is not None and cpu.layers == est.n_layers - est.gpu_layers
    assert cpu.kv_bytes > 0 and est.device("GPU0").kv_bytes > 0  # type: ignore[union-attr]


def test_gpu_split_of_each_component(specs: dict[str, Path]) -> None:
    spec = ModelSpec.from_gguf(read_gguf(specs["smollm2"]))
    est = _plan(specs["smollm2"], [24], n_ctx=4096, n_gpu_layers="all")
    cpu, gpu = est.device(CPU), est.device("GPU0")
    assert cpu is not None and gpu is not None
    # The input embedding stays on the CPU; the tied output matrix is copied to the GPU.
    assert cpu.weights_bytes == spec.input_bytes
    assert gpu.weights_bytes == sum(spec.layer_bytes) + spec.output_bytes + spec.tied_output_bytes
    assert spec.tied_output_bytes > 0  # SmolLM2 ties its output to the embedding
    assert cpu.kv_bytes == 0 and gpu.kv_bytes == est.kv_bytes
    assert gpu.compute_bytes > cpu.compute_bytes
    assert cpu.output_bytes == est.output_bytes  # logits land in host memory
    # Besides the GPU's driver context, only the prompt cache's budget, in RAM.
    assert gpu.overhead_bytes > 0 and est.gpu_runtime_bytes == gpu.overhead_bytes
    assert cpu.overhead_bytes == est.prompt_cache_bytes > 0
    assert est.overhead_bytes == gpu.overhead_bytes + cpu.overhead_bytes


def test_two_gpus_and_explicit_counts(specs: dict[str, Path]) -> None:
    est = _plan(specs["gemma"], [8, 24], n_ctx=4096, n_gpu_layers="all")
    g0, g1 = est.device("GPU0"), est.device("GPU1")
    assert g0 is not None and g1 is not None
    assert g0.layers + g1.layers == est.n_layers and g1.layers > g0.layers
    assert est.verdict == "fits_gpu"
    fixed = _plan(specs["gemma"], [24], n_ctx=4096, n_gpu_layers=5)
    assert fixed.gpu_layers == 5 and fixed.verdict == "partial_offload"


def test_gpu_that_is_too_small_for_a_forced_layout(specs: dict[str, Path]) -> None:
    est = _plan(specs["gemma"], [0.5], n_ctx=16384, n_gpu_layers="all")
    assert est.verdict == "does_not_fit"
    assert "GPU0" in est.reason


def test_no_gpu_or_no_offload_build(specs: dict[str, Path]) -> None:
    est = estimate(
        specs["smollm2"],
        EstimateParams(LoadParams(n_gpu_layers="all")),
        hardware=cpu_only(RAM),
        method="analytic",
    )
    assert est.gpu_layers == 0 and est.verdict == "ram_only" and "no GPU" in est.reason
    hw = simulate([8 * GiB], cpu_only(RAM))
    hw_no_offload = type(hw)(hw.ram_total_bytes, hw.ram_available_bytes, hw.gpus, False)
    est = estimate(
        specs["smollm2"],
        EstimateParams(LoadParams(n_gpu_layers="all")),
        hardware=hw_no_offload,
        method="analytic",
    )
    assert est.gpu_layers == 0 and "cannot offload" in est.reason


def test_auto_layers_in_the_runtime(specs: dict[str, Path]) -> None:
    gf = read_gguf(specs["smollm2"])
    hw = simulate([1 * GiB], cpu_only(RAM))
    n = fit_gpu_layers(gf, EstimateParams(LoadParams(n_ctx=4096)), hw)
    assert n == _plan(specs["smollm2"], [1], n_ctx=4096, n_gpu_layers="auto").gpu_layers
    # This CPU-only build cannot offload, so 'auto' loads nothing on a GPU here.
    if not llama_lib.supports_gpu_offload():
        assert resolve_gpu_layers("auto", 30, gguf=gf) == 0
    assert resolve_gpu_layers("all", 30) == 31
    assert resolve_gpu_layers(7, 30) == 7


def test_margin_is_respected(specs: dict[str, Path]) -> None:
    tight = _plan(specs["smollm2"], [1], n_ctx=4096, n_gpu_layers="auto", margin_bytes=700 * MiB)
    loose = _plan(specs["smollm2"], [1], n_ctx=4096, n_gpu_layers="auto", margin_bytes=0)
    assert tight.gpu_layers < loose.gpu_layers
    gpu = tight.device("GPU0")
    assert gpu is not None and gpu.margin_bytes == 700 * MiB
