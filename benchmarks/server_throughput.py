"""Aggregate generation throughput of the local server at 1, 2, 4, 8, 16 concurrent requests.

Runs the real HTTP server (continuous batching, 16 slots) on SmolLM2 in this process and sends
non-streaming chat requests from client threads. The reference is measured in the same run:
the single-request throughput through the same server, and the decode speed of
`candlewick run` (engine.runtime on its own context). Rounds are interleaved so that a noisy
machine affects every level alike; medians are reported.

    .venv/bin/python benchmarks/server_throughput.py [--max-tokens 96] [--rounds 3]
        [--append docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.services.library import bundled_default_model  # noqa: E402
from engine.runtime import LoadParams, Model, SamplingParams  # noqa: E402
from engine.server import LoadedModel, ServerConfig, ServerState, ServerThread  # noqa: E402

LEVELS = (1, 2, 4, 8, 16)
TOPICS = ["a dragon", "the sea", "a robot", "a lighthouse", "a forest", "a city at night",
          "a train", "the moon", "a garden", "a mountain", "a library", "a storm",
          "a small boat", "a desert", "a clockmaker", "a winter village"]


def run_level(url: str, n: int, max_tokens: int, round_no: int) -> tuple[float, int]:
    """n concurrent requests; returns (aggregate completion tokens/s, tokens)."""
    tokens = [0] * n
    errors: list[str] = []
    barrier = threading.Barrier(n + 1)

    def client(i: int) -> None:
        body = {"messages": [{"role": "user", "content":
                              f"Write a long story about {TOPICS[i % len(TOPICS)]} "
                              f"(take {round_no})."}],
                "max_tokens": max_tokens, "temperature": 0}
        with httpx.Client(timeout=600) as c:
            barrier.wait()
            r = c.post(url + "/v1/chat/completions", json=body)
        if r.status_code != 200:
            errors.append(r.text)
            return
        tokens[i] = int(r.json()["usage"]["completion_tokens"])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"requests failed: {errors[:2]}")
    return sum(tokens) / dt, sum(tokens)


def runtime_decode_tps(model: Model, max_tokens: int) -> float:
    """What `candlewick run` achieves: engine.runtime's decode speed (wall clock)."""
    model.reset_cache()
    gen = model.generate([{"role": "user", "content": "Write a long story about a dragon."}],
                         SamplingParams(temperature=0.0, max_tokens=max_tokens))
    gen.consume()
    return gen.stats.gen_tps_wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--append", type=Path, default=None,
                    help="append the results as a section to this markdown file")
    args = ap.parse_args()
    path = bundled_default_model()
    if path is None:
        raise SystemExit("the bundled SmolLM2 model is not installed")

    n_slots = max(LEVELS)
    served = Model(path, LoadParams(n_ctx=512 * n_slots, n_seq_max=n_slots,
                                    n_threads=args.threads))
    single = Model(path, LoadParams(n_ctx=2048, n_threads=args.threads))
    loaded = LoadedModel.build(served, "smollm2", max_queue=64, embeddings=False)
    state = ServerState(ServerConfig(port=0, model_id="smollm2", max_tokens_cap=4096))
    state.set_loaded(loaded)
    results: dict[int, list[float]] = {n: [] for n in LEVELS}
    ref_run: list[float] = []
    single_decode: list[float] = []
    try:
        with ServerThread(state) as srv:
            run_level(srv.url, 2, 8, -1)  # warm-up
            for rnd in range(args.rounds):
                ref_run.append(runtime_decode_tps(single, args.max_tokens))
                for n in LEVELS:
                    tps, _ = run_level(srv.url, n, args.max_tokens, rnd)
                    results[n].append(tps)
                    print(f"round {rnd + 1}: {n:2d} concurrent -> {tps:6.1f} tok/s",
                          file=sys.stderr)
                # Single-request decode speed through the scheduler (same measure as run).
                got: list[float] = []
                ev = threading.Event()

                def on(e: object, got: list[float] = got, ev: threading.Event = ev) -> None:
                    from engine.scheduler import Finished

                    if isinstance(e, Finished):
                        st = e.stats
                        if st.completion_tokens > 1 and st.total_s > st.ttft_s:
                            got.append((st.completion_tokens - 1) / (st.total_s - st.ttft_s))
                        ev.set()

                prompt = served.chat_tokens([{"role": "user", "content":
                                              "Write a long story about a dragon."}])
                loaded.scheduler.submit(prompt, SamplingParams(temperature=0.0,
                                                               max_tokens=args.max_tokens), on)
                ev.wait()
                single_decode.extend(got)
    finally:
        loaded.close()
        served.close()
        single.close()

    med = {n: statistics.median(v) for n, v in results.items()}
    base = med[1]
    ref = statistics.median(ref_run)
    sched_single = statistics.median(single_decode)
    lines = [
        "",
        "## Local server: continuous batching throughput (SmolLM2-135M Q4_1)",
        "",
        f"Command: `.venv/bin/python benchmarks/server_throughput.py --max-tokens "
        f"{args.max_tokens} --rounds {args.rounds}`",
        "",
        f"Machine: {platform.machine()}, {args.threads} llama.cpp threads, 16 slots, "
        f"non-streaming chat requests over HTTP (127.0.0.1), {args.max_tokens} max new "
        f"tokens, greedy; median of {args.rounds} interleaved rounds. Aggregate throughput "
        "= completion tokens of all requests / wall time from the first request to the "
        "last answer (prompt processing included).",
        "",
        "| concurrent requests | aggregate tok/s | vs 1 request |",
        "|---:|---:|---:|",
    ]
    lines += [f"| {n} | {med[n]:.1f} | {med[n] / base:.2f}x |" for n in LEVELS]
    lines += [
        "",
        f"Single request, decode only: server scheduler {sched_single:.1f} tok/s vs "
        f"`candlewick run` (engine.runtime) {ref:.1f} tok/s in the same run: "
        f"{sched_single / ref:.2f}x.",
        f"Goal: 8 concurrent >= 1.6x single -> {'met' if med[8] / base >= 1.6 else 'NOT met'} "
        f"({med[8] / base:.2f}x); single within 5% of run -> "
        f"{'met' if sched_single >= 0.95 * ref else 'NOT met'}.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.append:
        with args.append.open("a", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
