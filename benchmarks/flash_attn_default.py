"""Flash attention on vs off on the CPU, at short and long chat histories: what decides the
CPU default of `--flash-attn auto` (engine.settings.resolve_flash_attn; issue #37).

For each history length (~100, ~2,000 and ~8,000 tokens by default) and each setting, a fresh
child process loads the model through the product's engine (engine.host.runtime.Model: the
decode loop a chat and the server use) with that flash-attention setting (it is fixed per
context) and measures, after a short warm-up:

- prefill: the history read as one chat prompt (tokens/s inside llama.cpp's decodes);
- decode: the reply that follows, up to `--tokens` greedy tokens (tokens/s between its first
  and last token, wall clock: what a reader of the stream sees);
- follow-up: a short next turn's time to first token, the history and reply already in the KV
  cache (only the new turn is read, at the full depth of the history).

Pairs alternate the order (on, off, off, on, ...); medians with min-max over `--pairs`, and
each figure's paired ratio on/off (for the time to first token off/on, so that above 1 means
flash attention is faster everywhere).

    .venv/bin/python benchmarks/flash_attn_default.py [--pairs 3] [--threads 2]
        [--histories 100,2000,7800] [--tokens 128] [--model PATH]
        [--write docs/benchmarks.md] > run1.json
    .venv/bin/python benchmarks/flash_attn_default.py --merge run1.json run2.json
        [--write docs/benchmarks.md]     # pool the pairs of several runs, measure nothing
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.services.library import bundled_default_model  # noqa: E402
from benchmarks.doc_tables import machine_line, replace_between  # noqa: E402
from engine.host.runtime import Model  # noqa: E402
from engine.settings import LoadParams, SamplingParams  # noqa: E402

MODES = ("on", "off")
TABLE = "flash-attn-default-table"  # the marked block --write replaces (one per kind of CPU)
START, END = f"<!-- {TABLE}:start -->", f"<!-- {TABLE}:end -->"
PARAGRAPH = (
    "The keeper climbed the spiral stairs each evening at dusk, trimmed the wick, polished "
    "the great lens and wound the clockwork that turned it. Ships counted the flashes to know "
    "which headland they were passing. "
)
ASK = "Write a long story about the keeper and a message in a bottle."
# Two next turns of the same length: one greedy, one at the chat's default sampling.
FOLLOW_UP_GREEDY = {"role": "user", "content": "Which detail in the notes matters most to sailors?"}
FOLLOW_UP_CHAT = {
    "role": "user",
    "content": "What did the keeper polish before the ships came past?",
}
# Figures and whether more is better; a ratio is always "on" over "off" in the better sense.
LABELS = {
    "prefill_tps": "prefill",
    "decode_tps": "decode",
    "follow_up_ttft_ms": "follow-up",
    "follow_up_greedy_ttft_ms": "greedy follow-up",
}
Runs = dict[int, dict[str, list[dict[str, Any]]]]  # history length -> mode -> one row a pair
METRICS = {
    "prefill_tps": True,
    "decode_tps": True,
    "follow_up_ttft_ms": False,
    "follow_up_greedy_ttft_ms": False,
}


def history(model: Model, n_tokens: int) -> list[dict[str, str]]:
    """A chat whose prompt is about `n_tokens` long: notes, then a request for a long story."""
    per = len(model.tokenize(PARAGRAPH, add_special=False))
    frame = len(model.chat_tokens([{"role": "user", "content": f"Notes.\n{ASK}"}]))
    body = "Notes. " + PARAGRAPH * max(1, (n_tokens - frame) // per)
    return [{"role": "user", "content": f"{body}\n{ASK}"}]


def child(
    path: Path, mode: str, n_history: int, n_ctx: int, threads: int, tokens: int
) -> dict[str, Any]:
    """One setting at one history length, in this (fresh) process."""
    params = LoadParams(n_ctx=n_ctx, n_threads=threads, flash_attn=mode)  # type: ignore[arg-type]
    with Model(path, params) as m:
        if m.flash_attn_on != (mode == "on"):
            raise SystemExit(f"flash attention asked {mode}, llama.cpp has {m.flash_attn_on}")
        greedy = SamplingParams(temperature=0, max_tokens=tokens)
        m.generate([{"role": "user", "content": "Say hello."}], greedy).consume()  # warm-up
        m.reset_cache()
        messages = history(m, n_history)
        first = m.generate(messages, greedy)
        reply = first.consume()
        answered = [*messages, {"role": "assistant", "content": reply}]
        # Greedy first: a reproducible request reads its prompt in canonical batches
        # (engine.host.batch_plan), so it reuses the cache only as far as the kernels allow;
        # the chat's default sampling (not reproducible) then reuses all it shares with it.
        greedy_turn = m.generate(
            [*answered, FOLLOW_UP_GREEDY], SamplingParams(temperature=0, max_tokens=1)
        )
        greedy_turn.consume()
        chat_turn = m.generate([*answered, FOLLOW_UP_CHAT], SamplingParams(max_tokens=1))
        chat_turn.consume()
        a, b, c = first.stats, chat_turn.stats, greedy_turn.stats
        return {
            "history_tokens": a.prompt_tokens,
            "prefill_tps": a.prompt_tps,
            "decode_tokens": a.gen_tokens,
            "decode_tps": a.gen_tps_wall,
            "follow_up_ttft_ms": b.ttft_s * 1000,
            "follow_up_tokens_read": b.n_prompt_eval,
            "follow_up_greedy_ttft_ms": c.ttft_s * 1000,
            "follow_up_greedy_tokens_read": c.n_prompt_eval,
            "follow_up_depth": b.prompt_tokens,
        }


def run_child(args: argparse.Namespace, path: Path, mode: str, n_history: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        mode,
        str(n_history),
        "--model",
        str(path),
        "--ctx",
        str(args.ctx),
        "--threads",
        str(args.threads),
        "--tokens",
        str(args.tokens),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"flash attention {mode}, {n_history} tokens: {tail}")
    row: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return row


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(runs: Runs) -> dict[str, Any]:
    """Per history: each mode's medians and spreads; paired ratios (> 1: flash attention on
    is better) and, per figure, which setting wins at every length ('mixed' otherwise)."""
    out: dict[str, Any] = {}
    wins: dict[str, set[str]] = {k: set() for k in METRICS}
    for n, by_mode in runs.items():
        row: dict[str, Any] = {"history_tokens": by_mode["on"][0]["history_tokens"]}
        for metric, higher in METRICS.items():
            on = [r[metric] for r in by_mode["on"]]
            off = [r[metric] for r in by_mode["off"]]
            ratios = [(x / y if higher else y / x) for x, y in zip(on, off, strict=True)]
            row[metric] = {"on": spread(on), "off": spread(off), "ratio": spread(ratios)}
            wins[metric].add("on" if statistics.median(ratios) >= 1 else "off")
        for key in ("follow_up_tokens_read", "follow_up_greedy_tokens_read"):
            row[key] = {m: max(r[key] for r in by_mode[m]) for m in MODES}
        row["decode_tokens"] = min(r["decode_tokens"] for m in MODES for r in by_mode[m])
        out[str(n)] = row
    return {
        "histories": out,
        "faster_at_every_length": {
            k: (v.pop() if len(v) == 1 else "mixed") for k, v in wins.items()
        },
    }


def table(summary: dict[str, Any], args: argparse.Namespace, model: str) -> str:
    def cell(s: dict[str, Any], metric: str, fmt: str, read: tuple[int, int] | None = None) -> str:
        on, off, r = s[metric]["on"], s[metric]["off"], s[metric]["ratio"]
        tokens = f" ({read[0]} / {read[1]})" if read else ""
        return (
            f"{on['median']:{fmt}} / {off['median']:{fmt}}{tokens} | **{r['median']:.2f}** "
            f"({r['min']:.2f}\u2013{r['max']:.2f})"
        )

    files = [Path(f).name for f in (args.merge or ())]
    run = (
        f".venv/bin/python benchmarks/flash_attn_default.py --pairs {args.run_pairs} "
        f"--threads {args.threads} --histories {args.histories} --tokens {args.tokens}"
    )
    commands = (
        [f"{run} > {name}" for name in files]
        + [f".venv/bin/python benchmarks/flash_attn_default.py --merge {' '.join(files)} "]
        if files
        else [f"{run} "]
    )
    commands[-1] += "--write docs/benchmarks.md"
    if getattr(args, "table", TABLE) != TABLE:
        commands[-1] += f" --table {args.table}"
    pooled = f" pooled from {len(files)} runs" if len(files) > 1 else ""
    lines = [
        "```\n" + "\n".join(commands) + "\n```",
        "",
        f"{model}, {args.threads} threads, n_ctx {args.ctx}, a fresh process per run, "
        f"{args.pairs} pairs alternating{pooled}; medians, on / off; ratio: paired median on "
        "over off (for the time to first token off over on: above 1, flash attention is faster), "
        "min\u2013max in brackets.",
        "",
        "| history (tokens) | prefill t/s | ratio | decode t/s | ratio "
        "| follow-up TTFT ms | ratio | greedy follow-up TTFT ms (tokens read) | ratio |",
        "|---:|---:|---|---:|---|---:|---|---:|---|",
    ]
    for s in summary["histories"].values():
        read = s["follow_up_greedy_tokens_read"]
        lines.append(
            f"| {s['history_tokens']:,} | {cell(s, 'prefill_tps', '.0f')} "
            f"| {cell(s, 'decode_tps', '.1f')} | {cell(s, 'follow_up_ttft_ms', '.0f')} "
            f"| {cell(s, 'follow_up_greedy_ttft_ms', '.0f', (read['on'], read['off']))} |"
        )
    wins = summary["faster_at_every_length"]
    lines += [
        "",
        "Faster at every length: " + ", ".join(f"{LABELS[k]}: {v}" for k, v in wins.items()) + ".",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--histories", default="100,2000,7800")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=8192, help="large enough for history + reply")
    ap.add_argument("--write", type=Path, default=None, help="replace the table in this doc")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "HISTORY"), help=argparse.SUPPRESS)
    ap.add_argument("--merge", nargs="+", type=Path, help="pool earlier runs' JSON outputs")
    ap.add_argument("--table", default=TABLE, help="the name of the marked table --write replaces")
    args = ap.parse_args()
    if args.merge:
        runs, meta = pooled(args.merge)
        args.threads, args.ctx, args.run_pairs = meta["threads"], meta["n_ctx"], meta["pairs"]
        args.histories = ",".join(str(n) for n in runs)
        name, machine = meta["model"], meta["machine"]
    else:
        path = Path(args.model) if args.model else bundled_default_model()
        if path is None:
            raise SystemExit("no model: pass --model or run `make setup`")
        if args.child:
            mode, n = args.child
            print(json.dumps(child(path, mode, int(n), args.ctx, args.threads, args.tokens)))
            return 0
        runs, name, machine, args.run_pairs = (
            measure(args, path),
            path.name,
            machine_line(),
            args.pairs,
        )
    args.pairs = len(next(iter(runs.values()))["on"])
    summary = summarise(runs)
    result = {
        "model": name,
        "threads": args.threads,
        "n_ctx": args.ctx,
        "pairs": args.pairs,
        "runs": {str(n): v for n, v in runs.items()},
        **summary,
        "machine": machine,
    }
    print(json.dumps(result, indent=1))
    if args.write:
        start, end = f"<!-- {args.table}:start -->", f"<!-- {args.table}:end -->"
        replace_between(args.write, start, end, f"{table(summary, args, name)}\n\n{machine}")
    return 0


def measure(args: argparse.Namespace, path: Path) -> Runs:
    lengths = [int(x) for x in args.histories.split(",")]
    runs: Runs = {n: {m: [] for m in MODES} for n in lengths}
    step = 0
    for _ in range(args.pairs):
        for n in lengths:
            order = MODES if step % 2 == 0 else MODES[::-1]  # on off, off on, ...
            step += 1
            for mode in order:
                row = run_child(args, path, mode, n)
                runs[n][mode].append(row)
                print(f"{mode:>3} {n:>5}: {json.dumps(row)}", file=sys.stderr, flush=True)
    return runs


def pooled(files: list[Path]) -> tuple[Runs, dict[str, Any]]:
    """The pairs of several runs (their JSON outputs) as one run's; the first run's settings
    and machine line (runs that differ in model, threads or context are refused)."""
    outputs = [json.loads(f.read_text("utf-8")) for f in files]
    first = outputs[0]
    runs: Runs = {}
    for out in outputs:
        for key in ("model", "threads", "n_ctx"):
            if out[key] != first[key]:
                raise SystemExit(f"the runs differ in {key}: {first[key]} vs {out[key]}")
        for n, by_mode in out["runs"].items():
            for m in MODES:
                runs.setdefault(int(n), {k: [] for k in MODES})[m] += by_mode[m]
    return runs, first


if __name__ == "__main__":
    sys.exit(main())
