"""K/V cache types (f16, q8_0, q4_0) and flash attention: memory and speed, measured.

For each configuration the model is loaded with that cache type and flash attention setting;
the KV size is what llama.cpp itself reports allocating ("KV ... size" log lines, via
engine.memory.actual), next to engine.memory's estimate for the same settings. Speed:
prompt processing (a ~`--prompt-tokens` prompt, llama.cpp perf counters) and generation
(greedy, wall clock between first and last token) with the same prompt, configurations
alternating round by round; ratios are against f16 + flash attention off measured in the same
run. A quantized V cache needs flash attention, so q8_0/q4_0 run with it on only.

    .venv/bin/python benchmarks/kv_cache_types.py [--model default] [--ctx 4096] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from engine.host.runtime import Model
from engine.memory.estimate import estimate
from engine.memory.params import EstimateParams
from engine.settings import LoadParams, SamplingParams

CONFIGS: list[tuple[str, str]] = [("f16", "off"), ("f16", "on"), ("q8_0", "on"), ("q4_0", "on")]
TEXT = (
    "The history of the printing press begins with movable type in East Asia and continues "
    "with Gutenberg's press in Mainz around 1440, which made books cheaper and faster to "
    "produce. "
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    path = ModelLibrary(AppPaths.default().models).resolve(args.model)

    models: dict[tuple[str, str], Model] = {}
    kv: dict[tuple[str, str], tuple[float, float]] = {}
    for kv_type, fa in CONFIGS:
        p = LoadParams(
            n_ctx=args.ctx,
            n_threads=args.threads,
            type_k=kv_type,
            type_v=kv_type,
            flash_attn=fa,
            state_cache_mb=0,
        )  # type: ignore[arg-type]
        m = Model(path, p)
        est = estimate(m.gguf, EstimateParams(p), method="analytic")
        kv[(kv_type, fa)] = (m.memory_actual.kv_bytes / 2**20, est.kv_bytes / 2**20)
        models[(kv_type, fa)] = m
    first = next(iter(models.values()))
    toks = first.tokenize(TEXT * 200)[: args.prompt_tokens]
    prompt = first.detokenize(toks)
    pp: dict[tuple[str, str], list[float]] = {c: [] for c in CONFIGS}
    tg: dict[tuple[str, str], list[float]] = {c: [] for c in CONFIGS}
    for _ in range(args.rounds):
        for c in CONFIGS:
            m = models[c]
            m.reset_cache()
            gen = m.complete(prompt, SamplingParams(temperature=0, max_tokens=args.gen_tokens))
            t_first = None
            for _piece in gen:
                if t_first is None:
                    t_first = time.perf_counter()
                    n0 = len(gen.tokens)
            dt = time.perf_counter() - (t_first or 0)
            pp[c].append(gen.stats.prompt_tps)
            tg[c].append((len(gen.tokens) - n0) / dt if dt > 0 else 0.0)
    ref_pp = statistics.median(pp[CONFIGS[0]])
    ref_tg = statistics.median(tg[CONFIGS[0]])
    ref_kv = kv[CONFIGS[0]][0]
    print(
        f"{path.name}, n_ctx {args.ctx}, prompt {len(toks)} tokens, {args.gen_tokens} generated,"
        f" {args.threads} threads, {args.rounds} rounds (median)"
    )
    print(
        "| K/V type | flash attn | KV MiB (llama.cpp) | KV MiB (formula) | vs f16 "
        "| prompt t/s | vs ref | gen t/s | vs ref |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for c in CONFIGS:
        a, e = kv[c]
        p_med, t_med = statistics.median(pp[c]), statistics.median(tg[c])
        print(
            f"| {c[0]} | {c[1]} | {a:.1f} | {e:.1f} | {a / ref_kv:.2f} | {p_med:.0f} "
            f"| {p_med / ref_pp:.2f} | {t_med:.1f} | {t_med / ref_tg:.2f} |"
        )
    for m in models.values():
        m.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
