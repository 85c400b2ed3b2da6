"""The repeat penalty and the greedy token of a logits row in numpy, not in llama.cpp's chain.

A request's chain starts with the penalties sampler when it penalizes, and ends with `greedy`
when it is greedy. `llama_sampler_sample` copies the whole vocabulary into candidates, and the
penalties sampler then looks every one of them up in its hash map: for SmolLM2's 49,152 tokens
about 165 us a call on an AMX Xeon with the row in cache, against ~10 us to penalise the at
most `repeat_last_n` tokens of the window here; the greedy scan is another ~50 us against 4 us
for numpy's argmax (docs/benchmarks.md, "The decode loop's own work per token"). So the loop
penalises the row in place here and gives the chain the rest (`chain_spec`): top-k, top-p,
min-p, temperature and the draw stay llama.cpp's; a greedy request's token is picked here.

Exact, not an approximation: the same float32 operations on the same row, in llama.cpp's order
(`llama_sampler_penalties_apply`: divide a positive logit by the repeat penalty, multiply a
non-positive one; `llama_sampler_greedy_apply`: the first largest), over the same window (the
penalties' ring of the last `repeat_last_n` accepted tokens, mirrored here). Frequency and
presence penalties are left to the chain (`penalised_here` says so), where C's rounding of
their sum could differ. The chain is still told every token (`sampler_accept`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from engine.settings import SamplingParams


def usable(s: SamplingParams) -> bool:
    """Whether this request's chain is greedy with at most a repeat penalty."""
    return s.temperature <= 0 and s.frequency_penalty == 0.0 and s.presence_penalty == 0.0


def penalised_here(s: SamplingParams) -> bool:
    """Whether the loop applies this request's penalties itself: a repeat penalty alone."""
    return s.penalizes and s.frequency_penalty == 0.0 and s.presence_penalty == 0.0


def chain_spec(s: SamplingParams) -> SamplingParams:
    """What the request's llama.cpp chain is built from: without the penalties the loop
    applies (`penalised_here`)."""
    return dataclasses.replace(s, repeat_penalty=1.0) if penalised_here(s) else s


class RepeatWindow:
    """One request's repeat penalty over the last `repeat_last_n` tokens. `accept` every
    token the chain accepts, in order, from the prompt's tail on."""

    def __init__(self, s: SamplingParams, accepted: Sequence[int]) -> None:
        n = s.repeat_last_n if s.penalizes else 0
        self._n = max(n, 0)  # llama.cpp: a window of 0 (or less) turns the penalties off
        self._penalty = np.float32(s.repeat_penalty)
        self._ring: deque[int] = deque()
        self._count: dict[int, int] = {}
        if self._n:
            for t in accepted[-self._n :]:  # the ring keeps no more
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

    def penalise(self, row: npt.NDArray[np.float32]) -> None:
        """Apply the penalty to the window's tokens in `row`, in place."""
        if self._count:
            ids = np.fromiter(self._count, dtype=np.intp, count=len(self._count))
            ids = ids[(ids >= 0) & (ids < row.size)]
            v = row[ids]
            row[ids] = np.where(v <= 0, v * self._penalty, v / self._penalty)


class GreedyPicker(RepeatWindow):
    """One greedy request's picks."""

    def pick(self, row: npt.NDArray[np.float32]) -> int:
        """The chain's greedy token for `row` (penalised in place: the row is not read
        again). Accepts it."""
        self.penalise(row)
        tok = int(np.argmax(row))
        self.accept(tok)
        return tok


__all__ = ["GreedyPicker", "RepeatWindow", "chain_spec", "penalised_here", "usable"]
