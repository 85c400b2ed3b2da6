"""`ThreadHost`: the QThread a worker object lives in, started once, and ended without
leaving Python's ghost entry for it behind."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Qt, Signal, Slot
from pytestqt.qtbot import QtBot

from app.ui.thread_host import ThreadHost


class Worker(QObject):
    answered = Signal(object)  # the thread the slot ran in

    @Slot()
    def ask(self) -> None:
        self.answered.emit(threading.current_thread())  # registers the Qt thread in Python


class Host(ThreadHost[Worker]):
    _ask = Signal()

    def __init__(self) -> None:
        super().__init__(Worker(), "candlewick-test-host")
        self._ask.connect(self.worker.ask, Qt.ConnectionType.QueuedConnection)

    def ask(self) -> None:
        self._ask.emit()


class Answers(QObject):
    """Lives in the GUI thread, so the worker's signal reaches it queued (pytest-qt's own
    blockers would run in the worker's thread)."""

    got = Signal(object)

    @Slot(object)
    def on_answered(self, thread: threading.Thread) -> None:
        self.got.emit(thread)


def ghosts() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if isinstance(t, threading._DummyThread)]


def test_worker_runs_in_the_thread_and_no_ghost_outlives_it(qtbot: QtBot) -> None:
    host, answers = Host(), Answers()
    host.worker.answered.connect(answers.on_answered)
    assert host.worker.thread() is host.qthread and not host.qthread.isRunning()
    host.start()
    host.start()  # already running: nothing happens
    with qtbot.waitSignal(answers.got, timeout=5_000) as sig:
        host.ask()
    assert sig.args[0] is not threading.main_thread()
    assert sig.args[0] in ghosts()  # what `stop_thread` must drop
    assert host.qthread.objectName() == "candlewick-test-host"
    host.stop_thread()
    host.stop_thread()  # safe twice
    assert not host.qthread.isRunning() and sig.args[0] not in ghosts()
