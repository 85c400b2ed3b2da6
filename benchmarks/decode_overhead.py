"""Decode speed of the engine vs a tight reference loop over llama.cpp's C API.

The reference is the least Python a generation loop can do: greedy sample, decode, repeat,
with no text handling, no stop strings, no stats, run on the model's decode thread. The
engine's loop (`Model.complete` through the model's scheduler) adds token-to-piece, UTF-8
decoding, stop-string handling, events and cancellation checks on top. Both run on one loaded
model, same context, same threads, same prompt, greedy; runs alternate (A, B, A, B, ...) so
drift on a noisy machine hits both alike. The goal is engine >= 0.95 x reference (median).
For context the high-level `llama_cpp.Llama.create_completion(stream=True)` is measured too.

    .venv/bin/python benchmarks/decode_overhead.py [--model default] [--tokens 256] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from benchmarks.host_clients import reference_loop
from engine.host.runtime import Model
from engine.settings import LoadParams, SamplingParams, use_extra_buffers

PROMPT = "Once upon a time, in a small village by the sea, there lived"


def engine_loop(model: Model, prompt_text: str, n_tokens: int) -> float:
    """The engine's streaming generation; tokens/s between the first and the last piece."""
    model.reset_cache()
    gen = model.complete(prompt_text, SamplingParams(temperature=0, max_tokens=n_tokens + 1))
    it = iter(gen)
    next(it)
    t0 = time.perf_counter()
    n0 = len(gen.tokens)
    for _ in it:
        pass
    dt = time.perf_counter() - t0
    return (len(gen.tokens) - n0) / dt


def high_level_loop(
    path: Path, prompt_text: str, n_tokens: int, threads: int, n_ctx: int, runs: int
) -> list[float]:
    import llama_cpp.llama_cpp as C
    from llama_cpp import Llama

    # `Llama` has no switch for CPU extra buffers; give it the same setting as the engine
    # (off on AMX builds, whose kernels crash here) through the default-params hook.
    original = C.llama_model_default_params

    def params() -> Any:
        p = original()
        p.use_extra_bufts = use_extra_buffers(None)
        return p

    C.llama_model_default_params = params
    try:
        llm = Llama(str(path), n_ctx=n_ctx, n_threads=threads, verbose=False, flash_attn=True)
    finally:
        C.llama_model_default_params = original
    out = []
    for _ in range(runs):
        llm.reset()
        stream = llm.create_completion(
            prompt_text, max_tokens=n_tokens + 1, temperature=0, top_k=1, stream=True
        )
        next(iter(stream))
        t0 = time.perf_counter()
        n = 0
        for _ in stream:
            n += 1
        out.append(n / (time.perf_counter() - t0))
    del llm
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    path = ModelLibrary(AppPaths.default().models).resolve(args.model)
    n_ctx = 1024
    model = Model(path, LoadParams(n_ctx=n_ctx, n_threads=args.threads, flash_attn="on"))
    prompt = model.tokenize(PROMPT)
    # Warm-up: page the weights in and let the CPU clocks settle.
    model.loop.call_idle(lambda: reference_loop(model, prompt, 32))
    engine_loop(model, PROMPT, 32)
    ref: list[float] = []
    eng: list[float] = []
    for _ in range(args.runs):
        ref.append(model.loop.call_idle(lambda: reference_loop(model, prompt, args.tokens)))
        eng.append(engine_loop(model, PROMPT, args.tokens))
    model.close()
    high = high_level_loop(path, PROMPT, args.tokens, args.threads, n_ctx, max(3, args.runs // 2))
    ratios = [e / r for e, r in zip(eng, ref, strict=True)]
    result: dict[str, Any] = {
        "model": path.name,
        "tokens": args.tokens,
        "runs": args.runs,
        "threads": args.threads,
        "reference_tps_median": round(statistics.median(ref), 1),
        "engine_tps_median": round(statistics.median(eng), 1),
        "high_level_tps_median": round(statistics.median(high), 1),
        "engine_over_reference_median": round(statistics.median(ratios), 3),
        "engine_over_reference_min": round(min(ratios), 3),
        "high_level_over_reference": round(statistics.median(high) / statistics.median(ref), 3),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k:32} {v}")
    ok = result["engine_over_reference_median"] >= 0.95
    print(f"goal engine >= 0.95 x reference: {'MET' if ok else 'NOT MET'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
