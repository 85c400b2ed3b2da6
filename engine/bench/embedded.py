"""Benchmark a GGUF file on the embedded engine with given load settings, start to end.

The desktop app runs this on the model the chat uses: same file, same GPU layers, threads,
KV cache type and flash attention. It loads its own instance (the weights are memory-mapped, so
the pages in RAM are shared with the chat's copy), sized for the benchmark: one sequence per
concurrent request and a context per request that holds the workload's longest prompt with
its answer. The instance is freed when the run ends.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.bench.harness import (
    BenchConfig,
    EmbeddedTarget,
    ProgressCallback,
    SamplingSetup,
    SchedulerTarget,
    Target,
    Tokenizer,
    run_benchmark,
)
from engine.bench.workloads import Workload
from engine.host.runtime import Model
from engine.settings import LoadParams

# Room for the unique tag put before each prompt ("[3fa9c1-1-5] ").
TAG_TOKENS = 32


def context_per_request(path: Path, workload: Workload, max_tokens_cap: int | None) -> int:
    """Smallest context (a multiple of 256) that holds every prompt with its full answer,
    counted with the model's own tokenizer (no weights loaded)."""
    tok = Tokenizer(path)
    try:
        need = max(tok.count_chat(p.messages)
                   + (min(p.max_tokens, max_tokens_cap) if max_tokens_cap else p.max_tokens)
                   for p in workload.prompts)
    finally:
        tok.close()
    return int(math.ceil((need + TAG_TOKENS) / 256) * 256)


def bench_load_params(base: LoadParams, n_ctx_per_request: int, slots: int) -> LoadParams:
    """The chat's load settings, with the context and sequences the benchmark needs.
    No KV snapshots: every request starts from an empty cache anyway."""
    return dataclasses.replace(base, n_ctx=n_ctx_per_request * slots, n_seq_max=slots,
                               state_cache_mb=0)


def run_embedded_benchmark(
    path: Path, base_params: LoadParams, workload: Workload, config: BenchConfig, *,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    on_load: Callable[[float], None] | None = None,
    sampling: SamplingSetup | None = None,
) -> dict[str, Any]:
    """Load `path` for the benchmark, run it and free it. Raises `LoadCancelled` when
    cancelled while loading and `EngineError` (incl. `BenchError`) when it cannot run."""
    config.validate()
    cancel = cancel or threading.Event()
    n_ctx = context_per_request(path, workload, config.max_tokens)
    slots = max(config.concurrency)
    params = bench_load_params(base_params, n_ctx, slots)
    model = Model(path, params, progress=on_load, cancel=cancel)
    closers: list[Callable[[], object]] = [model.close]
    try:
        target: Target = (EmbeddedTarget(model, sampling) if slots == 1
                          else SchedulerTarget(model, sampling))
        result = run_benchmark(target, workload, config, model_file=model.gguf,
                               progress=progress, cancel=cancel)
        result["target"]["n_ctx_per_request"] = n_ctx
        return result
    finally:
        for close in reversed(closers):
            close()
