"""The sampling defaults (engine.host.runtime.SamplingParams) are the anchors' (llama.cpp, Ollama,
LM Studio) and the chat settings and `candlewick run` show the same ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.cli import build_parser
from app.services.chat_store import ChatStore
from app.ui.chat_settings import ChatSettingsPanel
from engine.settings import SamplingParams

ANCHORED = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "repeat_penalty": 1.1,
    "repeat_last_n": 64,
}


def test_defaults_are_the_anchored_ones() -> None:
    d = SamplingParams()
    assert {k: getattr(d, k) for k in ANCHORED} == ANCHORED


def test_chat_settings_and_the_cli_show_the_same_defaults(qtbot: QtBot, tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.sqlite3")
    try:
        panel = ChatSettingsPanel(store)
        qtbot.addWidget(panel)
        shown = {
            "temperature": panel.temperature.value(),
            "top_k": panel.top_k.value(),
            "top_p": panel.top_p.value(),
            "min_p": panel.min_p.value(),
            "repeat_penalty": panel.repeat_penalty.value(),
        }
        assert shown == pytest.approx({k: ANCHORED[k] for k in shown})
        assert panel.settings() == {}  # nothing differs: nothing is stored with a chat
    finally:
        store.close()
    args = build_parser().parse_args(["run", "default", "hi"])
    assert (args.temperature, args.top_k, args.top_p, args.min_p, args.repeat_penalty) == (
        0.8,
        40,
        0.95,
        0.05,
        1.1,
    )
