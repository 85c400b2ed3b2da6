"""Temperature 0 in the window gives the same text every time: Regenerate, Continue, and the
same after the model is ejected and loaded again (real SmolLM2 through the controller and the
engine thread). The question is long enough (300+ tokens) that the batching of the prompt
changed the logits before engine.host.batch_plan."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pytestqt.qtbot import QtBot

from app.ui.main_window import MainWindow
from engine.settings import SamplingParams
from tests.app.ui.test_ui_window import close_window, open_window

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
QUESTION = (
    "Here is a travel diary. "
    + " ".join(
        f"On day {i} we walked to the {place} and ate {food}."
        for i, (place, food) in enumerate(
            [
                ("harbour", "fish"),
                ("old mill", "bread"),
                ("castle", "soup"),
                ("market", "figs"),
                ("lake", "cheese"),
                ("forest", "berries"),
                ("bridge", "pie"),
                ("tower", "rice"),
            ]
            * 3
        )
    )
    + " Which day was the best, and why?"
)
pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = open_window(qtbot, GREEDY)
    yield w
    close_window(w)


def wait_idle(qtbot: QtBot, w: MainWindow) -> None:
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=120_000)


@pytest.mark.model
def test_regenerate_continue_and_reload_repeat_the_same_text(
    window: MainWindow, qtbot: QtBot
) -> None:
    c = window.controller
    assert c.send(QUESTION)
    wait_idle(qtbot, window)
    # The loaded model runs on the CPU: the settings promise the same answer.
    assert window.chat_settings is not None
    note = window.chat_settings.repeat_note
    assert not note.isHidden() and "the same text each time" in note.text()
    assert c.send("Tell me more about that day.")
    wait_idle(qtbot, window)
    chat = window.chat_model
    first = chat.message(3).text
    assert first and chat.message(3).stats is not None
    assert chat.message(3).stats.prompt_tokens > 300

    assert c.regenerate(3)
    wait_idle(qtbot, window)
    assert chat.message(3).text == first

    assert c.continue_reply(3)
    wait_idle(qtbot, window)
    continued = chat.message(3).text
    assert continued.startswith(first) and len(continued) > len(first)

    # Eject, then Regenerate loads the model again and evaluates the history from scratch.
    c.eject()
    qtbot.waitUntil(lambda: c.loaded is None, timeout=30_000)
    assert c.regenerate(3)
    wait_idle(qtbot, window)
    assert c.loaded is not None
    assert chat.message(3).text == first
    assert c.continue_reply(3)
    wait_idle(qtbot, window)
    assert chat.message(3).text == continued


def test_chat_settings_say_whether_temperature_0_repeats(window: MainWindow) -> None:
    panel = window.chat_settings
    assert panel is not None
    note = panel.repeat_note
    assert note.isHidden()  # no engine yet: nothing to promise
    panel.set_engine_caveat("")  # a local model on the CPU
    assert not note.isHidden() and "give the same text each time" in note.text()
    panel.set_engine_caveat("the server decides how it computes each answer")
    assert note.text() == (
        "Temperature 0 may still give another answer here: the server "
        "decides how it computes each answer."
    )
    panel.temperature.setValue(0.8)  # random sampling: no promise to make
    assert note.isHidden()
    panel.seed.setValue(7)
    assert not note.isHidden() and note.text().startswith("A fixed seed may still")
