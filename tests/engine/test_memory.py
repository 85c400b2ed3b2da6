"""The memory estimate against what llama.cpp really allocates, on real SmolLM2 and Gemma loads.

Each case loads the model for real (mmap, n_threads=2, no decode) and sums the buffer sizes
llama.cpp logs; both the dry run and the analytic model must land within 5% of that.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from engine.errors import EngineError
from engine.host.model_build import resolve_params
from engine.host.runtime import Model
from engine.memory.actual import actual_from_log, compare
from engine.memory.analytic import kv_bytes_per_layer
from engine.memory.dry_run import dry_run
from engine.memory.estimate import estimate
from engine.memory.hardware import CPU, GiB, MiB, cpu_only
from engine.memory.model_spec import ModelSpec
from engine.memory.params import EstimateParams
from engine.memory.result import DoesNotFitError, MemoryEstimate
from engine.model.gguf import GGUFError, read_gguf
from engine.settings import FlashAttn, LoadParams

TOLERANCE = 0.05
PLENTY = cpu_only(64 * GiB)  # a fixed machine, so verdicts do not depend on the test host


def _model_path(request: pytest.FixtureRequest, which: str) -> Path:
    return Path(request.getfixturevalue(f"{which}_path"))


CASES = [
    (model, ctx, kv, "auto")
    for model in ("smollm2", "gemma")
    for ctx in (512, 4096, 16384)
    for kv in ("f16", "q8_0", "q4_0")
] + [
    # Without flash attention the f32 attention scores over the whole cache can outgrow the
    # logits: the compute model must follow the context there too.
    ("smollm2", 16384, "f16", "off"),
    ("gemma", 16384, "f16", "off"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "ctx", "kv", "fa"), CASES, ids=[f"{m}-{c}-{k}-fa_{f}" for m, c, k, f in CASES]
)
def test_estimate_within_5_percent_of_a_real_load(
    request: pytest.FixtureRequest, model: str, ctx: int, kv: str, fa: str
) -> None:
    path = _model_path(request, model)
    params = EstimateParams(
        LoadParams(n_ctx=ctx, type_k=kv, type_v=kv, flash_attn=cast(FlashAttn, fa), n_gpu_layers=0)
    )
    analytic = estimate(path, params, hardware=PLENTY, method="analytic")
    exact = estimate(path, params, hardware=PLENTY, method="dry-run")
    assert (analytic.method, exact.method) == ("analytic", "dry-run")

    with Model(path, replace(params.load, n_threads=2)) as m:
        actual = actual_from_log(m.load_info.log)
        assert m.memory_actual.total_bytes == actual.total_bytes

    assert actual.weights_bytes and actual.kv_bytes and actual.compute_bytes
    for est in (analytic, exact):
        err = abs(est.total_bytes - actual.total_bytes) / actual.total_bytes
        assert err < TOLERANCE, (est.method, est.total_bytes, actual.total_bytes)
        # The KV cache is a closed formula: it must be right, not just the total.
        assert abs(est.kv_bytes - actual.kv_bytes) <= 0.01 * actual.kv_bytes + 0.02 * MiB
        assert abs(est.weights_bytes - actual.weights_bytes) <= 0.01 * actual.weights_bytes
    # A CPU-only plan puts everything in RAM.
    assert exact.devices[0].name == "CPU" and exact.devices[0].bytes == exact.total_bytes
    assert exact.verdict == "ram_only"


def test_gemma_sliding_window_layers(gemma_path: Path) -> None:
    """15 of Gemma-3-270M's 18 layers use a 512-token window; swa_full keeps them full size."""
    spec = ModelSpec.from_gguf(read_gguf(gemma_path))
    assert spec.n_layer == 18 and sum(spec.swa_layers) == 15 and spec.n_swa == 512
    full = EstimateParams(LoadParams(n_ctx=16384))
    small = EstimateParams(LoadParams(n_ctx=16384), swa_full=False)
    kv_full, kv_small = kv_bytes_per_layer(spec, full), kv_bytes_per_layer(spec, small)
    swa, glob = spec.swa_layers.index(True), spec.swa_layers.index(False)
    assert kv_full[swa] == kv_full[glob]
    # Without swa_full a window layer caches n_swa + n_ubatch cells, padded to 256.
    assert kv_small[swa] * 16384 == kv_full[swa] * 1024
    # ... and llama.cpp agrees.
    assert dry_run(gemma_path, small).kv_bytes == sum(kv_small)


def test_parallel_sequences_and_padding(smollm2_path: Path) -> None:
    for params in (
        EstimateParams(LoadParams(n_ctx=1000, n_seq_max=3)),
        EstimateParams(LoadParams(n_ctx=300)),
    ):
        exact = estimate(smollm2_path, params, hardware=PLENTY, method="dry-run")
        analytic = estimate(smollm2_path, params, hardware=PLENTY, method="analytic")
        assert exact.kv_bytes == pytest.approx(analytic.kv_bytes, rel=0.001)
        assert exact.output_bytes == pytest.approx(analytic.output_bytes, rel=0.01)
        assert analytic.total_bytes == pytest.approx(exact.total_bytes, rel=TOLERANCE)
    assert (
        estimate(
            smollm2_path, EstimateParams(LoadParams(n_ctx=300)), hardware=PLENTY, method="analytic"
        ).n_ctx
        == 512
    )


def test_memory_actual_and_the_ui_sentence(smollm2: Model) -> None:
    actual = smollm2.memory_actual
    assert actual.devices == {"CPU": actual.total_bytes}
    assert actual.rss_growth_bytes is not None and actual.rss_growth_bytes > 0
    est = estimate(smollm2.path, EstimateParams(smollm2.params), hardware=PLENTY)
    text = compare(est, actual)
    assert text.startswith("estimated ") and ", actual " in text
    assert abs(est.total_bytes - actual.total_bytes) < TOLERANCE * actual.total_bytes


def test_actual_from_log_reads_every_buffer_kind() -> None:
    lines = [
        "load_tensors:   CPU_Mapped model buffer size =    92.10 MiB",
        "load_tensors:        CUDA0 model buffer size =   100.00 MiB",
        "load_tensors:   CPU_REPACK model buffer size =    12.50 MiB",
        "llama_context:  CUDA_Host  output buffer size =     0.19 MiB",
        "llama_kv_cache:      CUDA0 KV buffer size =    45.00 MiB",
        "sched_reserve:      CUDA0 compute buffer size =   102.51 MiB",
        "sched_reserve:  CUDA_Host compute buffer size =     4.01 MiB",
        "llama_kv_cache: size =   45.00 MiB (  2048 cells,  30 layers,  1/1 seqs)",
    ]
    a = actual_from_log(lines)
    mib = MiB
    assert a.weights_bytes == round(92.10 * mib) + 100 * mib + round(12.5 * mib)
    assert a.kv_bytes == 45 * mib  # the summary line is not counted twice
    assert a.compute_bytes == round(102.51 * mib) + round(4.01 * mib)
    assert a.devices["CUDA0"] == 100 * mib + 45 * mib + round(102.51 * mib)
    assert set(a.devices) == {"CPU", "CUDA0"}


def test_bad_settings_are_one_line_errors(smollm2_path: Path) -> None:
    with pytest.raises(EngineError, match="flash attention"):
        estimate(
            smollm2_path,
            EstimateParams(LoadParams(type_v="q8_0", flash_attn="off")),
            hardware=PLENTY,
        )
    with pytest.raises(EngineError, match="too small"):
        estimate(smollm2_path, EstimateParams(LoadParams(n_ctx=8)), hardware=PLENTY)


def test_does_not_fit_names_the_reason_and_a_context_that_fits(smollm2_path: Path) -> None:
    small = cpu_only(400 * MiB + (LoadParams().state_cache_mb << 20))  # + the prompt cache
    params = EstimateParams(LoadParams(n_ctx=16384, n_gpu_layers=0), margin_bytes=0)
    est = estimate(smollm2_path, params, hardware=small, method="analytic")
    assert est.verdict == "does_not_fit" and not est.fits
    assert "RAM" in est.reason and "a context of" in est.reason
    assert est.max_ctx_fit is not None and 0 < est.max_ctx_fit < 16384
    at = estimate(
        smollm2_path,
        EstimateParams(LoadParams(n_ctx=est.max_ctx_fit, n_gpu_layers=0), margin_bytes=0),
        hardware=small,
        method="analytic",
    )
    above = estimate(
        smollm2_path,
        EstimateParams(LoadParams(n_ctx=est.max_ctx_fit + 256, n_gpu_layers=0), margin_bytes=0),
        hardware=small,
        method="analytic",
    )
    assert at.fits and not above.fits
    with pytest.raises(DoesNotFitError, match="RAM"):
        est.check()
    at.check()


def _header_only(path: Path, arch: str, *extra: str) -> Path:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    for name in extra:
        w.add_tensor(name, np.ones((64, 64), np.float32))
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_context_length(512)
    w.add_tensor("token_embd.weight", np.ones((100, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_prompt_cache_budget_is_ram_the_fit_counts_not_a_buffer(smollm2_path: Path) -> None:
    """The RAM prompt cache may grow to its budget while the model is loaded: the CPU's
    overhead (the fit check) counts it; the buffers llama.cpp allocates (`total_bytes`, what a
    real load is compared with) do not."""

    def plan(cache_mb: int, ram: int = 64 * GiB) -> MemoryEstimate:
        load = LoadParams(n_ctx=1024, n_gpu_layers=0, state_cache_mb=cache_mb)
        return estimate(
            smollm2_path,
            EstimateParams(load, margin_bytes=0),
            hardware=cpu_only(ram),
            method="analytic",
        )

    off, on = plan(0), plan(256)
    cpu, cpu_off = on.device(CPU), off.device(CPU)
    assert cpu is not None and cpu_off is not None
    assert on.total_bytes == off.total_bytes and on.ram_bytes == off.ram_bytes
    assert cpu.overhead_bytes == on.overhead_bytes == on.prompt_cache_bytes == 256 * MiB
    assert cpu.required_bytes == cpu_off.required_bytes + 256 * MiB
    assert off.prompt_cache_bytes == 0 and off.overhead_bytes == 0
    d = on.to_dict()
    assert (d["prompt_cache_bytes"], d["gpu_runtime_bytes"]) == (256 * MiB, 0)
    assert d["total_bytes"] == off.total_bytes and d["params"]["state_cache_mb"] == 256
    # RAM for the buffers and half the budget: fits without the cache or with half of it.
    ram = off.total_bytes + 128 * MiB
    assert plan(0, ram).fits and plan(128, ram).fits
    tight = plan(256, ram)
    assert not tight.fits
    assert "of RAM but only" in tight.reason
    assert tight.reason.endswith("spare; with up to 256 MiB of prompt cache)"), tight.reason


def test_an_embedding_model_has_no_prompt_cache(minilm_path: Path) -> None:
    """Nothing is generated from a sentence-embedding model: it keeps no prompts, so neither
    its load nor its estimate holds RAM for them."""
    gf = read_gguf(minilm_path)
    params, embedding_only = resolve_params(LoadParams(), gf)
    assert embedding_only and params.state_cache_mb == 0
    est = estimate(minilm_path, EstimateParams(), hardware=PLENTY, method="analytic")
    assert est.prompt_cache_bytes == 0 and est.overhead_bytes == 0


def test_incoherent_model_is_refused_before_llama_cpp(tmp_path: Path) -> None:
    """A llama without its block tensors: one line naming what is missing, no dry run."""
    path = _header_only(tmp_path / "broken.gguf", "llama")
    with pytest.raises(
        GGUFError,
        match=r"^broken\.gguf: llama\.block_count is 1 but the file "
        r"has tensors for 0 blocks$",
    ):
        estimate(path, EstimateParams(LoadParams(n_ctx=512)), hardware=PLENTY)


def test_falls_back_to_analytic_when_llama_cpp_cannot_size(tmp_path: Path) -> None:
    """A header llama.cpp refuses that the semantic checks let through (a gpt2 block without
    most of its tensors: only the plain llama layout is checked tensor by tensor)."""
    path = _header_only(tmp_path / "partial.gguf", "gpt2", "blk.0.attn_qkv.weight")
    est = estimate(path, EstimateParams(LoadParams(n_ctx=512)), hardware=PLENTY)
    assert est.method == "analytic" and "could not size" in est.notes[0]
    assert est.weights_bytes == 100 * 64 * 4 + 64 * 64 * 4
    with pytest.raises(EngineError, match="could not read"):
        estimate(path, EstimateParams(LoadParams(n_ctx=512)), hardware=PLENTY, method="dry-run")
