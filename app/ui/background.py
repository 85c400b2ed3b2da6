"""Run a blocking call (a network check, a model list) off the GUI thread and get its result
back on the GUI thread.

A plain Python thread, not a Qt pool thread: Python registers a ghost `threading` entry for a
foreign thread that runs Python code and never removes it. The result travels back as a queued
signal (the emitting thread is not the receiver's), so callbacks only ever run on the GUI
thread. `wait()` joins what is still running; owners call it when they close.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal

Done = Callable[[Any, BaseException | None], None]


class Background(QObject):
    _done = Signal(object, object, object)  # callback, result, exception

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._threads: set[threading.Thread] = set()
        self._closed = False
        self._done.connect(self._deliver)

    def run(self, fn: Callable[[], Any], on_done: Done, name: str = "candlewick-bg") -> None:
        """Call `fn()` in a new thread; then `on_done(result, None)` or `on_done(None, error)`
        on the GUI thread (not at all once closed)."""
        t = threading.Thread(target=self._work, args=(fn, on_done), name=name, daemon=True)
        self._threads.add(t)
        t.start()

    @property
    def running(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def _work(self, fn: Callable[[], Any], on_done: Done) -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn()
        except Exception as e:  # handed to the callback, which turns it into one line
            error = e
        with contextlib.suppress(RuntimeError):  # the owner (and this object) is gone
            self._done.emit(on_done, result, error)

    def _deliver(self, on_done: Done, result: Any, error: BaseException | None) -> None:
        self._threads = {t for t in self._threads if t.is_alive()
                         and t is not threading.current_thread()}
        if not self._closed:
            on_done(result, error)

    def wait(self, timeout_s: float = 30.0) -> None:
        """Stop delivering results and join the threads still running, for at most
        `timeout_s` in all."""
        self._closed = True
        end = time.monotonic() + timeout_s
        for t in list(self._threads):
            t.join(max(0.0, end - time.monotonic()))
        self._threads.clear()
