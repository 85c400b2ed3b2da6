"""`Background`: blocking calls on plain Python threads, each result delivered on the GUI
thread; `max_threads` bounds how many run at once, and `wait()` drops those still waiting."""

from __future__ import annotations

import threading
from typing import Any

from pytestqt.qtbot import QtBot

from app.ui.background import Background


class Results:
    def __init__(self) -> None:
        self.got: list[tuple[Any, BaseException | None, bool]] = []

    def __call__(self, result: Any, error: BaseException | None) -> None:
        on_gui = threading.current_thread() is threading.main_thread()
        self.got.append((result, error, on_gui))


def test_result_and_error_arrive_on_the_gui_thread(qtbot: QtBot) -> None:
    bg, done = Background(), Results()

    def fail() -> None:
        raise ValueError("no answer")

    bg.run(lambda: threading.current_thread().name, done, name="candlewick-test")
    bg.run(fail, done)
    qtbot.waitUntil(lambda: len(done.got) == 2, timeout=5_000)
    results = {str(r): (e, gui) for r, e, gui in done.got}
    assert results["candlewick-test"] == (None, True)
    error, on_gui = results["None"]
    assert isinstance(error, ValueError) and on_gui
    assert bg.running == 0
    bg.wait()


def test_max_threads_runs_the_others_in_turn(qtbot: QtBot) -> None:
    bg, done = Background(max_threads=2), Results()
    go = threading.Event()
    lock = threading.Lock()
    now, most = [0], [0]

    def call(i: int) -> int:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        go.wait(5)
        with lock:
            now[0] -= 1
        return i

    for i in range(5):
        bg.run(lambda i=i: call(i), done)  # type: ignore[misc]
    assert bg.running == 5  # two running, three waiting
    assert sum(t.name == "candlewick-bg" for t in threading.enumerate()) == 2
    go.set()
    qtbot.waitUntil(lambda: len(done.got) == 5, timeout=5_000)
    assert sorted(r for r, _, _ in done.got) == list(range(5)) and most[0] == 2
    assert all(e is None and gui for _, e, gui in done.got)
    qtbot.waitUntil(lambda: bg.running == 0, timeout=5_000)
    bg.wait()


def test_wait_drops_waiting_calls_and_delivers_nothing(qtbot: QtBot) -> None:
    bg, done = Background(max_threads=1), Results()
    go = threading.Event()
    ran: list[int] = []
    bg.run(lambda: go.wait(5), done)
    bg.run(lambda: ran.append(2), done)
    bg.run(lambda: ran.append(3), done)
    bg.wait(timeout_s=0.05)  # the first is still running
    go.set()
    bg.wait(timeout_s=None)
    qtbot.wait(50)  # a result queued to the GUI thread would arrive now
    assert ran == [] and done.got == [] and bg.running == 0
