"""Records the engine worker's signals in the order the GUI thread receives them."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from app.ui.worker import EngineWorker


class SignalLog(QObject):
    """Lives in the GUI thread, so the worker's signals reach it queued, in emission order,
    exactly as they reach the window. Tests wait on its `got_*` signals, never on the
    worker's own: pytest-qt's blockers would run their callback in the engine thread.

    The reply signals' request ids are kept apart (`replies`), so `events` and the `got_*`
    signals carry what each signal says, without the id."""

    got_loaded = Signal(object)
    got_load_cancelled = Signal()
    got_tokens = Signal(str, int)
    got_tool_calls = Signal(object)
    got_finished = Signal(object)
    got_failed = Signal(str)
    got_unloaded = Signal()

    def __init__(self, worker: EngineWorker) -> None:
        super().__init__()
        self.events: list[tuple[str, Any]] = []
        # The reply signals (started, tokens, tool_calls, finished, failed) as (name, request
        # id, value).
        self.replies: list[tuple[str, int, Any]] = []
        worker.progress.connect(self.on_progress)
        worker.loaded.connect(self.on_loaded)
        worker.load_cancelled.connect(self.on_load_cancelled)
        worker.started.connect(self.on_started)
        worker.tokens.connect(self.on_tokens)
        worker.tool_calls.connect(self.on_tool_calls)
        worker.finished.connect(self.on_finished)
        worker.failed.connect(self.on_failed)
        worker.unloaded.connect(self.on_unloaded)

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.events]

    def squeezed(self) -> list[str]:
        """Names with runs of the same signal collapsed: progress+ loaded -> [progress, loaded]."""
        out: list[str] = []
        for n in self.names:
            if not out or out[-1] != n:
                out.append(n)
        return out

    def values(self, name: str) -> list[Any]:
        return [v for n, v in self.events if n == name]

    def request_ids(self, name: str) -> list[int]:
        """The request id each `name` signal (started, tokens, tool_calls, finished,
        failed) carried."""
        return [r for n, r, _ in self.replies if n == name]

    def text_of(self, rid: int) -> str:
        """The text the `tokens` signals of request `rid` carried."""
        return "".join(v[0] for n, r, v in self.replies if n == "tokens" and r == rid)

    def _reply(self, name: str, rid: int, value: Any) -> None:
        self.replies.append((name, rid, value))
        self.events.append((name, value))

    def clear(self) -> None:
        self.events.clear()
        self.replies.clear()

    @Slot(float)
    def on_progress(self, p: float) -> None:
        self.events.append(("progress", p))

    @Slot(object)
    def on_loaded(self, info: object) -> None:
        self.events.append(("loaded", info))
        self.got_loaded.emit(info)

    @Slot()
    def on_load_cancelled(self) -> None:
        self.events.append(("load_cancelled", None))
        self.got_load_cancelled.emit()

    @Slot(int, int)
    def on_started(self, rid: int, n: int) -> None:
        self._reply("started", rid, n)

    @Slot(int, str, int)
    def on_tokens(self, rid: int, text: str, n: int) -> None:
        self._reply("tokens", rid, (text, n))
        self.got_tokens.emit(text, n)

    @Slot(int, object)
    def on_tool_calls(self, rid: int, calls: object) -> None:
        self._reply("tool_calls", rid, calls)
        self.got_tool_calls.emit(calls)

    @Slot(int, object)
    def on_finished(self, rid: int, stats: object) -> None:
        self._reply("finished", rid, stats)
        self.got_finished.emit(stats)

    @Slot(int, str)
    def on_failed(self, rid: int, message: str) -> None:
        self._reply("failed", rid, message)
        self.got_failed.emit(message)

    @Slot()
    def on_unloaded(self) -> None:
        self.events.append(("unloaded", None))
        self.got_unloaded.emit()
