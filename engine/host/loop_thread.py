"""The thread a decode loop runs on, and when an idle one ends.

llama.cpp's CPU workers are an OpenMP team that belongs to the thread that decodes and lives as
long as it does. Each loaded model decodes on its own loop thread, so with two models that have
decoded the process holds two teams; past the core count libgomp stops letting idle workers
spin between steps, and the busy model decoded at about half speed while the other did nothing
(docs/benchmarks.md, "Two models in one process"). So while another loop is open, an idle
loop's thread ends after `IDLE_THREAD_S` and takes its team along; the next request starts a
new one. A loop alone keeps its thread: a new thread's first step would only add its start to
the next reply's time to first token.

The caller's lock guards `ensure` and `retire` (the loop's condition), so a request that
arrives as the thread ends always finds a thread.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

IDLE_THREAD_S = 1.0

_open: weakref.WeakSet[LoopThread] = weakref.WeakSet()
_open_lock = threading.Lock()


class LoopThread:
    """One loop's thread: started when missing, ended when idle while other loops are open."""

    def __init__(self, run: Callable[[], None], name: str) -> None:
        self._run = run
        self._name = name
        self._thread: threading.Thread | None = None
        with _open_lock:
            _open.add(self)

    @property
    def thread(self) -> threading.Thread | None:
        """The loop's thread now (None while an idle loop has none)."""
        return self._thread

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def ensure(self) -> None:
        """Start the thread if there is none (caller holds the loop's lock)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def retire(self) -> bool:
        """Called on an idle thread with the loop's lock held: True if it should end (another
        loop is open); the next `ensure` then starts a new one."""
        with _open_lock:
            if not any(other is not self for other in _open):
                return False
        self._thread = None
        return True

    def close(self) -> None:
        """This loop is closing (its `_run` is told to stop): no longer counted."""
        with _open_lock:
            _open.discard(self)

    def join(self) -> None:
        """Wait for the thread to end, unless called on it (without the loop's lock)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()


def open_loop_threads() -> list[LoopThread]:
    """The loops of this process that are not closed."""
    with _open_lock:
        return list(_open)
