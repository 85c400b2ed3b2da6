"""Speculative decoding vs plain decoding on a workload whose answers quote the prompt.

Extraction and summarisation requests (copy a section, list the action items, quote the
sentences about X): the answer repeats long spans of the prompt, which is where prompt lookup
drafting pays. Each prompt runs plain and with prompt lookup, alternating (plain, lookup,
plain, lookup, ...) on one loaded model, greedy, so drift on a noisy machine hits both alike.
Generation speed is wall-clock tokens/s from the first generated token to the last (prompt
processing excluded; the cache is reset before every run so both do the same prefill).
Optionally a draft model is measured the same way (`--draft PATH`).

    .venv/bin/python benchmarks/speculative.py [--model default] [--runs 3] [--max-tokens 160]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from engine.runtime import LoadParams, Model, SamplingParams, TokenSource
from engine.speculative import draft_model_source, load_draft_model, lookup_source

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

PROMPTS: list[tuple[str, str]] = [
    ("action items", NOTES + "\n\nCopy the action items from these notes exactly, one per line."),
    ("decisions", NOTES + "\n\nList the decisions from the notes, word for word."),
    ("quote", ARTICLE + "\n\nQuote the sentences of the article about parking spaces and "
                        "funding exactly."),
    ("summary", ARTICLE + "\n\nSummarise the article in three sentences, reusing its wording."),
    ("code edit", CODE + "\n\nRewrite this function with the default port changed to 9090. "
                         "Show the whole function."),
]


def run_once(model: Model, prompt: str, max_tokens: int,
             source: TokenSource | None) -> dict[str, Any]:
    model.reset_cache()
    gen = model.generate([{"role": "user", "content": prompt}],
                         SamplingParams(temperature=0, max_tokens=max_tokens),
                         token_source=source)
    t_first = None
    n_first = 0
    for _ in gen:
        if t_first is None:
            t_first = time.perf_counter()
            n_first = len(gen.tokens)
    t_end = time.perf_counter()
    st = gen.stats
    n = len(gen.tokens) - n_first
    tps = n / (t_end - t_first) if t_first is not None and t_end > t_first and n > 0 else 0.0
    return {"tps": tps, "tokens": len(gen.tokens), "text": gen.text,
            "drafted": st.draft_tokens, "accepted": st.draft_accepted}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--draft", default=None, help="also measure this draft model")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--draft-max", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--json", type=Path, default=None, help="write the raw results here")
    args = ap.parse_args()

    lib = ModelLibrary(AppPaths.default().models)
    path = lib.resolve(args.model)
    model = Model(path, LoadParams(n_ctx=args.ctx, n_threads=args.threads, state_cache_mb=0))
    arms: dict[str, Any] = {"plain": lambda: None,
                            "lookup": lambda: lookup_source(args.draft_max)}
    draft = None
    if args.draft:
        draft = load_draft_model(lib.resolve(args.draft), model)
        arms["draft"] = lambda: draft_model_source(draft, model, args.draft_max)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name, prompt in PROMPTS:
        results[name] = {arm: [] for arm in arms}
        run_once(model, prompt, 8, None)  # warm-up
        for _ in range(args.runs):
            for arm, make in arms.items():
                results[name][arm].append(run_once(model, prompt, args.max_tokens, make()))
        med = {arm: statistics.median(r["tps"] for r in rs) for arm, rs in results[name].items()}
        line = f"{name:13s} plain {med['plain']:6.1f} t/s"
        for arm in arms:
            if arm == "plain":
                continue
            rs = results[name][arm]
            acc = sum(r["accepted"] for r in rs) / max(1, sum(r["drafted"] for r in rs))
            same = rs[0]["text"] == results[name]["plain"][0]["text"]
            line += (f" | {arm} {med[arm]:6.1f} t/s x{med[arm] / med['plain']:.2f}"
                     f" acc {acc:.0%} same={same}")
        print(line, flush=True)

    print()
    for arm in arms:
        if arm == "plain":
            continue
        ratios = [statistics.median(r["tps"] for r in results[n][arm])
                  / statistics.median(r["tps"] for r in results[n]["plain"]) for n in results]
        drafted = sum(r["drafted"] for n in results for r in results[n][arm])
        accepted = sum(r["accepted"] for n in results for r in results[n][arm])
        toks = sum(r["tokens"] for n in results for r in results[n][arm])
        print(f"{arm}: geometric-mean speed-up x{statistics.geometric_mean(ratios):.2f} "
              f"(per prompt {', '.join(f'{r:.2f}' for r in ratios)}); "
              f"acceptance {accepted}/{drafted} = {accepted / max(1, drafted):.0%}; "
              f"{toks} tokens generated")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if draft is not None:
        draft.close()
    model.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
