"""What log probabilities cost the decode loop: per token, and in decode speed.

Two measurements on one loaded model (default: the bundled SmolLM2, 49,152 tokens):

- per token: the work the loop adds for a request that asks (engine.host.logprobs: the
  log-softmax of a real logits row over the whole vocabulary, its most likely tokens, their
  pieces through the backend), in the loop thread's CPU time for 0, 5 and 20 alternatives;
- decode cost: the same greedy generation through the scheduler without log probabilities
  and with 20 alternatives, runs alternating (A, B, A, B, ...) so that drift hits both alike;
  the process's CPU time per generated token (what a busy machine's other programs do not
  blur, unlike wall time) and tokens/s between the first and the last piece.

    .venv/bin/python benchmarks/logprobs_cost.py [--model default] [--tokens 128] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from engine.host.logprobs import log_softmax, token_logprob
from engine.host.requests import Event, Finished, Piece
from engine.host.runtime import Model
from engine.settings import LoadParams, SamplingParams

PROMPT = "Once upon a time, in a small village by the sea, there lived"


def per_token_us(model: Model, n_top: int, reps: int) -> float:
    """Microseconds for one token's entry, on the loop's thread, from a real logits row."""

    def work() -> float:
        be = model.backend
        assert be is not None
        prompt = model.tokenize(PROMPT)
        batch = be.batch(len(prompt))
        for i, t in enumerate(prompt):
            batch.put(i, t, i, 0, i == len(prompt) - 1)
        batch.n_tokens = len(prompt)
        be.decode(batch)
        batch.close()
        row = be.logits(len(prompt) - 1).copy()
        be.seq_rm(0)
        t0 = time.thread_time()
        for _ in range(reps):
            lp = log_softmax(row)
            tok = int(row.argmax())
            text = be.token_to_piece(tok, False)
            token_logprob(lp, tok, text, n_top, lambda t: be.token_to_piece(t, True))
        return (time.thread_time() - t0) / reps * 1e6

    return model.loop.call_idle(work)


def generate(model: Model, n_tokens: int, logprobs: int | None) -> tuple[float, float]:
    """One greedy generation through the scheduler, from its first piece on: the process's
    CPU milliseconds per token, and tokens/s."""
    model.reset_cache()
    done = threading.Event()
    stamps: list[tuple[float, float, int]] = []

    def on_event(ev: Event) -> None:
        if isinstance(ev, Piece):
            stamps.append((time.perf_counter(), time.process_time(), ev.n_tokens))
        elif isinstance(ev, Finished):
            done.set()

    model.loop.submit(
        model.tokenize(PROMPT),
        SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=n_tokens + 1),
        on_event,
        logprobs=logprobs,
    )
    assert done.wait(600)
    (t0, c0, n0), (t1, c1, n1) = stamps[0], stamps[-1]
    return (c1 - c0) / (n1 - n0) * 1e3, (n1 - n0) / (t1 - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    path = ModelLibrary(AppPaths.default().models).resolve(args.model)
    model = Model(path, LoadParams(n_ctx=1024, n_threads=args.threads, flash_attn="on"))
    try:
        micro = {n: per_token_us(model, n, 300) for n in (0, 5, 20)}
        generate(model, 32, None)  # warm-up: weights paged in, clocks settled
        plain: list[tuple[float, float]] = []
        asked: list[tuple[float, float]] = []
        for _ in range(args.runs):
            plain.append(generate(model, args.tokens, None))
            asked.append(generate(model, args.tokens, 20))
        n_vocab = model.n_vocab
    finally:
        model.close()
    cpu = [a[0] / p[0] for a, p in zip(asked, plain, strict=True)]
    result: dict[str, Any] = {
        "model": path.name,
        "n_vocab": n_vocab,
        "tokens": args.tokens,
        "runs": args.runs,
        "threads": args.threads,
        "per_token_us_top0": round(micro[0], 1),
        "per_token_us_top5": round(micro[5], 1),
        "per_token_us_top20": round(micro[20], 1),
        "plain_cpu_ms_per_token": round(statistics.median(p[0] for p in plain), 2),
        "top20_cpu_ms_per_token": round(statistics.median(a[0] for a in asked), 2),
        "top20_over_plain_cpu_median": round(statistics.median(cpu), 3),
        "top20_over_plain_cpu_max": round(max(cpu), 3),
        "plain_tps_median": round(statistics.median(p[1] for p in plain), 1),
        "top20_tps_median": round(statistics.median(a[1] for a in asked), 1),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k:28} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
