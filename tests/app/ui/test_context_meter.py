"""The context meter in the window: the widget alone (offscreen), the drawer's four policies,
and the whole path on the real SmolLM2 in a small context: the engine thread measures the
prompt it sent, the bar shows it, and the messages it left out are marked."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytestqt.qtbot import QtBot

from app.services.chat_settings import ChatSettings
from app.services.chat_store import ChatStore
from app.ui.chat_settings import ChatSettingsPanel
from app.ui.context_meter import ContextMeterView, SummaryBlock
from app.ui.main_window import MainWindow
from engine.host.context_meter import KINDS, ContextMeter, Kind, measure
from engine.settings import SamplingParams
from tests.app.ui.shots import save_shot, shots_dir
from tests.app.ui.test_context_numbers import load, send
from tests.app.ui.test_ui_window import close_window, open_window

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def a_meter(**left: Any) -> ContextMeter:
    kinds: dict[Kind, int] = dict.fromkeys(KINDS, 0)
    given: dict[Kind, int] = {
        "system": 40,
        "history": 300,
        "documents": 120,
        "question": 25,
        "template": 3,
    }
    kinds.update(given)
    return ContextMeter(kinds, sum(kinds.values()), 256, 1024, left.get("left_out", ()))


def test_meter_widget_shows_each_kind_the_reply_room_and_free(qtbot: QtBot) -> None:
    view = ContextMeterView()
    qtbot.addWidget(view)
    view.set_context(488, 1024)
    assert view.text() == "Context: 488 / 1,024 tokens (48%)"
    assert view.bar.isHidden()  # nothing measured yet: the line alone
    view.set_meter(a_meter(left_out=(1, 2)))
    assert not view.bar.isHidden() and view.left_out.text() == "2 left out"
    tip = view.bar.toolTip()
    for words in ("System prompt", "40", "History", "300", "Documents", "120", "Question"):
        assert words in tip
    assert 'Kept for the reply</td><td align="right">256' in tip
    assert 'Free</td><td align="right">280' in tip  # 1024 - 488 - 256
    assert "Attachments" not in tip  # a kind with no tokens is not listed
    view.set_context(0, 0)  # no model: no size, no meter
    assert view.text() == "" and view.meter is None


def test_summary_block_saves_an_edit(qtbot: QtBot) -> None:
    block = SummaryBlock()
    qtbot.addWidget(block)
    block.set_text("They spoke of lamps.")
    assert not block.isHidden() and not block.save.isEnabled()
    block.editor.setPlainText("They spoke of lamps and oil.")
    with qtbot.waitSignal(block.edited) as sig:
        block.save.click()
    assert sig.args == ["They spoke of lamps and oil."]
    block.set_text(None)
    assert block.isHidden()


def test_the_drawer_offers_the_four_policies(qtbot: QtBot) -> None:
    store = ChatStore(":memory:")
    panel = ChatSettingsPanel(store, SamplingParams())
    qtbot.addWidget(panel)
    keys = [panel.policy.itemData(i) for i in range(panel.policy.count())]
    assert keys == ["drop_oldest", "stop", "truncate_middle", "summarise"]
    store.close()


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = open_window(qtbot, SamplingParams(temperature=0.0, max_tokens=16))
    yield w
    close_window(w)


@pytest.mark.model
def test_the_window_shows_the_prompt_sent_and_marks_what_it_left_out(
    window: MainWindow,
    qtbot: QtBot,
    smollm2_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    threads: list[str] = []

    def where(*args: Any) -> ContextMeter:
        threads.append(threading.current_thread().name)
        return measure(*args)

    monkeypatch.setattr("engine.host.chat_engine.measure", where)
    load(qtbot, window, smollm2_path, 512)
    window.controller.set_chat_settings(ChatSettings(context_policy="drop_oldest"))
    view = window.chat_view
    for i in range(1, 20):
        send(
            qtbot,
            window,
            f"Question {i}: one fact about lighthouses, the keeper, the lamp, the lens, "
            "the fog horn, the stairs and the stormy sea around the tower, please.",
        )
        meter = view.context_label.meter
        if meter is not None and meter.left_out:
            break
    meter = view.context_label.meter
    assert meter is not None and meter.left_out, "the chat should outgrow 512 tokens"
    # Measured off the GUI thread, for the prompt the reply was given.
    assert threads and threading.main_thread().name not in threads
    last = window.chat_model.message(window.chat_model.rowCount() - 1).stats
    assert last is not None
    assert sum(meter.kinds.values()) == meter.prompt_tokens == last.prompt_tokens
    # No system prompt: the request's messages are the rows, in order.
    marked = [
        i
        for i, w in enumerate(view.message_widgets)
        if w.left_out_label and w.left_out_label.isVisibleTo(w)
    ]
    assert marked == list(meter.left_out)
    shot = shots_dir(tmp_path) / "context-meter.png"
    if os.environ.get("CANDLEWICK_SCREENSHOTS"):
        view.scroll_area.verticalScrollBar().setValue(0)  # the left-out turns at the top
    save_shot(window, shot)


@pytest.mark.model
def test_summarise_in_the_window_shows_an_editable_summary(
    window: MainWindow, qtbot: QtBot, smollm2_path: Path, tmp_path: Path
) -> None:
    load(qtbot, window, smollm2_path, 512)
    window.controller.set_chat_settings(ChatSettings(context_policy="summarise"))
    view = window.chat_view
    for i in range(1, 20):
        send(
            qtbot,
            window,
            f"Question {i}: one fact about lighthouses, the keeper, the lamp, the lens, "
            "the fog horn, the stairs and the stormy sea around the tower, please.",
        )
        if not view.summary_block.isHidden():
            break
    block = view.summary_block
    assert not block.isHidden() and block.editor.toPlainText()
    meter = view.context_label.meter
    assert meter is not None and meter.kinds["summary"] > 0 and meter.left_out
    store, cid = window.controller.store, window.controller.conversation_id
    assert store is not None and cid is not None
    stored = store.summary(cid)
    assert stored is not None and stored.text == block.editor.toPlainText()
    block.editor.setPlainText("The person asked about lighthouses.")
    block.save.click()
    stored = store.summary(cid)
    assert stored is not None and stored.text == "The person asked about lighthouses."
    marked = [
        w for w in view.message_widgets if w.left_out_label and w.left_out_label.isVisibleTo(w)
    ]
    assert len(marked) == len(meter.left_out)
    shot = shots_dir(tmp_path) / "context-summary.png"
    if os.environ.get("CANDLEWICK_SCREENSHOTS"):
        view.scroll_area.verticalScrollBar().setValue(0)
    save_shot(window, shot)
