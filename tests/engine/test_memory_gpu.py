"""What a real GPU run taught the memory estimate (docs/gpu.md), checked with simulated GPUs.

* On a CUDA build this llama.cpp's no-alloc dry run crashes the process, so there it only runs
  when asked for, in a child process, and 'auto' estimates analytically.
* With the output layer on a GPU, the attention mask (micro-batch x context) sits in host memory
  and is copied to the GPU: both compute buffers grow with the context (1 GiB each at 1M).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.errors import EngineError
from engine.memory import dry_run as dry_runs
from engine.memory.estimate import estimate
from engine.memory.hardware import CPU, GiB, MiB, simulate
from engine.memory.params import EstimateParams
from engine.native import llama_lib
from engine.native.native_load import FAULT_ENV
from engine.settings import LoadParams

RAM = 64 * GiB


@pytest.fixture
def gpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this CPU build answer like a CUDA build to the question that matters here."""
    monkeypatch.setattr(llama_lib, "supports_gpu_offload", lambda: True)


def _refuse_in_process(*_: Any, **__: Any) -> dry_runs.DryRun:
    raise AssertionError("a no-alloc dry run ran inside the process of a GPU build")


def test_auto_estimate_is_analytic_on_a_gpu_build(
    smollm2_path: Path, gpu_build: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dry_runs, "_dry_run_here", _refuse_in_process)
    est = estimate(
        smollm2_path,
        EstimateParams(LoadParams(n_ctx=2048, n_gpu_layers="all")),
        hardware=simulate([24 * GiB], ram_bytes=RAM),
    )
    assert est.method == "analytic"
    assert est.verdict == "fits_gpu"


def test_asked_for_dry_run_runs_in_a_child_on_a_gpu_build(
    smollm2_path: Path, gpu_build: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # flash attention stated: 'auto' would resolve differently here (patched) and in the child
    p = EstimateParams(LoadParams(n_ctx=2048, flash_attn="off"))
    here = dry_runs._dry_run_here(smollm2_path, p)
    monkeypatch.setattr(dry_runs, "_dry_run_here", _refuse_in_process)
    child = dry_runs.dry_run(smollm2_path, p)
    assert child.kv_bytes == here.kv_bytes == 45 * MiB
    assert child.compute == here.compute and child.output == here.output
    est = estimate(smollm2_path, p, hardware=simulate([], ram_bytes=RAM), method="dry-run")
    assert est.method == "dry-run"


def test_a_crashing_dry_run_is_an_error_not_a_dead_app(
    smollm2_path: Path, gpu_build: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "abort")  # the child's load trips a llama.cpp assert
    with pytest.raises(EngineError, match=r"crashed while sizing .*SIGABRT"):
        dry_runs.dry_run(smollm2_path, EstimateParams(LoadParams(n_ctx=2048)))
    # 'auto' never gets there on a GPU build; a CPU-only build keeps its in-process dry run.
    est = estimate(
        smollm2_path,
        EstimateParams(LoadParams(n_ctx=2048)),
        hardware=simulate([8 * GiB], ram_bytes=RAM),
    )
    assert est.method == "analytic"


def test_attention_mask_counts_on_host_and_gpu_at_long_context(smollm2_path: Path) -> None:
    hw = simulate([80 * GiB], ram_bytes=RAM)
    n_ctx, ub = 131072, 512
    est = estimate(
        smollm2_path,
        EstimateParams(LoadParams(n_ctx=n_ctx, n_gpu_layers="all")),
        hardware=hw,
        method="analytic",
    )
    mask = 2 * ub * n_ctx  # f16 with flash attention, which 'auto' turns on with a GPU
    cpu, gpu = est.device(CPU), est.device("GPU0")
    assert cpu is not None and gpu is not None

    def with_lanes(b: int) -> int:
        # the small-batch lanes' graphs (sizes 5 to 8 at most): 26 tokens' share of a micro-batch
        return b + int(b * 26 / ub)

    # Host: input-embedding staging (2 rows of n_embd floats per token) plus the mask.
    assert cpu.compute_bytes == with_lanes(2 * 4 * ub * 576 + mask)
    # GPU: the logits of a full micro-batch plus the mask's copy (measured 1132 MiB at 1M on
    # an 8B model; 112 MiB of logits + 1024 MiB of mask).
    logits = 4 * (ub * 49152 + 2 * ub * 576)
    assert gpu.compute_bytes == with_lanes(logits + mask)
    short = estimate(
        smollm2_path,
        EstimateParams(LoadParams(n_ctx=4096, n_gpu_layers="all")),
        hardware=hw,
        method="analytic",
    )
    mask_short = 2 * ub * 4096
    assert short.compute_bytes == with_lanes(2 * 4 * ub * 576 + mask_short) + with_lanes(
        logits + mask_short
    )
