"""KV-cache reuse across turns and conversations: what a follow-up really costs.

Three time-to-first-token measurements on one loaded model, alternated over several rounds:

- new_only:    a fresh context processes just the follow-up turn's tokens (the floor);
- follow_up:   the same follow-up after a ~2,000-token conversation already in the KV cache;
- switch_back: the follow-up after another ~2,000-token conversation took the context in
               between (the snapshot of the first one is restored from RAM).

Goals (issue: conversations): follow_up <= 1.2 x new_only, and switching back re-processes
nothing but the new tokens.

    .venv/bin/python benchmarks/kv_reuse.py [--model default] [--rounds 5] [--history 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from engine.host.prompt_cache import PromptStateCache
from engine.host.runtime import Model
from engine.settings import LoadParams, SamplingParams

FIRST_TOKEN = SamplingParams(temperature=0, max_tokens=1)
PARAGRAPH = (
    "The keeper climbed the spiral stairs each evening at dusk, trimmed the wick, polished "
    "the great lens and wound the clockwork that turned it. Ships counted the flashes to know "
    "which headland they were passing. "
)


def conversation(topic: str, n_tokens: int, model: Model) -> list[dict[str, str]]:
    per = len(model.tokenize(PARAGRAPH, add_special=False))
    body = f"Notes about {topic}. " + PARAGRAPH * max(1, n_tokens // per)
    return [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": body + "\nSummarise these notes."},
        {"role": "assistant", "content": "The notes describe a lighthouse keeper's routine."},
    ]


FOLLOW_UP = {"role": "user", "content": "Which detail in the notes matters most to sailors?"}


def ttft(model: Model, messages: list[dict[str, str]]) -> tuple[float, int, int]:
    gen = model.generate(messages, FIRST_TOKEN)
    gen.consume()
    return gen.stats.ttft_s, gen.stats.n_prompt_eval, gen.stats.prompt_tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--history", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = ModelLibrary(AppPaths.default().models).resolve(args.model)
    model = Model(path, LoadParams(n_ctx=args.history * 2 + 512, n_threads=args.threads))
    conv_a = conversation("the north light", args.history, model)
    conv_b = conversation("the south light", args.history, model)
    with_follow_up = [*conv_a, FOLLOW_UP]
    full_prompt = len(model.chat_tokens(with_follow_up))
    new_tokens = full_prompt - len(model.chat_tokens(conv_a))
    # The floor: a prompt of just the new turn, in an empty context.
    only_new = [FOLLOW_UP]
    floor_tokens = len(model.chat_tokens(only_new))
    samples: dict[str, list[float]] = {"new_only": [], "follow_up": [], "switch_back": []}
    evals: dict[str, list[int]] = {"follow_up": [], "switch_back": []}
    for _ in range(args.rounds):
        model.state_cache = None  # the floor must not be helped by snapshots
        model.reset_cache()
        samples["new_only"].append(ttft(model, only_new)[0])

        model.reset_cache()
        ttft(model, conv_a)  # the history is in the KV cache
        t, n_eval, _ = ttft(model, with_follow_up)
        samples["follow_up"].append(t)
        evals["follow_up"].append(n_eval)

        model.state_cache = PromptStateCache(512 << 20)  # empty: nothing from earlier rounds
        model.reset_cache()
        ttft(model, conv_a)
        ttft(model, conv_b)  # another conversation takes the context
        t, n_eval, _ = ttft(model, with_follow_up)
        samples["switch_back"].append(t)
        evals["switch_back"].append(n_eval)
    model.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    result: dict[str, Any] = {
        "model": path.name,
        "history_tokens": full_prompt - new_tokens,
        "new_tokens": new_tokens,
        "new_only_prompt_tokens": floor_tokens,
        "rounds": args.rounds,
        "ttft_new_only_ms": round(med["new_only"] * 1000, 1),
        "ttft_follow_up_ms": round(med["follow_up"] * 1000, 1),
        "ttft_switch_back_ms": round(med["switch_back"] * 1000, 1),
        "follow_up_over_new_only": round(med["follow_up"] / med["new_only"], 3),
        "switch_back_over_new_only": round(med["switch_back"] / med["new_only"], 3),
        "tokens_processed_follow_up": max(evals["follow_up"]),
        "tokens_processed_switch_back": max(evals["switch_back"]),
    }
    print(
        json.dumps(result, indent=2)
        if args.json
        else "\n".join(f"{k:32} {v}" for k, v in result.items())
    )
    # Switching back must process no more than staying would have (the new turn, plus the
    # few template tokens that close the previous one).
    ok = (
        result["follow_up_over_new_only"] <= 1.2
        and result["tokens_processed_switch_back"] <= result["tokens_processed_follow_up"]
    )
    print(
        f"goals (follow-up <= 1.2x new-only; switching back processes no more than staying): "
        f"{'MET' if ok else 'NOT MET'}",
        file=sys.stderr,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
