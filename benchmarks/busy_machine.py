"""Decode speed on a busy machine: the thread count that follows contention, on and off.

llama.cpp's CPU threads meet at a spinning barrier after every operation; when other programs
hold the cores, a thread that lost its core costs a scheduler time slice per barrier
(engine/native/thread_tuner.py). This measures what that does to a user's reply, and what
`LoadParams.adapt_threads` (on by default) gives back: greedy decode tok/s of one reply
through the product's `Model`, with the tuner on and off, alternating, on a quiet machine and
beside N busy loops (`yes`, one per core by default, as scripts/test_under_load.sh runs them),
each reply on a freshly loaded model.

    .venv/bin/python benchmarks/busy_machine.py [--pairs 3] [--tokens 128] [--busy N]
        [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.services.library import bundled_default_model  # noqa: E402
from benchmarks.doc_tables import machine_line, replace_between  # noqa: E402
from engine.host.runtime import Model  # noqa: E402
from engine.settings import LoadParams, SamplingParams  # noqa: E402

PROMPT = "Once upon a time, in a small village by the sea, there lived"
START, END = "<!-- busy-machine-table:start -->", "<!-- busy-machine-table:end -->"


def reply_rate(path: Path, *, adapt: bool, threads: int, tokens: int) -> tuple[float, int]:
    """Decode tok/s of one greedy reply, and the thread count it ended on."""
    params = LoadParams(n_ctx=1024, n_threads=threads, adapt_threads=adapt)
    with Model(path, params) as m:
        gen = m.complete(PROMPT, SamplingParams(temperature=0, max_tokens=tokens))
        t0 = time.perf_counter()
        gen.consume()
        rate = gen.stats.gen_tokens / (time.perf_counter() - t0)
        assert m.backend is not None
        return rate, m.backend.threads


def arm(path: Path, args: argparse.Namespace, busy: int) -> dict[str, Any]:
    loops = [
        subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(busy)
    ]  # started here, ended here
    try:
        rates: dict[bool, list[float]] = {True: [], False: []}
        ended: dict[bool, list[int]] = {True: [], False: []}
        for i in range(args.pairs):
            for adapt in (True, False) if i % 2 == 0 else (False, True):
                r, n = reply_rate(path, adapt=adapt, threads=args.threads, tokens=args.tokens)
                rates[adapt].append(r)
                ended[adapt].append(n)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    on, off = rates[True], rates[False]
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    return {
        "busy_loops": busy,
        "adapting_tok_s": round(statistics.median(on), 1),
        "adapting_range": [round(min(on), 1), round(max(on), 1)],
        "fixed_tok_s": round(statistics.median(off), 1),
        "fixed_range": [round(min(off), 1), round(max(off), 1)],
        "ratio": round(statistics.median(ratios), 2),
        "threads_at_end_adapting": ended[True],
    }


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "| machine | adapting (default) tok/s | fixed threads tok/s | ratio (median of pairs) |"
        " threads at the end, adapting |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        where = "quiet" if not r["busy_loops"] else f"beside {r['busy_loops']} busy loops"
        lines.append(
            f"| {where} | {r['adapting_tok_s']} ({r['adapting_range'][0]}-"
            f"{r['adapting_range'][1]}) | {r['fixed_tok_s']} ({r['fixed_range'][0]}-"
            f"{r['fixed_range'][1]}) | {r['ratio']}x | "
            f"{', '.join(map(str, r['threads_at_end_adapting']))} |"
        )
    cmd = (
        f"`.venv/bin/python benchmarks/busy_machine.py --pairs {args.pairs} "
        f"--tokens {args.tokens} --threads {args.threads}`"
    )
    return "\n".join(lines) + f"\n\nSmolLM2-135M Q4_1, greedy, {args.tokens} tokens. {cmd}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args()
    path = Path(args.model) if args.model else bundled_default_model()
    if path is None:
        raise SystemExit("no model: pass --model or run `make setup`")
    rows = [arm(path, args, 0), arm(path, args, args.busy)]
    print(json.dumps({"machine": machine_line(), "rows": rows}, indent=2))
    if args.write:
        replace_between(args.write, START, END, table(rows, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
