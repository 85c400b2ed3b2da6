"""A long-lived QThread that hosts one worker QObject: the engine thread and the benchmark
thread are both built on `ThreadHost`.

The host lives on the GUI thread. It owns the QThread, moves the worker onto it, starts it and
ends it; subclasses add the request signals they queue to the worker. Stopping the thread is
`stop_thread()`: it waits for the worker's current slot to return, so a subclass first tells
long work to stop (a `threading.Event`: a busy thread sees no queued call).

Python registers a dummy `threading.Thread` for a foreign (Qt) thread the first time code there
asks for the current thread (logging does, and so does a thread pool) and never removes it.
`forget_python_thread` drops that entry; the host calls it in its thread just before the thread
ends, so no ghost entry outlives it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

W = TypeVar("W", bound=QObject)


def forget_python_thread() -> None:
    """Drop the dummy `threading` entry of the calling foreign thread, if it has one.
    Call it in that thread once it has no Python threads of its own left running."""
    if isinstance(threading.current_thread(), threading._DummyThread):
        with threading._active_limbo_lock:  # type: ignore[attr-defined]
            threading._active.pop(threading.get_ident(), None)  # type: ignore[attr-defined]


class _Exit(QObject):
    """Lives in the hosted thread, so that its slot runs there."""

    @Slot()
    def forget(self) -> None:
        forget_python_thread()


class ThreadHost(QObject, Generic[W]):
    """GUI-side owner of one QThread (named `name`) and the `worker` that lives in it."""

    _forget = Signal()

    def __init__(self, worker: W, name: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.worker: W = worker
        self.qthread = QThread()
        self.qthread.setObjectName(name)
        worker.moveToThread(self.qthread)
        self._exit = _Exit()
        self._exit.moveToThread(self.qthread)
        # Blocking: the entry is gone before the thread is told to quit.
        self._forget.connect(self._exit.forget, Qt.ConnectionType.BlockingQueuedConnection)

    def start(self) -> None:
        """Start the thread unless it is running."""
        if not self.qthread.isRunning():
            self.qthread.start()

    def stop_thread(self) -> None:
        """End the thread once the worker's current slot returns. Safe to call twice."""
        if self.qthread.isRunning():
            self._forget.emit()  # runs in the hosted thread once it is free
            self.qthread.quit()
            self.qthread.wait()


class JobHost(ThreadHost[W]):
    """A hosted worker that runs one cancellable job at a time: `job_slot(job, cancel)` runs in
    the thread, and `cancel()` sets the event it watches (the benchmark, Compare quants)."""

    _run = Signal(object, object)

    def __init__(
        self,
        worker: W,
        name: str,
        job_slot: Callable[[Any, threading.Event], None],
        parent: QObject | None = None,
    ) -> None:
        super().__init__(worker, name, parent)
        self._run.connect(job_slot, Qt.ConnectionType.QueuedConnection)
        self._cancel: threading.Event | None = None

    def run(self, job: object) -> None:
        self.start()
        self._cancel = threading.Event()
        self._run.emit(job, self._cancel)

    def cancel(self) -> None:
        if self._cancel is not None:
            self._cancel.set()

    def shutdown(self) -> None:
        """Cancel any run and end the thread. Safe to call twice."""
        self.cancel()
        self.stop_thread()
