"""What the graph lanes save: decode times when the batch size alternates, lanes on and off.

A speculative step decodes one token, then a drafted batch, then one token again. llama.cpp
keeps one built graph and rebuilds it on every change of batch size; `make setup`'s build keeps
graphs for batches of 2-8 tokens on lanes of their own (installers/llama_cpp/graph_lanes.patch).
This decodes `1, k, 1, k, ...` after a 300-token prompt (every row's logits, as verification
asks) and reports the median time of each size, with the lanes on (the build's default) and
off (LLAMA_GRAPH_SMALL_LANE_MAX=0, which the library reads when a context is made), the two
alternating round by round in one process. Steady one-size decodes are shown as the floor.

    .venv/bin/python benchmarks/graph_lanes.py [--rounds 4] [--threads 2] [--sizes 2,3,5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_tables import machine_line
from verify_cost import decoder_after_filler

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from engine.host.runtime import Model
from engine.native import llama_lib
from engine.settings import LoadParams

PROMPT = 300  # filler tokens before the timed decodes
STEPS = 30  # alternations per size and round


def one_round(path: Path, lanes: bool, sizes: list[int], threads: int) -> dict[str, float]:
    """Median ms per decode by pattern, in a context made with the lanes on or off."""
    os.environ["LLAMA_GRAPH_SMALL_LANE_MAX"] = "8" if lanes else "0"
    m = Model(path, LoadParams(n_ctx=1024, n_threads=threads, state_cache_mb=0))

    def work() -> dict[str, float]:
        be = m.backend
        assert be is not None
        with decoder_after_filler(be, PROMPT, fixed_threads=True) as dec:
            times: dict[str, list[float]] = defaultdict(list)
            for _ in range(STEPS):
                times["1 alone"].append(dec(1))
            for k in sizes:
                for _ in range(STEPS):
                    times[f"1 after {k}"].append(dec(1))
                    times[f"{k} after 1"].append(dec(k))
            return {key: statistics.median(v) * 1000 for key, v in times.items()}

    try:
        return m.loop.call_soon(work)
    finally:
        m.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="2,3,5")
    args = ap.parse_args()
    if not llama_lib.graph_lanes():
        print("this llama.cpp build has no graph lanes (make setup builds them)")
        return 1
    path = ModelLibrary(AppPaths.default().models).resolve(args.model)
    sizes = [int(s) for s in args.sizes.split(",")]
    found: dict[bool, dict[str, list[float]]] = {True: defaultdict(list), False: defaultdict(list)}
    for r in range(args.rounds):
        for lanes in (r % 2 == 0, r % 2 == 1):  # alternate which side goes first
            for key, ms in one_round(path, lanes, sizes, args.threads).items():
                found[lanes][key].append(ms)
    keys = list(found[True])
    print(f"`{' '.join(['benchmarks/graph_lanes.py', *sys.argv[1:]])}`")
    print()
    print("| decode | lanes off, ms | lanes on, ms | on / off |")
    print("|---|---:|---:|---:|")
    for key in keys:
        off, on = statistics.median(found[False][key]), statistics.median(found[True][key])
        print(f"| {key} | {off:.2f} | {on:.2f} | {on / off:.2f} |")
    print()
    print(f"Medians of {args.rounds} rounds per side, alternating; {machine_line()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
