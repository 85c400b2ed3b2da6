"""Waiting for a state in tests: poll a condition until it holds or a deadline passes (tests
wait for the state they assert, not for a signal that usually comes first)."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(cond: Callable[[], bool], timeout: float = 30.0, poll: float = 0.02) -> bool:
    """True once `cond()` holds, False if it still does not after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(poll)
    return True
