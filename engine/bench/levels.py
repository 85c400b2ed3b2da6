"""Concurrency levels as a person types them ("1,2,4"): the one parser behind `candlewick
bench --concurrency` and the Benchmark window's field."""

from __future__ import annotations

import re

MAX_CONCURRENCY = 256  # the command line's cap; the window sets a lower one


def parse_levels(text: str, *, limit: int = MAX_CONCURRENCY) -> list[int]:
    """'1, 2,4' -> [1, 2, 4]: whole numbers between commas, spaces or semicolons, sorted,
    each once. `ValueError` with a one-line message otherwise."""
    parts = [p for p in re.split(r"[\s,;]+", text.strip()) if p]
    if not parts or not all(re.fullmatch(r"[0-9]+", p) for p in parts):
        raise ValueError(
            f"Concurrency levels: {text.strip()!r} is not a comma-separated list "
            "of whole numbers, e.g. 1,2,4"
        )
    levels = sorted({int(p) for p in parts})
    if levels[0] < 1:
        raise ValueError("Concurrency levels must be whole numbers of at least 1")
    if levels[-1] > limit:
        raise ValueError(f"Concurrency levels must be at most {limit}")
    return levels


__all__ = ["MAX_CONCURRENCY", "parse_levels"]
