"""What choosing one token costs, llama.cpp's sampler chain against the loop's way (CPU time).

For each sampling setting, on a real logits row of the model: the whole chain as llama.cpp
runs it (`llama_sampler_sample`: the vocabulary copied into candidates, then each sampler),
against what the decode loop does since it applies a repeat penalty and picks a greedy token
itself (engine.host.greedy_pick: the window's tokens penalised in the row, then the chain
without the penalties sampler; a greedy token by numpy's argmax). CPU time of the calling
thread (`time.thread_time`), so other programs' load moves it little; medians of `--rounds`
rounds of `--calls` calls, warm (the row and the candidates stay in cache: within the loop,
after a decode, each costs more).

    .venv/bin/python benchmarks/sampler_cost.py [--model PATH] [--calls 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.services.library import bundled_default_model
from benchmarks.doc_tables import machine_line
from engine.host.greedy_pick import GreedyPicker, RepeatWindow, chain_spec, usable
from engine.host.runtime import Model
from engine.native.backend import LlamaBackend
from engine.settings import LoadParams, SamplingParams

PROMPT = "Once upon a time, in a small village by the sea, there lived"
SETTINGS = {
    "greedy": SamplingParams(temperature=0, repeat_penalty=1.0),
    "greedy, repeat penalty 1.1 over 64": SamplingParams(temperature=0),
    "the chat's defaults (penalty 1.1, top-k 40, top-p 0.95, min-p 0.05, t 0.8)": (
        SamplingParams(seed=1)
    ),
    "the API's defaults at t 0.7 (no penalty)": SamplingParams(
        seed=1, temperature=0.7, repeat_penalty=1.0
    ),
}


def per_call_us(fn: Callable[[], object], calls: int, rounds: int) -> float:
    for _ in range(20):
        fn()
    out = []
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        out.append((time.thread_time() - t0) / calls * 1e6)
    return statistics.median(out)


def measure(m: Model, calls: int, rounds: int) -> list[tuple[str, float, float]]:
    be = m.backend
    assert isinstance(be, LlamaBackend)
    prompt = m.tokenize(PROMPT)
    be.clear()
    b = be.batch(len(prompt))
    for i, t in enumerate(prompt):
        b.put(i, t, i, 0, i == len(prompt) - 1)
    b.n_tokens = len(prompt)
    be.decode(b)
    b.close()
    row = be.logits(-1)
    kept = row.copy()
    rows = []
    for name, s in SETTINGS.items():
        whole = be.sampler(s)
        for t in prompt:
            be.sampler_accept(whole, t)
        chain_us = per_call_us(lambda ch=whole: be.sample(ch, -1), calls, rounds)
        be.sampler_free(whole)
        if usable(s):
            picker = GreedyPicker(s, prompt)
            greedy_chain = be.sampler(chain_spec(s))

            def loop_way(p: GreedyPicker = picker, ch: object = greedy_chain) -> None:
                row[:] = kept
                be.sampler_accept(ch, p.pick(row))  # type: ignore[arg-type]

            loop_us = per_call_us(loop_way, calls, rounds)
            be.sampler_free(greedy_chain)  # type: ignore[arg-type]
        else:
            window = RepeatWindow(s, prompt)
            rest = be.sampler(chain_spec(s))

            def loop_way_sampled(w: RepeatWindow = window, ch: object = rest) -> None:
                row[:] = kept
                w.penalise(row)
                w.accept(be.sample(ch, -1))  # type: ignore[arg-type]

            loop_us = per_call_us(loop_way_sampled, calls, rounds)
            be.sampler_free(rest)
        # (the loop's way restores the row first: a copy of 49k floats is in its figure)
        rows.append((name, chain_us, loop_us))
    row[:] = kept
    be.clear()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    path = Path(args.model) if args.model else bundled_default_model()
    if path is None:
        raise SystemExit("no model: pass --model or run `make setup`")
    with Model(path, LoadParams(n_ctx=512)) as m:
        rows = m.loop.call_idle(lambda: measure(m, args.calls, args.rounds))
    print("| sampling | llama.cpp's chain, us a token | the loop's way, us a token |")
    print("|---|---:|---:|")
    for name, chain_us, loop_us in rows:
        print(f"| {name} | {chain_us:.1f} | {loop_us:.1f} |")
    print(f"\n{machine_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
