"""What a verification batch of n tokens costs, in one-token decodes, inside the speculative loop.

Runs the speculative benchmark's prompts with prompt lookup drafting as far as it can
(every match drafted to 16 tokens, so many batch sizes occur) and times every `llama_decode`
the model's decode loop makes, by its number of tokens; each prompt is also decoded plainly
(`spec="off"`, same model), and its median one-token decode is the unit. Shape changes between
steps (llama.cpp rebuilds its graph) are included, which is what the drafter pays. The engine's
cost curves (`engine.host.speculative.COST_*`) come from this.

The decode loop sizes prompt-lookup drafts with the cost curve it measures (engine.host.
draft_gain) and drafts only while drafting measures faster; there is no setting for either, so
here the curve is replaced by one under which every draft pays and every draft is allowed.

    .venv/bin/python benchmarks/verify_cost.py [--config app|exact|both] [--threads 2] [--write]
    .venv/bin/python benchmarks/verify_cost.py --raw [--threads 1 --clock cpu] [--depths 20,300]
    .venv/bin/python benchmarks/verify_cost.py --breakdown [--only quote]

app: the default load settings (AMX weights where the build's AMX kernels work); exact: no AMX
weights, flash attention on.

`--raw`: the kernels alone, outside the loop: n tokens decoded again and again at the same
position (after 300 prompt tokens, or each of `--depths`) with logits for every row (what
verification asks for), for the last row only, and right after a one-token decode. Each cached
token adds attention work to every row of a batch, so the curve depends on the depth.
`--clock cpu` with `--threads 1` counts the decode thread's CPU time, a fair figure on a
machine other jobs keep busy.

`--breakdown`: where one speculative request's time goes on the decode thread: the decodes by
batch size, the sampler chain's calls, the KV removal of rejected drafts, the drafter's
lookup, and handing each token out.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
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
from engine.host import draft_gain, scheduler
from engine.host.runtime import Model
from engine.host.speculative import VerifyCost
from engine.settings import LoadParams, SpeculativeSettings

SIZES = (1, 2, 3, 4, 6, 8, 12, 17)
RAW_SIZES = (1, 2, 3, 4, 6, 8, 12)
RAW_PROMPT = 300
FILL_BATCH = 256
DOC = Path(__file__).resolve().parent.parent / "docs" / "speculative.md"
START, END = "<!-- verify-cost-table:start -->", "<!-- verify-cost-table:end -->"


# Every match drafted to its end: batch sizes from 2 to 17 all occur.
GREEDY_DRAFTS = VerifyCost(1e-3, 0.0)


@contextlib.contextmanager
def greedy_drafting() -> Iterator[None]:
    """Every prompt-lookup match drafted as far as it goes (up to DEFAULT_DRAFT_MAX, 16
    tokens), whatever the loop measured."""
    with (
        mock.patch.object(scheduler, "verify_cost", lambda _model: GREEDY_DRAFTS),
        mock.patch.object(draft_gain.MeasuredCost, "__call__", lambda _self, n: GREEDY_DRAFTS(n)),
        mock.patch.object(draft_gain.DraftGain, "allow", lambda _self, _busy, _bucket: True),
    ):
        yield


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


@contextlib.contextmanager
def decoder_after_filler(
    be: Any, prompt: int, clock: Any = time.perf_counter, fixed_threads: bool = False
) -> Iterator[Callable[..., float]]:
    """On the decode thread: `prompt` filler tokens decoded on a cleared context, then
    `dec(n, every_row=True)`: n more tokens decoded right after them, timed by `clock`, and
    removed again, so every call decodes at the same position (the context is cleared after)."""
    b = be.batch(FILL_BATCH)  # (the timed batches are smaller)
    try:
        be.clear()
        for start in range(0, prompt, FILL_BATCH):  # (a context's batch holds 512 tokens)
            n = min(FILL_BATCH, prompt - start)
            for i in range(n):
                b.put(i, 100 + (start + i) % 500, start + i, 0, False)
            b.n_tokens = n
            be.decode(b, fixed_threads=fixed_threads)

        def dec(n: int, every_row: bool = True) -> float:
            for j in range(n):
                b.put(j, 200 + j, prompt + j, 0, every_row or j == n - 1)
            b.n_tokens = n
            t = clock()
            be.decode(b, fixed_threads=fixed_threads)
            dt = float(clock() - t)
            be.seq_rm(0, prompt, -1)
            return dt

        yield dec
    finally:
        b.close()
        be.clear()


def raw_curve(
    model: Model, reps: int, clock: Any, depth: int = RAW_PROMPT
) -> dict[str, dict[int, float]]:
    """Decode times by batch size at a fixed position (after `depth` cached tokens), in units
    of one token (see the doc)."""

    def work() -> dict[str, dict[int, list[float]]]:
        be = model.backend
        assert be is not None
        with decoder_after_filler(be, depth, clock) as dec:
            out: dict[str, dict[int, list[float]]] = {
                k: defaultdict(list) for k in ("every row", "last row", "after 1 token")
            }
            for _ in range(reps):
                for n in RAW_SIZES:
                    dec(n)
                    out["every row"][n].append(dec(n))  # the same shape again: graph reused
                    dec(n, False)
                    out["last row"][n].append(dec(n, False))
                    dec(1)
                    out["after 1 token"][n].append(dec(n))
            return out

    times = model.loop.call_soon(work)
    unit = statistics.median(times["every row"][1])
    return {
        k: {n: statistics.median(v) / unit for n, v in by_n.items()} for k, by_n in times.items()
    } | {"unit ms": {1: unit * 1000}}


def breakdown(model: Model, prompts: list[tuple[str, str]]) -> list[str]:
    """Time spent per part of the speculative loop's steps, summed over `prompts`."""
    from engine.host import batch_builder, finishing, speculative
    from engine.native import backend

    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    by_n: dict[int, list[float]] = defaultdict(list)
    patches = []

    def timer(owner: Any, attr: str, key: str) -> None:
        original = getattr(owner, attr)

        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            r = original(*a, **kw)
            dt = time.perf_counter() - t
            spent[key] += dt
            calls[key] += 1
            if attr == "decode":
                by_n[int(a[1].n_tokens)].append(dt)
            return r

        patches.append(mock.patch.object(owner, attr, timed))

    timer(batch_builder.BatchBuilder, "step", "step (all of it)")
    timer(backend.LlamaBackend, "decode", "decode")
    timer(backend.LlamaBackend, "sample", "sampler chain (sample)")
    timer(backend.LlamaBackend, "seq_rm", "KV removal (seq_rm)")
    timer(speculative.PromptLookup, "propose", "lookup (propose)")
    timer(finishing.Finisher, "emit_token", "hand out a token (emit_token)")
    for _, prompt in prompts:
        run_once(model, prompt, 8, "lookup")  # warm-up
    for p in patches:
        p.start()
    try:
        for name, prompt in prompts:
            r = run_once(model, prompt, 160, "lookup")
            print(f"{name}: {r['tokens']} tokens, {r['accepted']}/{r['drafted']} accepted")
    finally:
        for p in reversed(patches):
            p.stop()
    total = spent["step (all of it)"]
    unit = statistics.median(by_n[1]) if by_n.get(1) else float("nan")
    rows = ["| part | ms | share of the steps | calls | per call |", "|---|---:|---:|---:|---:|"]
    for key in sorted(spent, key=lambda k: -spent[k]):
        rows.append(
            f"| {key} | {spent[key] * 1000:.1f} | {spent[key] / total:.1%} | {calls[key]} "
            f"| {spent[key] / calls[key] * 1e6:.0f} us |"
        )
    rows += [
        "",
        "| decode of n tokens | " + " | ".join(str(n) for n in sorted(by_n) if n <= 17) + " |",
        "|---|" + "---:|" * sum(1 for n in by_n if n <= 17),
        "| calls | " + " | ".join(str(len(by_n[n])) for n in sorted(by_n) if n <= 17) + " |",
        "| median, in one-token decodes | "
        + " | ".join(f"{statistics.median(by_n[n]) / unit:.2f}" for n in sorted(by_n) if n <= 17)
        + " |",
    ]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--config", choices=("app", "exact", "both"), default="both")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", action="store_true", help="update the table in docs/speculative.md")
    ap.add_argument("--raw", action="store_true", help="instead: the kernels' curve alone")
    ap.add_argument("--reps", type=int, default=15, help="--raw: repetitions per size")
    ap.add_argument(
        "--depths",
        default=str(RAW_PROMPT),
        help="--raw: comma-separated cached tokens before the timed decodes (one table each)",
    )
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="--raw's clock")
    ap.add_argument("--breakdown", action="store_true", help="instead: one lookup run's parts")
    ap.add_argument("--only", default=None, help="--breakdown: comma-separated prompt names")
    args = ap.parse_args()
    path = ModelLibrary(AppPaths.default().models).resolve(args.model)
    base = LoadParams(n_ctx=2048, n_threads=args.threads, state_cache_mb=0)
    if args.raw or args.breakdown:
        return side_main(args, path, base)
    configs = {"app": base, "exact": replace(base, extra_buffers=False, flash_attn="on")}
    rows: list[str] = []
    summaries: list[str] = []
    for name, params in configs.items():
        if args.config not in (name, "both"):
            continue
        with greedy_drafting(), Model(path, params) as m:
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


def side_main(args: argparse.Namespace, path: Path, base: LoadParams) -> int:
    """`--raw` and `--breakdown`, at the app's settings (plus lookup for the breakdown)."""
    if args.raw:
        clock = time.thread_time if args.clock == "cpu" else time.perf_counter
        with Model(path, base) as m:
            for depth in (int(d) for d in args.depths.split(",")):
                curves = raw_curve(m, args.reps, clock, depth)
                unit = curves.pop("unit ms")[1]
                print(
                    f"after {depth} cached tokens, one token: {unit:.2f} ms "
                    f"({args.clock} clock, {args.threads} threads)"
                )
                print("| logits | " + " | ".join(f"{n} tok" for n in RAW_SIZES) + " |")
                print("|---|" + "---:|" * len(RAW_SIZES))
                for k, by_n in curves.items():
                    print(f"| {k} | " + " | ".join(f"{by_n[n]:.2f}" for n in RAW_SIZES) + " |")
    else:
        only = args.only.split(",") if args.only else None
        prompts = [(n, p) for n, p in PROMPTS if only is None or n in only]
        with Model(path, replace(base, speculative=SpeculativeSettings("lookup"))) as m:
            print("\n".join(breakdown(m, prompts)))
    print(machine_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
