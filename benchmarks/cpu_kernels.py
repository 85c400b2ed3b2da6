"""AMX kernels vs llama.cpp's generic CPU kernels: prompt and decode speed, same build, same run.

One model loaded twice: with the CPU extra buffers off (generic kernels) and on (AMX weights,
where the build's AMX kernels are usable; see the README). Runs alternate between the two so
drift on a noisy machine hits both alike. Prompt speed: a ~500-token prompt from an empty
cache (llama.cpp's own timing); decode speed: 128 greedy tokens after a short prompt. Flash
attention is the default (off on a CPU-only build).

    .venv/bin/python benchmarks/cpu_kernels.py [--model default --model PATH] [--runs 5]
    .venv/bin/python benchmarks/cpu_kernels.py --write    # also update docs/benchmarks.md

The last lines start with SUMMARY.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_tables import machine_line, replace_between

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from engine.host.runtime import Model
from engine.native import llama_lib
from engine.settings import LoadParams, SamplingParams

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"
START, END = "<!-- cpu-kernels-table:start -->", "<!-- cpu-kernels-table:end -->"

LONG = (
    "The committee met on Tuesday to review the budget for the new library wing, the repairs "
    "to the swimming pool and the plan for the summer festival. "
) * 16
COUNT = "Count from 1 to 100, separated by commas."


def prompt_tps(m: Model) -> float:
    m.reset_cache()
    g = m.complete(LONG, SamplingParams(temperature=0, max_tokens=1))
    g.consume()
    return g.stats.prompt_tps


def decode_tps(m: Model, tokens: int) -> float:
    m.reset_cache()
    g = m.generate(
        [{"role": "user", "content": COUNT}], SamplingParams(temperature=0, max_tokens=tokens)
    )
    g.consume()
    return g.stats.gen_tps


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", action="append", default=None)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    if not (llama_lib.amx_build() and llama_lib.amx_kernels_safe()):
        print("this llama.cpp build has no usable AMX kernels on this CPU; nothing to compare")
        return 1
    lib = ModelLibrary(AppPaths.default().models)
    rows = []
    for name in args.model or ["default"]:
        path = lib.resolve(name)
        arms = {
            kind: Model(
                path,
                LoadParams(
                    n_ctx=2048,
                    n_threads=args.threads,
                    state_cache_mb=0,
                    extra_buffers=kind == "amx",
                ),
            )
            for kind in ("generic", "amx")
        }
        res: dict[str, dict[str, list[float]]] = {k: {"pp": [], "tg": []} for k in arms}
        for m in arms.values():
            prompt_tps(m)  # warm-up
            decode_tps(m, 8)
        for _ in range(args.runs):
            for kind, m in arms.items():
                res[kind]["pp"].append(prompt_tps(m))
                res[kind]["tg"].append(decode_tps(m, args.tokens))
        med = {k: {x: statistics.median(v) for x, v in r.items()} for k, r in res.items()}
        rows.append((path.name, med))
        print(
            f"{path.name}: prompt {med['generic']['pp']:.0f} -> {med['amx']['pp']:.0f} t/s, "
            f"decode {med['generic']['tg']:.1f} -> {med['amx']['tg']:.1f} t/s",
            flush=True,
        )
        for m in arms.values():
            m.close()
    shown = [a for a in sys.argv[1:] if a != "--write"]
    out = [
        f"`{' '.join(['benchmarks/cpu_kernels.py', *shown])}`",
        "",
        "| model | prompt t/s generic | prompt t/s AMX | AMX / generic | decode t/s generic "
        "| decode t/s AMX | AMX / generic |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, med in rows:
        g, a = med["generic"], med["amx"]
        out.append(
            f"| {name} | {g['pp']:.0f} | {a['pp']:.0f} | {a['pp'] / g['pp']:.2f} | "
            f"{g['tg']:.1f} | {a['tg']:.1f} | {a['tg'] / g['tg']:.2f} |"
        )
    out.append("")
    for name, med in rows:
        g, a = med["generic"], med["amx"]
        out.append(
            f"SUMMARY {name}: prompt x{a['pp'] / g['pp']:.2f}, decode "
            f"x{a['tg'] / g['tg']:.2f} with AMX weights ({args.threads} threads)"
        )
    text = "\n".join(out)
    print()
    text = f"{text}\n\n{machine_line()}"  # which CPU: kernels differ
    print(text)
    if args.write:
        replace_between(DOC, START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
