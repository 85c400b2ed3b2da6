"""Fewer decode threads while other programs hold the cores, all of them again once they let go.

llama.cpp's CPU threads meet at a spinning barrier after every operation of the graph. When
another program takes a core, the thread that lost it is descheduled while the others spin
waiting for it, and every barrier waits out a time slice of the kernel's scheduler: on a
2-core EPYC with two busy loops beside it, SmolLM2 decodes 3-5 tokens/s on 2 threads and
26-60 on 1 (quiet: ~120 on 2, ~77 on 1). Users' machines are busy (a browser, a build), and
so is a CI machine running the tests.

`ThreadTuner` watches how long each small decode step takes (steps of up to `MAX_SIZE` tokens:
generation, not prompt reading) at the thread count in use. When steps of one size take much
longer than the fastest seen at that count and size, it tries a lower count for a few steps
and keeps it when it is clearly faster; from a lower count it tries the full count again now
and then (less often each time that fails). The thread count changes only how work is split
between threads, not which kernels run, with one exception: flash attention splits one query's
cache across the threads from 512 cells on, so a reproducible reply decodes those steps on the
load's own count (`ContextBackend.decode(fixed_threads=True)`, not measured here).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_SIZE = 16  # larger steps read prompts: their time says little about contention
ALPHA = 0.2  # weight of the newest step in the running mean (one slow step is no trend)
SLOWER = 1.5  # running mean over the fastest seen: the cores are contended
BETTER = 0.8  # a probe's median under this fraction of the running mean wins
PROBE_STEPS = 3
FIRST_PROBE_AFTER = 32  # steps at the full count before a first look at a lower one
RECHECK_S = 2.0  # a lower count tries the full count again after this ...
MAX_RECHECK_S = 60.0  # ... doubled after every try that fails, up to this


@dataclass
class _Probe:
    origin: int  # the count to go back to when the probe loses
    size: int  # the step size it compares (other sizes end it)
    samples: list[float] = field(default_factory=list)


class ThreadTuner:
    """Chooses the thread count of each decode step from the times of the previous ones."""

    def __init__(self, n_max: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self.n_max = n_max
        self.lower = max(1, n_max // 2)
        self.current = n_max
        self.switches = 0  # thread-count changes kept (not probes)
        self._clock = clock
        self._mean: dict[tuple[int, int], float] = {}  # (threads, size) -> running mean
        self._best: dict[tuple[int, int], float] = {}
        self._probe: _Probe | None = None
        self._steps_full = 0
        self._next_check = 0.0  # when a lower count next tries the full one
        self._recheck_s = RECHECK_S

    @property
    def active(self) -> bool:
        return self.n_max > 1

    def observe(self, size: int, seconds: float) -> int | None:
        """Record a decode step of `size` tokens that took `seconds` at `current` threads;
        returns the count the next step must use when it changes, else None."""
        if not self.active or size < 1 or size > MAX_SIZE:
            return None
        key = (self.current, size)
        if self._probe is not None:
            return self._probe_step(size, seconds)
        mean = self._mean.get(key)
        self._mean[key] = seconds if mean is None else mean + ALPHA * (seconds - mean)
        self._best[key] = min(self._best.get(key, seconds), seconds)
        now = self._clock()
        if self.current == self.n_max:
            self._steps_full += 1
            first_look = self._steps_full == FIRST_PROBE_AFTER
            if first_look or (
                now >= self._next_check and self._mean[key] > SLOWER * self._best[key]
            ):
                return self._start_probe(self.lower, size)
        elif now >= self._next_check:
            return self._start_probe(self.n_max, size)
        return None

    def _start_probe(self, to: int, size: int) -> int:
        self._probe = _Probe(self.current, size)
        self.current = to
        return to

    def _probe_step(self, size: int, seconds: float) -> int | None:
        probe = self._probe
        assert probe is not None
        if size != probe.size:
            return self._cut_probe()
        probe.samples.append(seconds)
        reference = self._mean.get((probe.origin, size))
        if reference is None:
            return self._cut_probe()
        if seconds > 4 * reference:  # clearly worse already: do not pay for more steps
            return self._end_probe(won=False)
        if len(probe.samples) < PROBE_STEPS:
            return None
        median = statistics.median(probe.samples)
        won = median < BETTER * reference
        if won:
            key = (self.current, size)
            self._mean[key] = median
            self._best[key] = min(self._best.get(key, median), median)
        return self._end_probe(won=won)

    def _cut_probe(self) -> int:
        """A probe cut short (a server's batch changed size, or nothing to compare with):
        back where it came from, to look again after the same wait. Counted as a loss, it
        doubled the wait each time, and a server whose batches keep changing stayed on the
        lower count for a minute after the contention that put it there had ended."""
        probe = self._probe
        assert probe is not None
        self._probe = None
        self.current = probe.origin
        self._next_check = self._clock() + self._recheck_s
        return probe.origin

    def _end_probe(self, *, won: bool) -> int | None:
        probe = self._probe
        assert probe is not None
        self._probe = None
        now = self._clock()
        if won:
            self.switches += 1
            self._recheck_s = RECHECK_S
            self._next_check = now + self._recheck_s
            return self.current
        # Lost: back where it came from; look again later, later still after each loss.
        self.current = probe.origin
        self._recheck_s = min(2 * self._recheck_s, MAX_RECHECK_S)
        self._next_check = now + self._recheck_s
        return probe.origin


__all__ = ["ThreadTuner"]
