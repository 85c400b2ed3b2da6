"""The decode rate of one greedy chat reply read in a plain loop: the reference the GUI
streaming and the chat-while-indexing benchmarks compare against."""

from __future__ import annotations

import time

from engine.host.runtime import Model
from engine.settings import SamplingParams

PROMPT = "Write a long story about a lighthouse keeper and a storm, in many paragraphs."


def reply_rate(model: Model, sampling: SamplingParams, prompt: str = PROMPT) -> tuple[float, int]:
    """(tokens/s between the first and the last token as this loop sees them, tokens)."""
    gen = model.generate([{"role": "user", "content": prompt}], sampling)
    t_first: float | None = None
    t_last = 0.0
    n_first = 0
    for _piece in gen:
        t_last = time.perf_counter()
        if t_first is None:
            t_first, n_first = t_last, len(gen.tokens)
    assert t_first is not None
    return (len(gen.tokens) - n_first) / (t_last - t_first), len(gen.tokens)
