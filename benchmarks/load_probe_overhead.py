"""What the first-load probe (engine.native.load_probe) adds to a first load, against the time of
the dry-run memory estimate. The goal: added time < 1.5 x the dry-run estimate's time.

Per round, alternating so drift on a noisy machine hits all alike: the dry-run estimate
(`estimate(..., method="dry-run")`, what the library panel runs for a selected file), a first
load (a fresh `FirstLoads` folder, so the child runs) and a later load (the file remembered).
Added time = median first load - median later load; the probe child alone is timed too.

    .venv/bin/python benchmarks/load_probe_overhead.py [--model default] [--rounds 9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from engine.host.runtime import Model
from engine.memory.estimate import estimate
from engine.memory.params import EstimateParams
from engine.native.load_probe import FirstLoads, probe
from engine.native.native_load import NativeLoad
from engine.settings import LoadParams


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--ctx", type=int, default=4096)
    args = ap.parse_args()
    path = ModelLibrary(AppPaths.default().models).resolve(args.model)
    params = LoadParams(n_ctx=args.ctx, n_threads=2, state_cache_mb=0)
    times: dict[str, list[float]] = {"estimate": [], "first": [], "later": [], "child": []}
    with tempfile.TemporaryDirectory() as tmp:
        known = FirstLoads(Path(tmp) / "known")
        Model(path, params, first_loads=known).close()  # warm the page cache, remember it
        for i in range(args.rounds):
            t0 = time.perf_counter()
            estimate(path, EstimateParams(params), method="dry-run")
            t1 = time.perf_counter()
            Model(path, params, first_loads=FirstLoads(Path(tmp) / f"fresh{i}")).close()
            t2 = time.perf_counter()
            Model(path, params, first_loads=known).close()
            t3 = time.perf_counter()
            probe(NativeLoad(str(path), n_ctx=args.ctx))
            t4 = time.perf_counter()
            for k, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                times[k].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    added = med["first"] - med["later"]
    print(
        json.dumps(
            {
                "model": path.name,
                "cpu": _cpu(),
                "rounds": args.rounds,
                "n_ctx": args.ctx,
                "median_s": {k: round(v, 3) for k, v in med.items()},
                "added_s": round(added, 3),
                "added_over_estimate": round(added / med["estimate"], 2),
                "child_over_estimate": round(med["child"] / med["estimate"], 2),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
