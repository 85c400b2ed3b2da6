"""A short soak of `candlewick serve` (scripts/soak_server.py, with fewer requests): mixed
streamed, whole, malformed and client-dropped requests at once, then a SIGKILL mid-stream and a
restart on the same profile and port."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from scripts.soak_server import (
    DROPS,
    KINDS,
    MALFORMED,
    Serve,
    free_port,
    kill_and_restart,
    kill_failures,
    plan,
    rss_failures,
    soak,
    traceback_lines,
)


@pytest.mark.model  # the child process loads the bundled model
@pytest.mark.timeout(900)  # two model loads and 32 answers on a 2-core machine shared with others
def test_a_short_soak_then_a_kill_mid_stream(tmp_path: Path) -> None:
    serve = Serve(tmp_path, free_port(), parallel=4, ctx=512, threads=2)
    jobs = plan(32, seed=3)
    # The seed gives every kind and every way of being malformed or dropped.
    assert {j.kind for j in jobs} == set(KINDS)
    assert {j.variant for j in jobs} >= {*MALFORMED, *DROPS}
    try:
        serve.start()
        report = asyncio.run(soak(serve, jobs, concurrency=8, max_tokens=8, warmup=8))
        kill = kill_and_restart(serve)
    finally:
        serve.stop()
    assert report.failures == []
    assert len(report.outcomes) == 32
    assert not [o for o in report.outcomes if o.status is not None and o.status >= 500]
    assert report.slots_after == {"busy_slots": [], "queue_depth": 0}
    assert not [k for k in report.server_statuses if k.startswith("5")]
    assert rss_failures(report.rss, 64) == []
    assert kill_failures(kill) == [], kill
    assert kill["client_saw"].startswith("a connection error"), kill
    assert traceback_lines(serve.log) == []
