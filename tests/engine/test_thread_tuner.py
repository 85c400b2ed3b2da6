"""The decode thread count follows contention: scripted step times, a scripted clock.

Each side of the switch is forced here (a quiet machine, cores taken by other programs, cores
given back); that the count changes nothing in a reply is checked on SmolLM2 at the end."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from engine.native import thread_tuner as tt
from engine.native.thread_tuner import ThreadTuner
from engine.settings import LoadParams, SamplingParams


class Machine:
    """A step's time by thread count, and a clock that each step moves on."""

    def __init__(self, times: dict[int, float]) -> None:
        self.times = times
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def run(self, tuner: ThreadTuner, steps: int, size: int = 1) -> list[int]:
        """`steps` decode steps; the thread count each one ran on."""
        used = []
        for _ in range(steps):
            n = tuner.current
            used.append(n)
            self.now += self.times[n]
            tuner.observe(size, self.times[n])
        return used


def quiet() -> dict[int, float]:
    return {2: 0.008, 1: 0.013}


def contended() -> dict[int, float]:
    return {2: 0.200, 1: 0.025}


def test_a_quiet_machine_keeps_every_thread_after_one_look() -> None:
    m = Machine(quiet())
    tuner = ThreadTuner(2, clock=m.clock)
    used = m.run(tuner, 2000)
    # One look at the lower count after the first steps, lost; then all steps on 2 threads.
    assert used.count(1) == tt.PROBE_STEPS
    assert used[-1500:] == [2] * 1500
    assert tuner.switches == 0


def test_contention_moves_to_fewer_threads_and_back_when_it_ends() -> None:
    m = Machine(quiet())
    tuner = ThreadTuner(2, clock=m.clock)
    m.run(tuner, 100)
    m.times = contended()
    used = m.run(tuner, 200)
    assert used[:3] == [2, 2, 2]  # one slow step is no trend
    assert used[-150:].count(1) >= 149 and tuner.current == 1 and tuner.switches == 1
    # Still contended: the full count is tried now and then, one step each (clearly worse),
    # and less often each time.
    used = m.run(tuner, 5000)
    assert tuner.current == 1 and tuner.switches == 1
    assert used.count(2) <= 8  # 125 s of steps: tries at 2, 4, 8, 16, 32, 60 s intervals
    m.times = quiet()
    used = m.run(tuner, 10_000)
    assert tuner.current == 2 and tuner.switches == 2
    assert used[-1000:] == [2] * 1000


def test_a_lower_count_that_is_no_faster_is_given_up() -> None:
    """Slow steps that fewer threads do not help (a slow memory bus, say): no switch."""
    m = Machine(quiet())
    tuner = ThreadTuner(2, clock=m.clock)
    m.run(tuner, 100)
    m.times = {2: 0.030, 1: 0.045}
    used = m.run(tuner, 3000)
    assert tuner.switches == 0 and tuner.current == 2
    assert used.count(1) < 60  # looks, further apart each time


def test_prompt_steps_are_not_measured_and_a_size_change_ends_a_probe() -> None:
    m = Machine(quiet())
    tuner = ThreadTuner(2, clock=m.clock)
    assert tuner.observe(tt.MAX_SIZE + 1, 5.0) is None  # reading a prompt: no measure
    m.run(tuner, tt.FIRST_PROBE_AFTER)
    assert tuner.current == 1  # the first look has begun
    assert tuner.observe(4, 0.001) == 2  # another step size: back, nothing concluded
    assert tuner.current == 2


def test_probes_cut_short_by_a_server_batch_do_not_lengthen_the_wait() -> None:
    """After contention ends, a server's changing batch sizes cut the tuner's looks at the
    full count short; those are not losses, so once a request decodes alone the full count
    comes back within a couple of waits, not after a minute."""
    m = Machine(quiet())
    tuner = ThreadTuner(2, clock=m.clock)
    m.run(tuner, 100)
    m.times = contended()
    m.run(tuner, 200)
    assert tuner.current == 1
    m.times = quiet()
    for _ in range(3000):  # 39 s of steps whose size changes every step
        m.run(tuner, 1, size=2 if tuner.current == 2 else 1)
    assert tuner.current == 1
    start = m.now
    while tuner.current == 1 and m.now - start < 2 * tt.MAX_RECHECK_S:
        m.run(tuner, 1)  # one request alone: size 1 every step
    assert m.now - start < 10.0  # (a wait doubled by every cut probe reached a minute)
    assert m.run(tuner, 400) == [2] * 400


@pytest.mark.parametrize("n_max", [1, 0])
def test_one_thread_is_left_alone(n_max: int) -> None:
    tuner = ThreadTuner(n_max)
    assert not tuner.active
    assert all(tuner.observe(1, 1.0) is None for _ in range(100))


def test_eight_cores_go_down_to_four() -> None:
    m = Machine({8: 0.004, 4: 0.006})
    tuner = ThreadTuner(8, clock=m.clock)
    m.run(tuner, 100)
    m.times = {8: 0.100, 4: 0.010}
    m.run(tuner, 100)
    assert tuner.current == 4


@pytest.mark.model
def test_the_thread_count_changes_no_reply(smollm2_path: Path) -> None:
    """Greedy text on 1 thread, on 2, and switched between them at every step, is the same:
    the count splits the work, it does not choose the kernels."""
    from engine.host.runtime import Model

    prompt = "Once upon a time, in a small village by the sea, there lived"
    sp = SamplingParams(temperature=0, max_tokens=96)
    texts = []
    for n in (1, 2):
        with Model(smollm2_path, LoadParams(n_ctx=512, n_threads=n, adapt_threads=False)) as m:
            texts.append(m.complete(prompt, sp).consume())
    with Model(smollm2_path, LoadParams(n_ctx=512, n_threads=2, adapt_threads=True)) as m:
        be = m.backend
        assert be is not None and be.tuner is not None

        be.tuner = Flip()  # type: ignore[assignment]
        texts.append(m.complete(prompt, sp).consume())
    assert len(texts[0]) > 100
    assert texts[0] == texts[1] == texts[2]


class Flip:
    """A tuner that changes the count at every measured step."""

    current = 2

    def observe(self, size: int, seconds: float) -> int:
        self.current = 3 - self.current
        return self.current


@pytest.mark.model
def test_flipping_threads_changes_no_reproducible_reply_with_flash_attention(
    smollm2_path: Path,
) -> None:
    """With flash attention, one query over 512+ cache cells has its sums split across the
    threads: a reproducible reply decodes those steps on the load's own count (unmeasured),
    so a tuner that flips the count at every step it measures changes nothing."""
    from engine.host.runtime import Model

    prompt = "The keeper's log. " + "Ships passed the headland and the lamp was lit. " * 30
    sp = SamplingParams(temperature=0, max_tokens=48)
    params = LoadParams(n_ctx=1024, n_threads=2, flash_attn="on", state_cache_mb=0)
    with Model(smollm2_path, replace(params, adapt_threads=False)) as m:
        assert len(m.tokenize(prompt)) > 300
        want = m.complete(prompt, sp).consume()
    with Model(smollm2_path, params) as m:
        be = m.backend
        assert be is not None
        be.tuner = Flip()  # type: ignore[assignment]
        assert m.complete(prompt, sp).consume() == want
