"""Benchmark the model the chat has loaded, on its own decode loop.

The desktop app runs this on the model the chat uses: nothing is loaded again, so the figures
are those of the engine the chat and the local server use. For the run the loop's context is
recreated on the same weights with one sequence per concurrent request and a context per
request that holds the workload's longest prompt with its answer; afterwards it gets the
chat's shape back (the chat's history comes back from its KV snapshot). The chat waits
meanwhile, and the run is refused while the local server holds the slots. A workload with
images needs the model loaded with a vision projector; its prompts' images are counted by it.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

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
from engine.bench.media import check_reads_images, media_context_need
from engine.bench.result import BenchResult
from engine.bench.workloads import Workload
from engine.host.runtime import Model

# Room for the unique tag put before each prompt ("[3fa9c1-1-5] ").
TAG_TOKENS = 32


def context_per_request(path: Path, workload: Workload, max_tokens_cap: int | None) -> int:
    """Smallest context (a multiple of 256) that holds every prompt with its full answer,
    counted with the model's own tokenizer (no weights loaded)."""
    tok = Tokenizer(path)
    try:
        need = max(
            tok.count_chat(p.messages)
            + (min(p.max_tokens, max_tokens_cap) if max_tokens_cap else p.max_tokens)
            for p in workload.prompts
        )
    finally:
        tok.close()
    return round_context(need)


def round_context(need: int) -> int:
    """A context for `need` tokens with the unique tag: a multiple of 256."""
    return int(math.ceil((need + TAG_TOKENS) / 256) * 256)


LEASE = "benchmark"  # who holds the model's slots while it runs


def run_loaded_benchmark(
    model: Model,
    workload: Workload,
    config: BenchConfig,
    *,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    sampling: SamplingSetup | None = None,
) -> BenchResult:
    """Run the benchmark on `model`'s own decode loop and give the loop back as it was.

    Raises `EngineError` (incl. `BenchError`) when it cannot run, e.g. while the local server
    holds the model's slots."""
    config.validate()
    check_reads_images(model, workload)
    cancel = cancel or threading.Event()
    n_ctx = context_per_request(model.path, workload, config.max_tokens)
    if workload.images:
        n_ctx = max(n_ctx, round_context(media_context_need(model, workload, config.max_tokens)))
    slots = max(config.concurrency)
    loop = model.loop
    loop.lease(LEASE, slots, n_ctx)
    try:
        target: Target = (
            EmbeddedTarget(model, sampling) if slots == 1 else SchedulerTarget(model, sampling)
        )
        result = run_benchmark(
            target, workload, config, model_file=model.gguf, progress=progress, cancel=cancel
        )
        result.target["n_ctx_per_request"] = n_ctx
        return result
    finally:
        loop.release(LEASE)


__all__ = ["TAG_TOKENS", "context_per_request", "round_context", "run_loaded_benchmark"]
