"""The performance panel's rules without Qt or a clock (app.ui.perf_meter): the rolling
generation rate over injected token arrivals, and "CPU busy" over injected CPU samples."""

from __future__ import annotations

import pytest

from app.ui.perf_meter import (
    BUSY_OTHERS_CORES,
    CpuContention,
    CpuShare,
    RollingRate,
    cpu_busy_text,
)


def feed(rate: RollingRate, t0: float, tps: float, seconds: float, n0: int = 0) -> float:
    """Tokens arriving one by one at `tps` from `t0` for `seconds`; returns the last time."""
    n, t = n0, t0
    step = 1 / tps
    while t <= t0 + seconds + 1e-9:
        n += 1
        rate.add(t, n)
        t += step
    return t - step


def test_a_slow_reply_after_a_fast_one_shows_its_own_rate() -> None:
    """The bug: 20.6 tok/s shown right after a 2.1 tok/s reply."""
    r = RollingRate(window_s=3.0)
    r.start()
    end = feed(r, 0.0, 20.6, 6.0)
    assert r.rate(end) == pytest.approx(20.6, rel=0.05)
    r.stop()
    # The next reply: its first token 1.5 s after it was sent; nothing of the last one counts.
    r.start()
    assert r.rate(end + 1.0) is None  # no token yet: no rate, not the last reply's
    first = end + 2.0
    last = feed(r, first, 2.1, 8.0)
    assert r.rate(last) == pytest.approx(2.1, rel=0.1)
    r.stop()
    assert r.rate(last + 0.1) == pytest.approx(2.1, rel=0.1)  # just ended: its rate


def test_the_window_follows_a_change_of_speed_within_a_reply() -> None:
    r = RollingRate(window_s=3.0)
    r.start()
    t = feed(r, 0.0, 30.0, 10.0)
    t = feed(r, t + 0.5, 2.0, 6.0, n0=301)
    assert r.rate(t) == pytest.approx(2.0, rel=0.2)  # the last 3 s, not the reply's mean


def test_no_rate_once_nothing_was_generated_for_a_while() -> None:
    r = RollingRate(window_s=3.0)
    assert r.rate(0.0) is None
    r.start()
    end = feed(r, 0.0, 10.0, 2.0)
    r.stop()
    assert r.rate(end + 2.9) is not None
    assert r.rate(end + 3.1) is None
    # Still generating but stalled: it is slow now (0), not idle.
    r.start()
    t = feed(r, 100.0, 10.0, 2.0)
    assert r.rate(t + 1.5) == pytest.approx(10 * 1.5 / 3.0, rel=0.2)
    assert r.rate(t + 3.5) == 0.0


def test_one_arrival_measures_nothing_and_bursts_count_over_time() -> None:
    r = RollingRate(window_s=3.0)
    r.start()
    r.add(5.0, 40)  # the first piece: the tokens before it are time to first token
    assert r.rate(5.0) is None and r.rate(5.3) is None
    # Coalesced bursts: 10 tokens every 0.5 s is 20 tok/s whatever the bursts' size.
    for i in range(1, 13):
        r.add(5.0 + 0.5 * i, 40 + 10 * i)
    assert r.rate(11.0) == pytest.approx(20.0, rel=0.01)
    # A smaller count is another reply's: it starts again.
    r.add(12.0, 3)
    assert r.rate(12.0) is None


def test_cpu_share_of_other_processes() -> None:
    cpu = CpuContention(n_cores=2, window_s=2.0)
    assert cpu.add(0.0, 10.0, 100.0) is None  # one sample: no interval yet
    # 0.4 s: this process 0.2 CPU-s, the machine 0.92 CPU-s: others 0.72 / 0.4 = 1.8 cores.
    share = cpu.add(0.4, 10.2, 100.92)
    assert share is not None and share.n_cores == 2
    assert (share.own_cores, share.other_cores) == pytest.approx((0.5, 1.8))
    assert cpu_busy_text(share) == "CPU busy: other processes use 180% of 2 cores"
    # The window moves on: only the last 2 s count; a quiet machine has no line.
    t, own, machine = 0.4, 10.2, 100.92
    for _ in range(10):
        t, own, machine = t + 0.4, own + 0.38, machine + 0.40
    share = cpu.add(t, own, machine)
    assert share is not None and share.other_cores == pytest.approx(0.05, abs=1e-6)
    assert share.own_cores == pytest.approx(0.95)
    assert cpu_busy_text(share) is None


def test_cpu_busy_threshold_and_clamping() -> None:
    n = 4
    just = CpuShare(own_cores=1.0, other_cores=BUSY_OTHERS_CORES, n_cores=n)
    below = CpuShare(own_cores=1.0, other_cores=BUSY_OTHERS_CORES - 0.01, n_cores=n)
    assert cpu_busy_text(just) == "CPU busy: other processes use 50% of 4 cores"
    assert cpu_busy_text(below) is None
    # Counters that do not add up (a process's time read after the machine's) never go
    # below zero or above the machine.
    cpu = CpuContention(n_cores=2)
    cpu.add(0.0, 0.0, 0.0)
    odd = cpu.add(1.0, 1.5, 1.0)
    assert odd is not None and odd.other_cores == 0.0 and odd.own_cores == 1.5
    wild = cpu.add(2.0, 1.5, 50.0)
    assert wild is not None and wild.other_cores == 2.0
