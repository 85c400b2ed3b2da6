"""Aggregate generation throughput of the local server at 1, 2, 4, 8, 16 concurrent requests.

Runs the real HTTP server (continuous batching, 16 slots) on SmolLM2 in this process and sends
non-streaming chat requests from client threads. The references are measured in the same run:
the single-request throughput through the same server; raw llama.cpp batched decoding of the
same prompts (one `llama_decode` per step over all sequences, greedy, no HTTP, no scheduler) on
a context of its own with the same weights and threads, which is what batching can give at
best; and the decode speed of `candlewick run` (engine.host.runtime on its own context). Rounds are
interleaved so that a noisy machine affects every level alike; medians are reported.

    .venv/bin/python benchmarks/server_throughput.py [--max-tokens 96] [--rounds 3]
        [--flash-attn off|on|auto] [--append docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.services.library import bundled_default_model  # noqa: E402
from engine.host.requests import Event, Finished  # noqa: E402
from engine.host.runtime import Model  # noqa: E402
from engine.native import llama_lib  # noqa: E402
from engine.server import ServedModel, ServerConfig, ServerState, ServerThread  # noqa: E402
from engine.settings import FlashAttn, LoadParams, SamplingParams  # noqa: E402

LEVELS = (1, 2, 4, 8, 16)
TOPICS = [
    "a dragon",
    "the sea",
    "a robot",
    "a lighthouse",
    "a forest",
    "a city at night",
    "a train",
    "the moon",
    "a garden",
    "a mountain",
    "a library",
    "a storm",
    "a small boat",
    "a desert",
    "a clockmaker",
    "a winter village",
]


def run_level(url: str, n: int, max_tokens: int, round_no: int) -> tuple[float, int]:
    """n concurrent requests; returns (aggregate completion tokens/s, tokens)."""
    tokens = [0] * n
    errors: list[str] = []
    barrier = threading.Barrier(n + 1)

    def client(i: int) -> None:
        body = {
            "messages": [
                {
                    "role": "user",
                    "content": f"Write a long story about {TOPICS[i % len(TOPICS)]} "
                    f"(take {round_no}).",
                }
            ],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
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


def prompt_for(model: Model, i: int, round_no: int) -> list[int]:
    return model.chat_tokens(
        [
            {
                "role": "user",
                "content": f"Write a long story about {TOPICS[i % len(TOPICS)]} (take {round_no}).",
            }
        ]
    )


def raw_batched_tps(model: Model, n: int, max_tokens: int, round_no: int) -> float:
    """llama.cpp alone: prefill n prompts, then one llama_decode per step for all n sequences
    (greedy, EOG ignored). Aggregate tokens/s, prompt processing included, like the server."""
    C = llama_lib.lib()
    ctx = model.ctx_ptr
    C.llama_memory_clear(C.llama_get_memory(ctx), True)
    prompts = [prompt_for(model, i, round_no) for i in range(n)]
    n_batch = model.params.n_batch
    b = C.llama_batch_init(n_batch, 0, 1)
    smp = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
    C.llama_sampler_chain_add(smp, C.llama_sampler_init_greedy())
    try:
        t0 = time.perf_counter()
        first: dict[int, int] = {}  # each sequence's first sampled token
        row: dict[int, int] = {}  # sequence -> its logits row in the current batch
        k = 0
        work = [(s, j, t) for s, p in enumerate(prompts) for j, t in enumerate(p)]
        for idx, (s, j, t) in enumerate(work):
            last = j == len(prompts[s]) - 1
            b.token[k], b.pos[k], b.n_seq_id[k], b.logits[k] = t, j, 1, last
            b.seq_id[k][0] = s
            if last:
                row[s] = k
            k += 1
            if k == n_batch or idx == len(work) - 1:
                b.n_tokens = k
                if C.llama_decode(ctx, b) != 0:
                    raise SystemExit("raw prefill failed")
                for s2, r in row.items():
                    first[s2] = int(C.llama_sampler_sample(smp, ctx, r))
                row = {}
                k = 0
        pos = [len(p) for p in prompts]
        cur = [first[s] for s in range(n)]
        for _ in range(max_tokens - 1):
            for s in range(n):
                b.token[s], b.pos[s], b.n_seq_id[s], b.logits[s] = cur[s], pos[s], 1, True
                b.seq_id[s][0] = s
                pos[s] += 1
            b.n_tokens = n
            if C.llama_decode(ctx, b) != 0:
                raise SystemExit("raw decode failed")
            cur = [int(C.llama_sampler_sample(smp, ctx, s)) for s in range(n)]
        return n * max_tokens / (time.perf_counter() - t0)
    finally:
        C.llama_sampler_free(smp)
        C.llama_batch_free(b)


def runtime_decode_tps(model: Model, max_tokens: int) -> float:
    """What `candlewick run` achieves: engine.host.runtime's decode speed (wall clock)."""
    model.reset_cache()
    gen = model.generate(
        [{"role": "user", "content": "Write a long story about a dragon."}],
        SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )
    gen.consume()
    return gen.stats.gen_tps_wall


def scheduler_decode_tps(loaded: ServedModel, model: Model, max_tokens: int) -> float:
    """One request alone through the scheduler, decode speed measured like `run` does."""
    done = threading.Event()
    out: list[float] = []

    def on(e: Event) -> None:
        if isinstance(e, Finished):
            st = e.stats
            if st.gen_tokens > 1 and st.total_s > st.ttft_s:
                out.append((st.gen_tokens - 1) / (st.total_s - st.ttft_s))
            done.set()

    prompt = model.chat_tokens([{"role": "user", "content": "Write a long story about a dragon."}])
    loaded.scheduler.submit(
        prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens), on, stream=False
    )
    done.wait()
    return out[0] if out else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=7, help="runtime/scheduler single-request pairs")
    ap.add_argument(
        "--flash-attn",
        choices=("off", "on", "auto"),
        default="auto",
        help="flash attention for every context here (auto = the engine's default)",
    )
    ap.add_argument(
        "--server-only",
        action="store_true",
        help="only the server in this process; `candlewick run` as a separate "
        "process for the single-request reference (see server_only())",
    )
    ap.add_argument(
        "--append",
        type=Path,
        default=None,
        help="append the results as a section to this markdown file",
    )
    args = ap.parse_args()
    path = bundled_default_model()
    if path is None:
        raise SystemExit("the bundled SmolLM2 model is not installed")

    if args.server_only:
        return server_only(path, args)
    n_slots = max(LEVELS)
    fa: FlashAttn = args.flash_attn
    batched = LoadParams(
        n_ctx=512 * n_slots, n_seq_max=n_slots, n_threads=args.threads, flash_attn=fa
    )
    served = Model(path, batched)
    raw = Model(path, batched)  # same settings, driven by hand: the llama.cpp reference
    single = Model(path, LoadParams(n_ctx=2048, n_threads=args.threads, flash_attn=fa))
    loaded = ServedModel.build(served, "smollm2", max_queue=64, embeddings=False)
    state = ServerState(ServerConfig(port=0, model_id="smollm2", max_tokens_cap=4096))
    state.set_loaded(loaded)
    results: dict[int, list[float]] = {n: [] for n in LEVELS}
    raw_res: dict[int, list[float]] = {n: [] for n in LEVELS}
    # Tokens per CPU-second of this whole process (server, clients and llama.cpp threads):
    # less sensitive to other jobs on the machine than wall time, though spinning threads
    # and shared caches still move it.
    cpu_srv: dict[int, list[float]] = {n: [] for n in LEVELS}
    cpu_raw: dict[int, list[float]] = {n: [] for n in LEVELS}
    ref_run: list[float] = []  # runtime (what `candlewick run` does), paired ...
    single_decode: list[float] = []  # ... with the scheduler, one request alone
    try:
        with ServerThread(state) as srv:
            run_level(srv.url, 2, 8, -1)  # warm-up
            for rnd in range(args.rounds):
                for n in LEVELS:
                    c0 = time.process_time()
                    tps, toks = run_level(srv.url, n, args.max_tokens, rnd)
                    cpu_srv[n].append(toks / (time.process_time() - c0))
                    results[n].append(tps)
                    c0 = time.process_time()
                    raw_tps = raw_batched_tps(raw, n, args.max_tokens, rnd)
                    cpu_raw[n].append(n * args.max_tokens / (time.process_time() - c0))
                    raw_res[n].append(raw_tps)
                    print(
                        f"round {rnd + 1}: {n:2d} concurrent -> {tps:6.1f} tok/s "
                        f"(raw llama.cpp {raw_tps:6.1f}); per CPU-s {cpu_srv[n][-1]:6.1f} "
                        f"(raw {cpu_raw[n][-1]:6.1f})",
                        file=sys.stderr,
                    )
            # Single-request decode speed: scheduler and runtime back to back, several pairs,
            # so both see the same machine load; the median of the paired ratios is reported.
            for _ in range(args.pairs):
                ref_run.append(runtime_decode_tps(single, args.max_tokens))
                single_decode.append(scheduler_decode_tps(loaded, served, args.max_tokens))
    finally:
        loaded.close()
        served.close()
        raw.close()
        single.close()

    med = {n: statistics.median(v) for n, v in results.items()}
    rmed = {n: statistics.median(v) for n, v in raw_res.items()}
    # Same-round ratios: each round's level against that round's single request.
    ratio_srv = {
        n: statistics.median(a / b for a, b in zip(results[n], results[1], strict=True))
        for n in LEVELS
    }
    ratio_raw = {
        n: statistics.median(a / b for a, b in zip(raw_res[n], raw_res[1], strict=True))
        for n in LEVELS
    }
    cpu_ratio_srv = {
        n: statistics.median(a / b for a, b in zip(cpu_srv[n], cpu_srv[1], strict=True))
        for n in LEVELS
    }
    cpu_ratio_raw = {
        n: statistics.median(a / b for a, b in zip(cpu_raw[n], cpu_raw[1], strict=True))
        for n in LEVELS
    }
    ref = statistics.median(ref_run)
    sched_single = statistics.median(single_decode)
    ratio = statistics.median(a / b for a, b in zip(single_decode, ref_run, strict=True))
    lines = [
        "",
        "## Local server: continuous batching throughput (SmolLM2-135M Q4_1)",
        "",
        f"Command: `.venv/bin/python benchmarks/server_throughput.py --max-tokens "
        f"{args.max_tokens} --rounds {args.rounds} --pairs {args.pairs} --threads "
        f"{args.threads} --flash-attn {args.flash_attn}`",
        "",
        f"Machine: {platform.machine()}, {args.threads} llama.cpp threads, 16 slots, "
        f"non-streaming chat requests over HTTP (127.0.0.1), {args.max_tokens} max new "
        f"tokens, greedy; median of {args.rounds} interleaved rounds. Aggregate throughput "
        "= completion tokens of all requests / wall time from the first request to the "
        "last answer (prompt processing included). Raw llama.cpp: the same prompts and "
        "token counts decoded by hand in one batch per step on a context with the same "
        "settings, no HTTP and no scheduler (no prefix reuse either). Ratios are medians of "
        "each round's level / that round's single request.",
        "",
        "| concurrent requests | server tok/s | vs 1 request | raw llama.cpp tok/s "
        "| raw vs 1 | server / raw | server tok/CPU-s vs 1 | raw tok/CPU-s vs 1 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {n} | {med[n]:.1f} | {ratio_srv[n]:.2f}x | {rmed[n]:.1f} | "
        f"{ratio_raw[n]:.2f}x | {med[n] / rmed[n]:.2f} | {cpu_ratio_srv[n]:.2f}x | "
        f"{cpu_ratio_raw[n]:.2f}x |"
        for n in LEVELS
    ]
    lines += [
        "",
        f"Single request, decode only ({args.pairs} back-to-back pairs, medians): server "
        f"scheduler {sched_single:.1f} tok/s, `candlewick run` (engine.host.runtime) {ref:.1f} "
        f"tok/s; median paired ratio {ratio:.2f}x.",
        f"Goal: 8 concurrent >= 1.6x single -> "
        f"{'met' if ratio_srv[8] >= 1.6 else 'NOT met'} ({ratio_srv[8]:.2f}x; raw llama.cpp "
        f"{ratio_raw[8]:.2f}x in the same run); single within 5% of run -> "
        f"{'met' if ratio >= 0.95 else 'NOT met'} ({ratio:.2f}x).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.append:
        with args.append.open("a", encoding="utf-8") as f:
            f.write(text)
    return 0


def run_cli_decode_tps(max_tokens: int, threads: int, flash_attn: str) -> float:
    """`candlewick run` itself, in its own process: its wall-clock decode speed."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "run",
            "default",
            "Write a long story about a dragon.",
            "--max-tokens",
            str(max_tokens),
            "--threads",
            str(threads),
            "--temperature",
            "0",
            "--flash-attn",
            flash_attn,
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return float(json.loads(out.stdout)["gen_tps_wall"])


def server_only(path: Path, args: argparse.Namespace) -> int:
    """The server alone in this process, as `candlewick serve` runs.

    llama.cpp's CPU backend uses OpenMP, and libgomp gives every OS thread that calls into it
    its own team of worker threads. Once a process has more such workers than cores (here: the
    scheduler thread's team plus a reference model driven from the main thread), libgomp stops
    letting idle workers spin and every decode pays for waking them: on 2 cores a model that
    decodes ~70 tok/s alone fell to ~22 tok/s. The default mode keeps its references in-process
    (so its absolute figures are depressed); this mode measures the server by itself and
    `candlewick run` in a process of its own.
    """
    n_slots = max(LEVELS)
    fa: FlashAttn = args.flash_attn
    served = Model(
        path,
        LoadParams(n_ctx=512 * n_slots, n_seq_max=n_slots, n_threads=args.threads, flash_attn=fa),
    )
    loaded = ServedModel.build(served, "smollm2", max_queue=64, embeddings=False)
    state = ServerState(ServerConfig(port=0, model_id="smollm2", max_tokens_cap=4096))
    state.set_loaded(loaded)
    results: dict[int, list[float]] = {n: [] for n in LEVELS}
    ref_run: list[float] = []
    single_decode: list[float] = []
    try:
        with ServerThread(state) as srv:
            run_level(srv.url, 2, 8, -1)  # warm-up
            for rnd in range(args.rounds):
                for n in LEVELS:
                    results[n].append(run_level(srv.url, n, args.max_tokens, rnd)[0])
                    print(
                        f"round {rnd + 1}: {n:2d} concurrent -> {results[n][-1]:6.1f} tok/s",
                        file=sys.stderr,
                    )
            for _ in range(args.pairs):
                ref_run.append(run_cli_decode_tps(args.max_tokens, args.threads, fa))
                single_decode.append(scheduler_decode_tps(loaded, served, args.max_tokens))
    finally:
        loaded.close()
        served.close()
    med = {n: statistics.median(v) for n, v in results.items()}
    ratio_srv = {
        n: statistics.median(a / b for a, b in zip(results[n], results[1], strict=True))
        for n in LEVELS
    }
    ratio = statistics.median(a / b for a, b in zip(single_decode, ref_run, strict=True))
    lines = [
        "",
        "## Local server alone: continuous batching throughput (SmolLM2-135M Q4_1)",
        "",
        f"Command: `.venv/bin/python benchmarks/server_throughput.py --server-only --max-tokens "
        f"{args.max_tokens} --rounds {args.rounds} --pairs {args.pairs} --threads "
        f"{args.threads} --flash-attn {args.flash_attn}`",
        "",
        f"Machine: {platform.machine()}, {args.threads} llama.cpp threads, {n_slots} slots, "
        f"non-streaming chat requests over HTTP (127.0.0.1), {args.max_tokens} max new tokens, "
        f"greedy; median of {args.rounds} interleaved rounds; nothing else in the process "
        "calls llama.cpp. Ratios are medians of each round's level / that round's single "
        "request.",
        "",
        "| concurrent requests | server tok/s | vs 1 request |",
        "|---:|---:|---:|",
    ]
    lines += [f"| {n} | {med[n]:.1f} | {ratio_srv[n]:.2f}x |" for n in LEVELS]
    lines += [
        "",
        f"Single request, decode only ({args.pairs} pairs): server scheduler "
        f"{statistics.median(single_decode):.1f} tok/s, `candlewick run` in its own process "
        f"{statistics.median(ref_run):.1f} tok/s; median paired ratio {ratio:.2f}x.",
        f"Goal: 8 concurrent >= 1.6x single -> "
        f"{'met' if ratio_srv[8] >= 1.6 else 'NOT met'} ({ratio_srv[8]:.2f}x); single within "
        f"5% of run -> {'met' if ratio >= 0.95 else 'NOT met'} ({ratio:.2f}x).",
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
