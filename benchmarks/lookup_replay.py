"""What prompt lookup can buy on the speculative benchmark's answers, replayed without timing.

The benchmark's requests are greedy, so each answer is fixed: replaying it through the
drafter (`engine.host.speculative.PromptLookup`, fed the prompt and then the answer as the
loop feeds it) tells which drafts the model would accept, with no model run and no clock. A
verification cost curve (decodes of n tokens in one-token decodes, `benchmarks/verify_cost.py`)
turns the steps into a predicted speed-up over plain decoding: answer tokens over the summed
cost of the steps. The figure depends on no other program on the machine, so drafting rules
can be compared on a busy one; the measured-gain gate is not replayed (it drafts a kind only
while it wins, so it can only cut losses the replay shows).

Three figures per prompt:
- lookup: the drafter as it is (its places, its lengths from the curve, its request's own
  check on what its verified drafts gave);
- lengths known: the same places, each draft exactly as long as its accepted part (none when
  that does not pay): the most a rule for draft lengths could give;
- any place: the longest run of the answer's next tokens found anywhere earlier in the
  prompt or the answer (none when that does not pay): the most any choice of places could.

    .venv/bin/python benchmarks/lookup_replay.py [--config app|exact] [--curve 1.8,0.14]

The answers are the model's own greedy ones at that configuration's load settings (AMX
weights take other kernels than the exact configuration, so the answers differ a little).
The last line starts with SUMMARY.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from speculative import PROMPTS

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from engine.host.runtime import Model
from engine.host.speculative import CostCurve, PromptLookup, VerifyCost, verify_cost
from engine.settings import DEFAULT_DRAFT_MAX, LoadParams, SamplingParams

# Each configuration's curve is the one the loop starts from for the kernels it loads
# (`verify_cost`), unless --curve names one.
CONFIGS = {
    "app": LoadParams(n_ctx=2048, state_cache_mb=0),
    "exact": LoadParams(n_ctx=2048, state_cache_mb=0, extra_buffers=False, flash_attn="on"),
}


def accepted(drafts: Sequence[int], truth: Sequence[int]) -> int:
    a = 0
    while a < len(drafts) and a < len(truth) and drafts[a] == truth[a]:
        a += 1
    return a


def pays(k: int, curve: CostCurve) -> int:
    """k drafts that will all be accepted, or 0 where their step is slower than plain ones."""
    return k if k and (k + 1) / curve(k + 1) > 1 else 0


def replay(
    prompt: Sequence[int], answer: Sequence[int], curve: CostCurve, mode: str
) -> tuple[float, int, int]:
    """(predicted speed-up, drafted tokens, accepted) for one answer; `mode`: lookup,
    lengths known, any place (the module doc)."""
    drafter = PromptLookup(cost=curve)
    drafter.begin(prompt)
    history = list(prompt)
    i, cost, drafted, took = 0, 0.0, 0, 0
    while i < len(answer):
        truth = answer[i:]
        if mode == "any place":
            k = 0
            for n in range(min(DEFAULT_DRAFT_MAX, len(truth)), 0, -1):
                seg = list(truth[:n])
                if any(history[j : j + n] == seg for j in range(len(history) - n + 1)):
                    k = n
                    break
            drafts = list(truth[: pays(k, curve)])
        else:
            drafts = drafter.propose(DEFAULT_DRAFT_MAX)
            if mode == "lengths known":
                drafts = drafts[: pays(accepted(drafts, truth), curve)]
        a = accepted(drafts, truth)
        if drafts and mode == "lookup":
            drafter.verified(len(drafts), a)  # as the loop reports it: the request's own check
        cost += curve(1 + len(drafts))
        drafted += len(drafts)
        took += a
        produced = min(a + 1, len(truth))
        for t in truth[:produced]:
            drafter.accept(t)
            history.append(t)
        i += produced
    return len(answer) / cost, drafted, took


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--config", choices=tuple(CONFIGS), default="app")
    ap.add_argument(
        "--curve",
        default=None,
        help="first,step: n tokens cost first + step (n - 2) (default: the loaded kernels')",
    )
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args()
    params = CONFIGS[args.config]
    curve: CostCurve | None = None
    if args.curve:
        first, step = (float(x) for x in args.curve.split(","))
        curve = VerifyCost(first, step)
    path = ModelLibrary(AppPaths.default().models).resolve(args.model)
    answers: list[tuple[str, list[int], list[int]]] = []
    with Model(path, params) as m:
        if curve is None:
            curve = verify_cost(m)
        for name, text in PROMPTS:
            messages = [{"role": "user", "content": text}]
            m.reset_cache()
            sampling = SamplingParams(temperature=0, max_tokens=args.max_tokens)
            gen = m.generate(messages, sampling, spec="off")
            gen.consume()
            answers.append((name, m.chat_tokens(messages), list(gen.tokens)))
    assert curve is not None
    modes = ("lookup", "lengths known", "any place")
    print(f"`benchmarks/lookup_replay.py --config {args.config}`, curve {curve}")
    print()
    print("| prompt | tokens | " + " | ".join(modes) + " | lookup acceptance |")
    print("|---|---:|" + "---:|" * len(modes) + "---:|")
    by_mode: dict[str, list[float]] = {m: [] for m in modes}
    total_drafted = total_took = 0
    for name, prompt, answer in answers:
        cells = []
        for mode in modes:
            gain, drafted, took = replay(prompt, answer, curve, mode)
            by_mode[mode].append(gain)
            cells.append(f"{gain:.2f}")
            if mode == "lookup":
                total_drafted += drafted
                total_took += took
                rate = f"{took}/{drafted}"
        print(f"| {name} | {len(answer)} | " + " | ".join(cells) + f" | {rate} |")
    figures = ", ".join(f"{m} x{geomean(v):.2f}" for m, v in by_mode.items())
    share = total_took / max(1, total_drafted)
    print()
    print(
        f"SUMMARY {args.config} replay (geometric mean, predicted): {figures}; "
        f"lookup acceptance {total_took}/{total_drafted} = {share:.0%}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
