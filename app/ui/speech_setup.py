"""Speech out and hands-free, added to the window: the reader of answers, its bar above the
composer, Tools → Voice…, and the keys (Ctrl+Alt+P pause or resume, Ctrl+Alt+S stop
reading, Ctrl+Alt+H hands-free). Esc, which stops an answer, stops its reading too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QVBoxLayout

from app.services.chat_settings import ChatSettings
from app.ui.hands_free import HandsFreeController
from app.ui.main_window import MainWindow
from app.ui.read_aloud import (
    ReadAloudController,
    SpeechBar,
    save_voice_settings,
    voice_settings,
)
from app.ui.speech_voices import SystemVoice
from app.ui.voice_settings import VoiceSettingsPanel


@dataclass
class Speech:
    reader: ReadAloudController
    bar: SpeechBar
    panel: VoiceSettingsPanel
    hands_free: HandsFreeController
    hands_free_action: QAction


def add_speech(window: MainWindow) -> Speech:
    view, c = window.chat_view, window.controller
    hands_free: HandsFreeController | None = None

    def auto_read() -> bool:
        chat = ChatSettings.from_stored(c.chat_settings)
        return chat.auto_read or (hands_free is not None and hands_free.on)

    reader = ReadAloudController(
        window.chat_model, view, voice_settings(window.settings), auto_read=auto_read, parent=window
    )
    reader.error.connect(window.show_error)
    hands_free = HandsFreeController(reader, c.send, parent=window)
    hands_free.notice.connect(window.show_error)
    c.busy_changed.connect(lambda busy: None if busy else hands_free.reply_ended())

    bar = SpeechBar(reader)
    lay = view.layout()
    assert isinstance(lay, QVBoxLayout)  # the chat view's column
    lay.insertWidget(lay.indexOf(view.composer), bar)
    bar.hands_free_button.clicked.connect(lambda: hands_free.set_on(False))
    hands_free.state_changed.connect(bar.show_hands_free)

    def system_voices() -> tuple[list[str], str | None]:
        probe = SystemVoice(reader.queue, voice_settings(window.settings))
        try:
            return probe.voices(), probe.problem
        finally:
            probe.deleteLater()

    panel = VoiceSettingsPanel(
        voice_settings(window.settings), local_voices=_local_voices, system_voices=system_voices
    )

    def chosen(voice: object) -> None:
        save_voice_settings(window.settings, voice)  # type: ignore[arg-type]
        reader.use_voice(voice)  # type: ignore[arg-type]

    panel.changed.connect(chosen)
    panel.sample_requested.connect(reader.say)
    panel.hands_free_toggled.connect(hands_free.set_on)
    hands_free.state_changed.connect(lambda state: panel.set_hands_free(state != "off"))
    window.add_tool_window("Voice…", panel, "Ctrl+Alt+V", _closer(reader, hands_free))

    window.add_shortcut("Pause or resume reading aloud", "Ctrl+Alt+P", reader.toggle_pause)
    window.add_shortcut("Stop reading aloud", "Ctrl+Alt+S", reader.stop)
    toggle = window.add_shortcut(
        "Hands-free", "Ctrl+Alt+H", lambda: hands_free.set_on(not hands_free.on)
    )
    window.stop_action.triggered.connect(reader.stop)
    view.stop_requested.connect(reader.stop)
    return Speech(reader, bar, panel, hands_free, toggle)


def _local_voices() -> list[str]:
    from engine.speech.synth import voices

    return list(voices())


def _closer(reader: ReadAloudController, hands_free: HandsFreeController) -> Callable[[], None]:
    def close() -> None:
        hands_free.shutdown()
        reader.close()

    return close


__all__ = ["Speech", "add_speech"]
