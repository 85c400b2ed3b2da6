"""The chat's tool loop (app/services/chat_tools.py) on the window's `ToolRunner`: the
runner's signals reach the loop on the GUI thread. Progress is emitted from the call's own
thread, so it goes through a QObject of the GUI thread (a plain method connected to it
would run on the call's thread and touch the chat's item model there)."""

from __future__ import annotations

from PySide6.QtCore import QObject

from app.services.chat_tools import ToolLoop
from app.services.chat_transcript import Transcript
from app.ui.tool_runner import ToolRunner


class _Inbox(QObject):
    def __init__(self, loop: ToolLoop) -> None:
        super().__init__()
        self.loop = loop

    def progress(self, token: int, done: float, total: object, message: object) -> None:
        self.loop.tool_progress(token, done, total, message)

    def done(self, token: int, status: str, text: str, truncated: bool) -> None:
        self.loop.tool_done(token, status, text, truncated)


class ToolTurns(ToolLoop):
    def __init__(self, runner: ToolRunner, chat: Transcript) -> None:
        super().__init__(runner, chat)
        self.runner: ToolRunner = runner
        self._inbox = _Inbox(self)
        runner.progress.connect(self._inbox.progress)
        runner.done.connect(self._inbox.done)


__all__ = ["ToolTurns"]
