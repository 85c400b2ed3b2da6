"""The greedy token of a logits row without llama.cpp's sampler chain: an argmax in numpy.

A greedy request's chain is the penalties sampler (when it penalizes) and `greedy`.
`llama_sampler_sample` copies the whole vocabulary into candidates, looks every one of them up
in the penalties' hash map and then scans for the largest: about 210 us a call for SmolLM2's
49,152 tokens on the EPYC, against 7 us for numpy's argmax (docs/speculative.md). A drafting
slot samples every verified position, so the loop picks greedy tokens here instead.

Exact, not an approximation: the same float32 operations on the same row, in llama.cpp's order
(`llama_sampler_penalties_apply`: divide a positive logit by the repeat penalty, multiply a
non-positive one; `llama_sampler_greedy_apply`: the first largest), over the same window (the
penalties' ring of the last `repeat_last_n` accepted tokens, mirrored here). Frequency and
presence penalties are left to the chain (`usable` says so), where C's rounding of their sum
could differ. The chain is still told every token (`sampler_accept`), so it stays in step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from engine.settings import SamplingParams


def usable(s: SamplingParams) -> bool:
    """Whether this request's chain is greedy with at most a repeat penalty."""
    return s.temperature <= 0 and s.frequency_penalty == 0.0 and s.presence_penalty == 0.0


class GreedyPicker:
    """One greedy request's picks. `accept` every token the chain accepts, in order."""

    def __init__(self, s: SamplingParams, prompt: Sequence[int]) -> None:
        n = s.repeat_last_n if s.penalizes else 0
        self._n = max(n, 0)  # llama.cpp: a window of 0 (or less) turns the penalties off
        self._penalty = np.float32(s.repeat_penalty)
        self._ring: deque[int] = deque()
        self._count: dict[int, int] = {}
        if self._n:
            for t in prompt[-self._n :]:  # what the loop accepted into the chain at start
                self.accept(t)

    def accept(self, token: int) -> None:
        if not self._n:
            return
        count = self._count
        count[token] = count.get(token, 0) + 1
        if len(self._ring) >= self._n:
            old = self._ring.popleft()
            left = count[old] - 1
            if left:
                count[old] = left
            else:
                del count[old]
        self._ring.append(token)

    def pick(self, row: npt.NDArray[np.float32]) -> int:
        """The chain's greedy token for `row` (penalised in place: the row is not read
        again). Accepts it."""
        if self._count:
            ids = np.fromiter(self._count, dtype=np.intp, count=len(self._count))
            ids = ids[(ids >= 0) & (ids < row.size)]
            v = row[ids]
            row[ids] = np.where(v <= 0, v * self._penalty, v / self._penalty)
        tok = int(np.argmax(row))
        self.accept(tok)
        return tok


__all__ = ["GreedyPicker", "usable"]
