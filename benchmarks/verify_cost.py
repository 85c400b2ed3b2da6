"""What a verification batch of n tokens costs, in one-token decodes, inside the speculative loop.

Runs the speculative benchmark's prompts with prompt lookup drafting as far as it can
(every match drafted to 16 tokens, so many batch sizes occur) and times every `llama_decode`
the model's decode loop makes, by its number of tokens; each prompt is also decoded plainly
(`spec="off"`, same model), and its median one-token decode is the unit. Shape changes between
steps (llama.cpp rebuilds its graph) are included, which is what the drafter pays. The engine's
cost curves (`engine.host.speculative.COST_*`) come from this.

The decode loop sizes prompt-lookup drafts with the model's cost curve (`verify_cost`, taken
when the loop binds the context); there is no setting for it, so the model is loaded with
`engine.host.scheduler.verify_cost` replaced by a curve under which every draft pays.

    .venv/bin/python benchmarks/verify_cost.py [--config app|exact|both] [--threads 2] [--write]

app: the default load settings (AMX weights where the build's AMX kernels work); exact: no AMX
weights, flash attention on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama_cpp.llama_cpp as bindings
from doc_tables import machine_line, replace_between
from speculative import PROMPTS, run_once

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from engine.host import scheduler
from engine.host.runtime import Model
from engine.host.speculative import VerifyCost
from engine.settings import LoadParams

SIZES = (1, 2, 3, 4, 6, 8, 12, 17)
DOC = Path(__file__).resolve().parent.parent / "docs" / "speculative.md"
START, END = "<!-- verify-cost-table:start -->", "<!-- verify-cost-table:end -->"


# Every match drafted to its end: batch sizes from 2 to 17 all occur.
GREEDY_DRAFTS = VerifyCost(1e-3, 0.0)


def load(path: Path, params: LoadParams) -> Model:
    """`path` with a decode loop whose prompt lookup drafts every match as far as it goes
    (up to DEFAULT_DRAFT_MAX, 16 tokens)."""
    with mock.patch.object(scheduler, "verify_cost", lambda _model: GREEDY_DRAFTS):
        return Model(path, params)


def measure(model: Model) -> dict[int, list[float]]:
    original = bindings.llama_decode
    times: dict[int, list[float]] = defaultdict(list)

    def timed(ctx: Any, batch: Any) -> int:  # on the model's decode thread
        t = time.perf_counter()
        rc = int(original(ctx, batch))
        times[int(batch.n_tokens)].append(time.perf_counter() - t)
        return rc

    ratios: dict[int, list[float]] = defaultdict(list)
    for _, prompt in PROMPTS:
        run_once(model, prompt, 8, "off")  # warm-up
        for spec in ("off", "lookup"):
            times.clear()
            bindings.llama_decode = timed
            try:
                run_once(model, prompt, 160, spec)
            finally:
                bindings.llama_decode = original
            if spec == "off":
                unit = statistics.median(times[1])
            else:
                for n, ts in times.items():
                    if n <= 17:
                        ratios[n].extend(t / unit for t in ts)
    return ratios


def fit(ratios: dict[int, list[float]]) -> VerifyCost:
    """`first` = cost of 2 tokens; `step` = least-squares slope over 2..17 tokens."""
    pts = [(n, statistics.median(v)) for n, v in ratios.items() if n >= 2 and len(v) >= 3]
    first = statistics.median(ratios[2]) if ratios.get(2) else 0.0
    if len(pts) < 2:
        return VerifyCost(first, 0.0)
    xs, ys = zip(*pts, strict=True)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    step = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x in xs)
    return VerifyCost(round(first, 2), round(step, 2))


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--config", choices=("app", "exact", "both"), default="both")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", action="store_true", help="update the table in docs/speculative.md")
    args = ap.parse_args()
    path = ModelLibrary(AppPaths.default().models).resolve(args.model)
    base = LoadParams(n_ctx=2048, n_threads=args.threads, state_cache_mb=0)
    configs = {"app": base, "exact": replace(base, extra_buffers=False, flash_attn="on")}
    rows: list[str] = []
    summaries: list[str] = []
    for name, params in configs.items():
        if args.config not in (name, "both"):
            continue
        with load(path, params) as m:
            ratios = measure(m)
        cells = [f"{statistics.median(ratios[n]):.2f}" if ratios.get(n) else "-" for n in SIZES]
        c = fit(ratios)
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {c.first} + {c.step} (n - 2) |")
        print(rows[-1], flush=True)
        summaries.append(f"SUMMARY {name}: {c}")
    shown = [a for a in sys.argv[1:] if a != "--write"]
    text = "\n".join(
        [
            f"`{' '.join(['benchmarks/verify_cost.py', *shown])}`",
            "",
            "| configuration | " + " | ".join(f"{n} tok" for n in SIZES) + " | fit for n >= 2 |",
            "|---|" + "---:|" * len(SIZES) + "---|",
            *rows,
            "",
            *summaries,
        ]
    )
    print()
    text = f"{text}\n\n{machine_line()}"  # which CPU: kernels differ
    print(text)
    if args.write:
        replace_between(DOC, START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
