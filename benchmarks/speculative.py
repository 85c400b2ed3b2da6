"""Speculative decoding vs plain decoding on a workload whose answers quote the prompt.

Extraction and summarisation requests (copy the action items, list the ingredients, quote the
sentences about X, rewrite a function with one change, answer from a passage): real requests
with an instruction, whose answers repeat spans of the prompt, which is where prompt lookup
drafting pays. Greedy, all arms measured prompt by prompt and alternating run by run (each run
loads every configuration once; every other run in reversed order), so drift on a noisy machine
hits them alike; the two exact arms share one model and take turns within it. Generation speed is
wall-clock tokens/s from the first generated token to the last (the cache is reset before every
run, so all arms do the same prefill).

Every loaded model has its own decode thread (`model.loop`), and each thread that calls
llama.cpp gets its own OpenMP team: with more workers than cores libgomp stops letting them
spin and every decode slows down several times (docs/benchmarks.md, "Local server"). So only
one model (with its draft model, which runs on the target's thread) is loaded at a time: each
configuration is loaded for a prompt, measured, and closed before the next one.

Two configurations, each measured plain and with prompt lookup:
- app: what a user gets. Plain decoding with the default load settings; lookup with the
  default settings plus `speculative=lookup`, so the engine resolves flash attention and AMX
  as it does for the app (flash attention is forced on for exactness only where the weight
  kernels allow exactness, i.e. without AMX).
- exact: no AMX weights and flash attention on, where llama.cpp's CPU kernels give a token
  the same logits alone and in a batch, so lookup's text must be plain's ("same text"). One
  model, loaded with `speculative=lookup`; its plain arm asks for `spec="off"` per request.
- draft (app settings), with `--draft PATH`: the default settings plus
  `speculative=draft` with that draft model (loaded by the target).

    .venv/bin/python benchmarks/speculative.py [--model default] [--runs 3] [--threads 2]
    .venv/bin/python benchmarks/speculative.py --write    # also update docs/speculative.md
    .venv/bin/python benchmarks/speculative.py --server --write   # through the scheduler
    .venv/bin/python benchmarks/speculative.py --concurrency 1,4,8 [--write]

`--concurrency`: several requests in flight at once through one loop (as the server makes
them, greedy), the same requests with and without lookup, arms alternating round by round:
every slot whose request drafts verifies its drafts in the step it shares with the others,
and the loop drafts at a level only while that measures faster (engine.host.draft_gain).
Throughput is completion tokens over the wall time from the first request in to the last
out; "measured gain" is the loop's own figure at that level when the lookup rounds ended.

The last lines start with SUMMARY.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_tables import machine_line, replace_between

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from engine.host.requests import Event, Piece
from engine.host.runtime import Model
from engine.settings import LoadParams, SamplingParams, SpecMode, SpeculativeSettings

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "speculative.md"
BENCH_DOC = REPO / "docs" / "benchmarks.md"  # the per-concurrency table
START, END = "<!-- speculative-table:start -->", "<!-- speculative-table:end -->"
SERVER_START = "<!-- speculative-server-table:start -->"
SERVER_END = "<!-- speculative-server-table:end -->"
LEVELS_START = "<!-- speculative-concurrency-table:start -->"
LEVELS_END = "<!-- speculative-concurrency-table:end -->"

NOTES = """Meeting notes, platform team, 14 March

Attendees: Priya, Tomasz, Leila, Ahmed.

Decisions:
- The release branch is cut on Thursday at noon.
- Nightly builds move from the old runner to the new build farm.
- The legacy export API stays until the end of the quarter.

Action items:
- Priya will update the deployment guide with the new runner names.
- Tomasz will migrate the nightly build jobs to the build farm by Wednesday.
- Leila will write the announcement for the export API deprecation.
- Ahmed will review the open security reports before the release.

Next meeting: 21 March, same room."""

ARTICLE = """The city council approved the new cycling plan on Monday evening after a two-hour
debate. The plan adds 40 kilometres of protected bike lanes over the next three years, starting
with the bridge corridor and the route between the central station and the university campus.
The council also agreed to convert 300 car parking spaces into bicycle parking near the market
square. Funding comes from the regional transport budget and a national grant for sustainable
mobility. Opponents argued that shop owners on the market square were not consulted, and the
council promised a public hearing in May before any parking spaces are removed. Construction
of the first section is expected to begin in September."""

CODE = """def parse_config(path):
    with open(path) as f:
        data = json.load(f)
    if "name" not in data:
        raise ValueError("config needs a name")
    data.setdefault("port", 8080)
    data.setdefault("debug", False)
    return data"""

RECIPE = """Lemon pasta (serves 2)

Ingredients:
- 200 g spaghetti
- 2 tablespoons olive oil
- 1 clove of garlic, finely chopped
- the zest and juice of one lemon
- 40 g grated parmesan
- a handful of fresh basil leaves
- salt and black pepper

Cook the spaghetti in salted water until al dente. Warm the olive oil in a pan, add the garlic
and cook for one minute. Stir in the lemon zest and juice, then the drained pasta and the
parmesan. Season with salt and pepper and finish with the basil."""

EMAIL = """Hi all,

A quick update on the conference trip. The flights are booked: we leave Berlin on Tuesday
9 June at 07:40 and arrive in Lisbon at 10:05. The hotel is the Casa Azul on Rua das Flores,
check-in from 14:00. The workshop runs on Wednesday and Thursday in hall B of the congress
centre, and the team dinner is on Thursday at 20:00 at a restaurant near the river. We fly
back on Friday 12 June at 16:30.

Best,
Marta"""

CODE2 = """def total_price(items, tax_rate):
    total = 0
    for item in items:
        total += item.price * item.quantity
    total = total * (1 + tax_rate)
    return round(total, 2)"""

PROMPTS: list[tuple[str, str]] = [
    ("action items", NOTES + "\n\nCopy the action items from these notes exactly, one per line."),
    ("decisions", NOTES + "\n\nList the decisions from the notes, word for word."),
    (
        "quote",
        ARTICLE + "\n\nQuote the sentences of the article about parking spaces and "
        "funding exactly.",
    ),
    ("summary", ARTICLE + "\n\nSummarise the article in three sentences, reusing its wording."),
    (
        "code edit",
        CODE + "\n\nRewrite this function with the default port changed to 9090. "
        "Show the whole function.",
    ),
    ("ingredients", RECIPE + "\n\nList the ingredients of this recipe."),
    (
        "email facts",
        EMAIL + "\n\nExtract the travel dates, times and places from this email as a list.",
    ),
    ("rename", CODE2 + "\n\nRewrite this function with the variable `total` renamed to `amount`."),
    (
        "rag answer",
        "Answer the question using only the passage.\n\nPassage: "
        + ARTICLE
        + "\n\nQuestion: What will happen to the parking spaces near the market square?",
    ),
]


CLOCK = time.perf_counter
Arm = Callable[[str, int], dict[str, Any]]


def run_once(
    model: Model, prompt: str, max_tokens: int, spec: SpecMode | None = None
) -> dict[str, Any]:
    """One chat request (as the app makes it) through the model's decode loop; `spec`: the
    request's speculative decoding (None: the model's own setting)."""
    model.reset_cache()
    gen = model.generate(
        [{"role": "user", "content": prompt}],
        SamplingParams(temperature=0, max_tokens=max_tokens),
        spec=spec,
    )
    t_first = None
    n_first = 0
    for _ in gen:
        if t_first is None:
            t_first = CLOCK()
            n_first = len(gen.tokens)
    t_end = CLOCK()
    st = gen.stats
    n = len(gen.tokens) - n_first
    tps = n / (t_end - t_first) if t_first is not None and t_end > t_first and n > 0 else 0.0
    return {
        "tps": tps,
        "tokens": len(gen.tokens),
        "text": gen.text,
        "drafted": st.draft_tokens,
        "accepted": st.draft_accepted,
    }


def run_server_once(model: Model, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One request as the HTTP server makes it (not interactive: the prompt is read as the API
    reads it) through the model's decode loop (one slot): speed from its first text piece to
    its end, as a client sees it."""
    first: list[float] = []

    def on_event(ev: Event) -> None:
        if isinstance(ev, Piece) and not first:
            first.append(CLOCK())

    model.reset_cache()
    req = model.loop.submit(
        model.chat_tokens([{"role": "user", "content": prompt}]),
        SamplingParams(temperature=0, max_tokens=max_tokens),
        on_event,
    )
    if not req.done.wait(600):
        raise SystemExit("a server request did not finish")
    t_end = CLOCK()
    st = req.stats
    n = st.gen_tokens - 1
    tps = n / (t_end - first[0]) if first and t_end > first[0] and n > 0 else 0.0
    return {
        "tps": tps,
        "tokens": st.gen_tokens,
        "text": req.text,
        "drafted": st.draft_tokens,
        "accepted": st.draft_accepted,
    }


def median_tps(rs: list[dict[str, Any]]) -> float:
    return float(statistics.median(r["tps"] for r in rs))


def ratios(results: dict[str, dict[str, list[dict[str, Any]]]], arm: str, ref: str) -> list[float]:
    return [median_tps(r[arm]) / median_tps(r[ref]) for r in results.values()]


def acceptance(rs: list[dict[str, Any]]) -> tuple[int, int]:
    return sum(r["accepted"] for r in rs), sum(r["drafted"] for r in rs)


def _same(r: dict[str, list[dict[str, Any]]], arm: str, ref: str) -> bool:
    return all(x["text"] == r[ref][0]["text"] for x in r[arm])


def table(
    results: dict[str, dict[str, list[dict[str, Any]]]],
    spec_arms: list[str],
    command: str,
    settings: str,
) -> str:
    cols = ["plain t/s", *(f"{a} t/s" for a in spec_arms)]
    heads = [
        *cols,
        *(h for a in spec_arms for h in (f"{a} speed-up", f"{a} acceptance")),
        "same text",
        "exact: plain t/s",
        "exact: lookup t/s",
        "exact: speed-up",
        "exact: same text",
    ]
    out = [
        f"`{command}`",
        "",
        settings,
        "",
        "| prompt | " + " | ".join(heads) + " |",
        "|---|" + "---:|" * len(heads),
    ]
    for name, r in results.items():
        cells = [f"{median_tps(r[a]):.1f}" for a in ("plain", *spec_arms)]
        for a in spec_arms:
            acc, dr = acceptance(r[a])
            cells += [
                f"{median_tps(r[a]) / median_tps(r['plain']):.2f}",
                f"{acc}/{dr} = {acc / max(1, dr):.0%}",
            ]
        cells.append("yes" if all(_same(r, a, "plain") for a in spec_arms) else "no")
        cells += [
            f"{median_tps(r['plain exact']):.1f}",
            f"{median_tps(r['lookup exact']):.1f}",
            f"{median_tps(r['lookup exact']) / median_tps(r['plain exact']):.2f}",
            "yes" if _same(r, "lookup exact", "plain exact") else "no",
        ]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append("")
    out.extend(summary(results, a, "plain") for a in spec_arms)
    out.append(summary(results, "lookup exact", "plain exact"))
    return "\n".join(out)


def summary(results: dict[str, dict[str, list[dict[str, Any]]]], arm: str, ref: str) -> str:
    rs = ratios(results, arm, ref)
    acc, dr = acceptance([x for r in results.values() for x in r[arm]])
    same = sum(_same(r, arm, ref) for r in results.values())
    return (
        f"SUMMARY {arm}: x{statistics.geometric_mean(rs):.2f} geometric mean vs {ref} "
        f"(best x{max(rs):.2f}, worst x{min(rs):.2f}); acceptance {acc}/{dr} = "
        f"{acc / max(1, dr):.0%}; same text as {ref} in {same} of {len(results)} prompts"
    )


def describe(m: Model) -> str:
    amx = "AMX weights" if m.amx_weights else "no AMX weights"
    flash = next(
        (x.split("=", 1)[1].strip() for x in m.load_info.log if "flash_attn " in x and "=" in x),
        "?",
    )
    return f"{amx}, flash attention {flash}"


def command_line() -> str:
    """The command as recorded in the docs: without output options."""
    shown: list[str] = []
    skip = False
    for a in sys.argv[1:]:
        if skip or a == "--write":
            skip = False
            continue
        if a == "--json":
            skip = True
            continue
        if not a.startswith("--json="):
            shown.append(a)
    return " ".join(["benchmarks/speculative.py", *shown])


def server_main(args: argparse.Namespace, path: Path) -> int:
    """Plain and lookup as the server makes requests, one model (one decode loop) at a time.

    Not in the same process as the other arms, and never two decode loops at once: each OS
    thread that calls llama.cpp gets its own OpenMP team, and with more workers than cores
    libgomp stops letting them spin, which slows every decode several times over
    (docs/benchmarks.md, "Local server")."""
    prompts = [(n, p) for n, p in PROMPTS if args.only is None or n in args.only.split(",")]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {n: {} for n, _ in prompts}
    for arm_name, spec in (
        ("server plain", None),
        ("server lookup", SpeculativeSettings("lookup", draft_max=args.draft_max)),
    ):
        params = LoadParams(
            n_ctx=args.ctx, n_threads=args.threads, state_cache_mb=0, speculative=spec
        )
        with Model(path, params) as m:  # n_seq_max 1: its loop has one slot
            for name, prompt in prompts:
                run_server_once(m, prompt, 8)  # warm-up
                results[name][arm_name] = [
                    run_server_once(m, prompt, args.max_tokens) for _ in range(args.runs)
                ]
                print(
                    f"{name:13s} {arm_name} {median_tps(results[name][arm_name]):6.1f} t/s",
                    flush=True,
                )
    out = [
        f"`{command_line()}`",
        "",
        "| prompt | server plain t/s | server lookup t/s | speed-up | acceptance | same text |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        acc, dr = acceptance(r["server lookup"])
        out.append(
            f"| {name} | {median_tps(r['server plain']):.1f} | "
            f"{median_tps(r['server lookup']):.1f} | "
            f"{median_tps(r['server lookup']) / median_tps(r['server plain']):.2f} | "
            f"{acc}/{dr} = {acc / max(1, dr):.0%} | "
            f"{'yes' if _same(r, 'server lookup', 'server plain') else 'no'} |"
        )
    out += ["", summary(results, "server lookup", "server plain")]
    text = "\n".join(out)
    print()
    text = f"{text}\n\n{machine_line()}"  # which CPU: kernels differ
    print(text)
    if args.write:
        replace_between(DOC, SERVER_START, SERVER_END, text)
    return 0


def run_round(
    model: Model, level: int, spec: SpecMode, max_tokens: int, first: int
) -> dict[str, Any]:
    """`level` requests submitted at once (prompts `first`, `first` + 1, ... of PROMPTS) as the
    server makes them; completion tokens over the wall time of the whole round."""
    chats = [
        model.chat_tokens([{"role": "user", "content": PROMPTS[(first + i) % len(PROMPTS)][1]}])
        for i in range(level)
    ]
    model.reset_cache()
    t0 = time.perf_counter()
    reqs = [
        model.loop.submit(
            c, SamplingParams(temperature=0, max_tokens=max_tokens), lambda _ev: None, spec=spec
        )
        for c in chats
    ]
    for r in reqs:
        if not r.done.wait(900):
            raise SystemExit("a request did not finish")
    wall = time.perf_counter() - t0
    gains = [r.stats.draft_gain for r in reqs if r.stats.draft_gain is not None]
    return {
        "tps": sum(r.stats.gen_tokens for r in reqs) / wall,
        "tokens": sum(r.stats.gen_tokens for r in reqs),
        "texts": [r.text for r in reqs],
        "drafted": sum(r.stats.draft_tokens for r in reqs),
        "accepted": sum(r.stats.draft_accepted for r in reqs),
        "gain": gains[-1] if gains else None,
    }


def concurrency_main(args: argparse.Namespace, path: Path) -> int:
    """Plain vs lookup at each concurrency level, one model (one loop) with a slot per
    request of the largest level; arms alternate round by round, which goes first too."""
    from engine.bench.levels import parse_levels

    levels = parse_levels(args.concurrency)
    params = LoadParams(
        n_ctx=args.ctx * max(levels),
        n_seq_max=max(levels),
        n_threads=args.threads,
        state_cache_mb=0,
        speculative=SpeculativeSettings("lookup", draft_max=args.draft_max),
    )
    rows: list[str] = []
    ratios: list[float] = []
    with Model(path, params) as m:
        for level in levels:
            res: dict[str, list[dict[str, Any]]] = {"plain": [], "lookup": []}
            run_round(m, level, "off", 8, 0)  # warm-up
            for i in range(args.runs):
                order: list[tuple[str, SpecMode]] = [("plain", "off"), ("lookup", "lookup")]
                for arm, spec in order if i % 2 == 0 else order[::-1]:
                    res[arm].append(run_round(m, level, spec, args.max_tokens, i))
            plain, lookup = median_tps(res["plain"]), median_tps(res["lookup"])
            acc, dr = acceptance(res["lookup"])
            gain = res["lookup"][-1]["gain"]
            same = all(
                a["texts"] == b["texts"] for a, b in zip(res["plain"], res["lookup"], strict=True)
            )
            ratios.append(lookup / plain)
            rows.append(
                f"| {level} | {plain:.1f} | {lookup:.1f} | {lookup / plain:.2f} | "
                f"{acc}/{dr} = {acc / max(1, dr):.0%} | "
                f"{'-' if gain is None else f'x{gain:.2f}'} | {'yes' if same else 'no'} |"
            )
            print(rows[-1], flush=True)
    text = "\n".join(
        [
            f"`{command_line()}`",
            "",
            "| concurrent requests | plain t/s | lookup t/s | lookup / plain | acceptance "
            "| measured gain | same text |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "SUMMARY concurrency: "
            + ", ".join(f"{lv}: x{r:.2f}" for lv, r in zip(levels, ratios, strict=True)),
        ]
    )
    text = f"{text}\n\n{machine_line()}"
    print()
    print(text)
    if args.write:
        replace_between(BENCH_DOC, LEVELS_START, LEVELS_END, text)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--draft", default=None, help="also measure this draft model")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument(
        "--draft-max",
        type=int,
        default=None,
        help="cap on drafted tokens a step (default: the engine's)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--only", default=None, help="comma-separated prompt names")
    ap.add_argument("--json", type=Path, default=None, help="write the raw results here")
    ap.add_argument("--write", action="store_true", help="update the table in docs/speculative.md")
    ap.add_argument(
        "--server",
        action="store_true",
        help="instead: plain and lookup as the HTTP server makes requests",
    )
    ap.add_argument(
        "--no-gate",
        action="store_true",
        help="every draft allowed: no measured-gain gate (drafts still sized by the "
        "measured cost curve)",
    )
    ap.add_argument(
        "--concurrency",
        default=None,
        help='instead: plain vs lookup with this many requests at once, e.g. "1,4,8"',
    )
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: this process's CPU time instead of the wall clock; with "
        "--threads 1 a fair measure on a machine other jobs keep busy",
    )
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter

    lib = ModelLibrary(AppPaths.default().models)
    path = lib.resolve(args.model)
    if args.no_gate:
        from engine.host.draft_gain import DraftGain

        def allow_all(_self: DraftGain, _busy: int, _bucket: int) -> bool:
            return True

        DraftGain.allow = allow_all  # type: ignore[method-assign, assignment]
    if args.server:
        return server_main(args, path)
    if args.concurrency:
        return concurrency_main(args, path)

    def params(**kw: Any) -> LoadParams:
        return LoadParams(n_ctx=args.ctx, n_threads=args.threads, state_cache_mb=0, **kw)

    lookup = SpeculativeSettings("lookup", draft_max=args.draft_max)
    # Each configuration: its load settings and its arms (name, the request's `spec`).
    configs: dict[str, tuple[LoadParams, list[tuple[str, SpecMode | None]]]] = {
        "app plain": (params(), [("plain", None)]),
        "app lookup": (params(speculative=lookup), [("lookup", None)]),
    }
    if args.draft:
        configs["app draft"] = (
            params(
                speculative=SpeculativeSettings(
                    "draft", draft_model=str(lib.resolve(args.draft)), draft_max=args.draft_max
                )
            ),
            [("draft", None)],
        )
    configs["exact"] = (
        params(extra_buffers=False, flash_attn="on", speculative=lookup),
        [("plain exact", "off"), ("lookup exact", None)],
    )
    arms = [a for _, config_arms in configs.values() for a, _ in config_arms]
    spec_arms = [a for a in arms if "exact" not in a and a != "plain"]
    prompts = [(n, p) for n, p in PROMPTS if args.only is None or n in args.only.split(",")]
    described: dict[str, str] = {}
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    order = list(configs)
    for name, prompt in prompts:
        results[name] = {arm: [] for arm in arms}
        # Run by run, every configuration once (loaded for that run alone: one model at a
        # time), in reversed order every other run, so a machine that speeds up or slows
        # down over a prompt's runs moves every arm alike.
        for i in range(args.runs):
            for config in order if i % 2 == 0 else reversed(order):
                load_params, config_arms = configs[config]
                with Model(path, load_params) as m:
                    if config not in described:
                        described[config] = describe(m)
                        print(f"{config}: {described[config]}", flush=True)
                    for _, spec in config_arms:
                        run_once(m, prompt, 8, spec)  # warm-up
                    for arm_name, spec in config_arms if i % 2 == 0 else config_arms[::-1]:
                        results[name][arm_name].append(run_once(m, prompt, args.max_tokens, spec))
        r = results[name]
        line = f"{name:13s} plain {median_tps(r['plain']):6.1f} t/s"
        refs = {a: "plain" for a in spec_arms} | {"lookup exact": "plain exact"}
        for a, ref in refs.items():
            acc, dr = acceptance(r[a])
            line += (
                f" | {a} {median_tps(r[a]):6.1f} t/s "
                f"x{median_tps(r[a]) / median_tps(r[ref]):.2f} acc {acc / max(1, dr):.0%}"
            )
        print(line, flush=True)

    settings = (
        f"app: plain {described['app plain']}; lookup {described['app lookup']}. "
        f"exact: {described['exact']}."
    )
    text = table(results, spec_arms, command_line(), settings)
    print()
    text = f"{text}\n\n{machine_line()}"  # which CPU: kernels differ
    print(text)
    if args.write:
        replace_between(DOC, START, END, text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
