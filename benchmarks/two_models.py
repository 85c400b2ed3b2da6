"""Two models in one process: a model's decode speed while another model's idle loop thread
still holds llama.cpp's CPU workers, and once that thread has ended (docs/benchmarks.md,
"Two models in one process").

    .venv/bin/python benchmarks/two_models.py [--pairs 8] [--tokens 128] [--second PATH]

llama.cpp's CPU workers are an OpenMP team that belongs to the thread that decodes. Each loaded
model decodes on its own loop thread, so with two models that have decoded the process holds
two teams; with more OpenMP threads than cores libgomp stops letting idle workers spin, and a
decode step then waits for sleeping workers. The loop ends an idle thread after
`engine.host.loop_thread.IDLE_THREAD_S` (its team goes with it). Here that spell is 10 s so
that both states can be measured in one process, alternating: model B replies 0.2 s after model
A replied (A's team still there), then again 12 s after A replied (A's thread has ended). Both
models are the bundled SmolLM2 unless --second names another file for A. Greedy replies, the
decode-time rate the chat shows (`gen_tps`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import engine.host.loop_thread as loop_thread  # noqa: E402
from benchmarks.doc_tables import machine_line  # noqa: E402
from benchmarks.host_clients import model_path  # noqa: E402
from engine.host.runtime import Model  # noqa: E402
from engine.settings import LoadParams, SamplingParams  # noqa: E402

ASK = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
SPELL_S = 10.0  # the idle spell during the run: longer than a reply, shorter than the wait
RETIRED_WAIT_S = SPELL_S + 2.0


def reply_rate(model: Model, sampling: SamplingParams) -> float:
    gen = model.generate(ASK, sampling)
    gen.consume()
    return gen.stats.gen_tps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--second", type=Path, help="model A (default: the bundled SmolLM2)")
    args = ap.parse_args()
    loop_thread.IDLE_THREAD_S = SPELL_S
    sampling = SamplingParams(temperature=0, max_tokens=args.tokens)
    params = LoadParams(n_ctx=1024, n_threads=args.threads)
    b = Model(model_path(None), params)
    a = Model(args.second or model_path(None), params)  # loaded second: A
    try:
        reply_rate(b, sampling)
        reply_rate(a, sampling)
        present: list[float] = []
        retired: list[float] = []
        for i in range(args.pairs):
            reply_rate(a, sampling)
            time.sleep(0.2)
            present.append(reply_rate(b, sampling))
            reply_rate(a, sampling)
            time.sleep(RETIRED_WAIT_S)
            retired.append(reply_rate(b, sampling))
            print(
                f"pair {i + 1}: A's workers there {present[-1]:.1f} tok/s, "
                f"A's thread ended {retired[-1]:.1f} tok/s",
                flush=True,
            )
    finally:
        a.close()
        b.close()
    p, r = statistics.median(present), statistics.median(retired)
    wins = sum(y > x for x, y in zip(present, retired, strict=True))
    print(
        f"\nB's decode speed, median of {args.pairs} pairs: {p:.1f} tok/s with A's idle "
        f"workers, {r:.1f} tok/s once A's thread ended (x{r / p:.2f}; faster in {wins} "
        f"of {args.pairs} pairs)"
    )
    print(machine_line())


if __name__ == "__main__":
    main()
