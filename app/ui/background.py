"""Run blocking calls (a network check, a Hub search, a file copy) off the GUI thread and get
each result back on the GUI thread: the one way the UI runs short background work.

Plain Python threads, not Qt pool threads: Python registers a ghost `threading` entry for a
foreign thread that runs Python code and never removes it. That is also why this is ours and
not superqt's `create_worker`/`thread_worker`: those run on `QThreadPool` threads (a ghost for
each pool thread, for the life of the app) and would add a dependency for what is a page here.

The result travels back as a queued signal (the emitting thread is not the receiver's), so
callbacks only ever run on the GUI thread. `max_threads` bounds how many calls run at once
(the model manager asks the Hub for at most two things at a time); the others wait their
turn, first come first served, and run on a thread that has finished its call. `wait()`
drops the calls still waiting and joins those running; owners call it when they close.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal

Done = Callable[[Any, BaseException | None], None]


@dataclass(frozen=True)
class _Call:
    fn: Callable[[], Any]
    on_done: Done
    name: str


class Background(QObject):
    _done = Signal(object, object, object)  # callback, result, exception

    def __init__(self, parent: QObject | None = None, *, max_threads: int | None = None) -> None:
        """`max_threads`: how many calls may run at once (None: no limit)."""
        super().__init__(parent)
        self._max = max_threads
        self._lock = threading.Lock()  # guards the fields below, shared with the threads
        self._threads: set[threading.Thread] = set()
        self._waiting: deque[_Call] = deque()
        self._working = 0  # threads running a call
        self._closed = False
        self._done.connect(self._deliver)

    def run(self, fn: Callable[[], Any], on_done: Done, name: str = "candlewick-bg") -> None:
        """Call `fn()` in a thread named `name`; then `on_done(result, None)` or
        `on_done(None, error)` on the GUI thread (not at all once closed)."""
        call = _Call(fn, on_done, name)
        with self._lock:
            if self._max is not None and self._working >= self._max:
                self._waiting.append(call)
                return
            self._working += 1
            self._threads = {t for t in self._threads if t.is_alive()}
            t = threading.Thread(target=self._work, args=(call,), name=name, daemon=True)
            self._threads.add(t)
        t.start()

    @property
    def running(self) -> int:
        """Calls not finished yet: running, or waiting for a thread."""
        with self._lock:
            return self._working + len(self._waiting)

    def _work(self, first: _Call) -> None:
        call: _Call | None = first
        try:
            while call is not None:
                threading.current_thread().name = call.name
                result: Any = None
                error: BaseException | None = None
                try:
                    result = call.fn()
                except Exception as e:  # handed to the callback, which turns it into one line
                    error = e
                with contextlib.suppress(RuntimeError):  # the owner (and this object) is gone
                    self._done.emit(call.on_done, result, error)
                with self._lock:
                    call = self._waiting.popleft() if self._waiting and not self._closed else None
                    if call is None:
                        self._working -= 1
        finally:
            if call is not None:  # a BaseException ended this thread: free its place
                with self._lock:
                    self._working -= 1

    def _deliver(self, on_done: Done, result: Any, error: BaseException | None) -> None:
        if not self._closed:
            on_done(result, error)

    def wait(self, timeout_s: float | None = 30.0) -> None:
        """Stop delivering results, drop the calls still waiting and join the threads still
        running, for at most `timeout_s` in all (None: until they end)."""
        with self._lock:
            self._closed = True
            self._waiting.clear()
            threads = list(self._threads)
        end = None if timeout_s is None else time.monotonic() + timeout_s
        for t in threads:
            t.join(None if end is None else max(0.0, end - time.monotonic()))
        with self._lock:
            self._threads = {t for t in self._threads if t.is_alive()}
