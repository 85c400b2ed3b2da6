"""The chat's system prompt is shown above its messages, follows the settings drawer and the
conversation opened, and is hidden for a chat without one."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.main import build_window

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def test_system_prompt_line_follows_the_chat(qtbot: QtBot) -> None:
    w = build_window()
    try:
        w.show()
        qtbot.waitExposed(w)
        line, panel, store = w.chat_view.system_label, w.chat_settings, w.store
        assert panel is not None and store is not None
        assert not line.isVisible()
        panel.system_prompt.setPlainText("You only answer in French.")
        assert line.isVisible() and line.text() == "System prompt: You only answer in French."

        long_prompt = "Be brief. " * 40
        c = store.create_conversation("Pirate", settings={"system_prompt": long_prompt})
        store.add_message(c.id, "user", "Hello")
        w.open_conversation(c.id)
        assert line.isVisible() and line.toolTip() == long_prompt.strip()
        assert line.text().endswith("…") and len(line.text()) <= len("System prompt: ") + 200

        w.new_chat()
        assert not line.isVisible()
    finally:
        w.close()
        w.shutdown()
        w.deleteLater()
        QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
