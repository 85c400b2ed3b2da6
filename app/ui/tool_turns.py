"""The chat's tool loop (app/services/chat_tools.py) on the window's `ToolRunner`: the
runner's signals, delivered on the GUI thread, feed the loop."""

from __future__ import annotations

from app.services.chat_tools import ToolLoop
from app.services.chat_transcript import Transcript
from app.ui.tool_runner import ToolRunner


class ToolTurns(ToolLoop):
    def __init__(self, runner: ToolRunner, chat: Transcript) -> None:
        super().__init__(runner, chat)
        self.runner: ToolRunner = runner
        runner.progress.connect(self.tool_progress)
        runner.done.connect(self.tool_done)


__all__ = ["ToolTurns"]
