"""`candlewick run` at its defaults against the tight C-API loop at llama.cpp's defaults.

Each pair starts two fresh processes, in alternating order: the `candlewick` command as a user
types it (`run default PROMPT --temperature 0 --max-tokens N --json`, its wall-clock rate
between the first and the last token, `gen_tps_wall`), and `host_clients.py child-decode --mode
llama`: llama.cpp's default context parameters (flash attention 'auto', the same context size
and threads), greedy sampling and `llama_decode` in a bare loop over a story opening. With
`--huge-pages-arm`, a third process per pair runs the command with CANDLEWICK_HUGE_PAGES=0.

    .venv/bin/python benchmarks/run_vs_loop.py [--pairs 5] [--tokens 256] [--huge-pages-arm]

The last line starts with SUMMARY: the median of the pairs' ratios and their spread (goal of
issue #37: >= 0.95).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_tables import machine_line
from host_clients import CHAT, child_rate, model_path

REPO = Path(__file__).resolve().parent.parent
CANDLEWICK = REPO / ".venv" / "bin" / "candlewick"
# What the command is asked: a request whose greedy reply runs the whole length (the story
# opening the loop continues ends after ~60 tokens as a chat reply, SmolLM2 on the project's
# build).
RUN_PROMPT = CHAT[0]["content"]


def run_command(tokens: int, huge_pages: bool) -> tuple[float, bool]:
    """The command's wall-clock tok/s, and whether it ran with huge pages."""
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if not huge_pages:
        env["CANDLEWICK_HUGE_PAGES"] = "0"
    cmd = [str(CANDLEWICK), "run", "default", RUN_PROMPT, "--temperature", "0"]
    cmd += ["--max-tokens", str(tokens), "--json"]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, timeout=600, env=env, cwd=Path.home()
    )
    reply = json.loads(out.stdout)
    if not huge_pages and reply["huge_pages"]:
        raise SystemExit("CANDLEWICK_HUGE_PAGES=0 did not keep run from huge pages")
    if reply["gen_tokens"] != tokens:
        raise SystemExit(f"run stopped after {reply['gen_tokens']} of {tokens} tokens")
    return float(reply["gen_tps_wall"]), bool(reply["huge_pages"])


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--huge-pages-arm", action="store_true")
    args = ap.parse_args()
    model = model_path(None)
    arms: dict[str, list[float]] = {"run": [], "loop": []}
    if args.huge_pages_arm:
        arms["run, huge pages off"] = []
    load = [os.getloadavg()[0]]
    huge: set[bool] = set()
    for i in range(args.pairs):
        order = list(arms) if i % 2 == 0 else list(reversed(arms))
        for arm in order:
            if arm == "loop":
                rate = child_rate(model, "llama", args.tokens, repeat=1)
            else:
                rate, used = run_command(args.tokens, huge_pages=arm == "run")
                if arm == "run":
                    huge.add(used)
            arms[arm].append(rate)
        line = ", ".join(f"{a} {v[-1]:.1f}" for a, v in arms.items())
        print(f"pair {i + 1}/{args.pairs}: {line} tok/s", file=sys.stderr)
    load.append(os.getloadavg()[0])
    # On a machine where they cannot help (docs/memory.md), `run` runs without them too.
    print(
        json.dumps({"tok_s": arms, "load_average": load, "run_huge_pages": sorted(huge)}, indent=1)
    )
    print(machine_line())
    for arm in arms:
        if arm == "loop":
            continue
        ratios = [a / b for a, b in zip(arms[arm], arms["loop"], strict=True)]
        print(
            f"SUMMARY {arm} / tight loop: median {statistics.median(ratios):.3f} "
            f"(pairs {min(ratios):.3f}-{max(ratios):.3f}); run {statistics.median(arms[arm]):.1f}"
            f", loop {statistics.median(arms['loop']):.1f} tok/s; load {load[0]:.1f}-{load[1]:.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
