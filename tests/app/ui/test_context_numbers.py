"""The context line under the chat against the performance panel and the model loaded, on the
real SmolLM2: the same count as the panel while an answer streams, the new size after a
reload, and the opened chat's own use after switching chats."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Qt, Slot
from pytestqt.qtbot import QtBot

from app.ui.main_window import MainWindow
from engine.settings import LoadParams, SamplingParams
from tests.app.ui.test_ui_window import close_window, open_window

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")
_LINE = re.compile(r"^Context: ([\d,]+) / ([\d,]+) tokens")


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = open_window(qtbot, SamplingParams(temperature=0.0, max_tokens=16))
    yield w
    close_window(w)


def line(w: MainWindow) -> tuple[int, int]:
    """(used, context size) from the context line."""
    m = _LINE.match(w.chat_view.context_label.text())
    assert m, f"no context line: {w.chat_view.context_label.text()!r}"
    return int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))


class TokenProbe(QObject):
    """Reads `read()` on the GUI thread at each token signal (a bare lambda would run in the
    engine thread, which emits it)."""

    def __init__(self, read: Callable[[], tuple[int, int]]) -> None:
        super().__init__()
        self.read = read
        self.seen: list[tuple[int, int]] = []

    @Slot(str, int)
    def on_tokens(self, _text: str, _n: int) -> None:
        self.seen.append(self.read())


def send(qtbot: QtBot, w: MainWindow, text: str) -> None:
    qtbot.keyClicks(w.chat_view.input, text)
    qtbot.keyClick(w.chat_view.input, Qt.Key.Key_Return)
    # The panel hears `finished` through its own queued event, after the controller's.
    qtbot.waitUntil(lambda: not w.controller.busy and not w.perf_panel.generating, timeout=120_000)


def load(qtbot: QtBot, w: MainWindow, path: Path, n_ctx: int) -> None:
    w._load(path, LoadParams(n_ctx=n_ctx))
    qtbot.waitUntil(
        lambda: w.controller.loaded is not None and w.controller.loaded.n_ctx == n_ctx,
        timeout=60_000,
    )


@pytest.mark.model
def test_context_line_counts_the_answer_as_the_panel_does(window: MainWindow, qtbot: QtBot) -> None:
    panel = window.perf_panel
    probe = TokenProbe(lambda: (line(window)[0], panel.prompt_tokens + panel.gen_tokens))
    # Connected after the controller and the panel: runs once both have seen the tokens.
    window.engine.worker.tokens.connect(probe.on_tokens)
    pairs = probe.seen
    send(qtbot, window, "Count from one to twenty.")
    assert pairs and all(shown == counted for shown, counted in pairs), pairs
    reply = window.chat_model.message(1).stats
    assert reply is not None
    panel_used = int(panel.labels["ctx"].text().split(" / ")[0].replace(",", ""))
    assert line(window)[0] == panel_used == reply.prompt_tokens + reply.gen_tokens


def test_context_line_shows_the_size_of_a_reload(
    window: MainWindow, qtbot: QtBot, smollm2_path: Path
) -> None:
    load(qtbot, window, smollm2_path, 2048)
    send(qtbot, window, "What is the capital of France?")
    used, size = line(window)
    assert size == 2048 and used > 0
    load(qtbot, window, smollm2_path, 4096)
    assert line(window) == (used, 4096)
    window.controller.eject()
    qtbot.waitUntil(lambda: window.controller.loaded is None, timeout=30_000)
    assert window.chat_view.context_label.text() == ""  # no model, no size to show


@pytest.mark.model
def test_context_line_after_switching_chats(window: MainWindow, qtbot: QtBot) -> None:
    send(qtbot, window, "What is the capital of France?")
    first, first_line = window.controller.conversation_id, line(window)
    window.new_chat()
    assert line(window) == (0, first_line[1])
    send(qtbot, window, "Name three colours, please, and say why you like them.")
    assert line(window) != first_line
    assert first is not None
    window.open_conversation(first)
    assert line(window) == first_line
