"""Read aloud in the window: the Qt side of `app.services.read_aloud.ReadAloud`.

`ReadAloudController` follows the chat's item model: an answer that starts streaming in a
chat with auto-read on is read as it streams (each change's new text fed to the queue), a
finished one when its Read aloud button is pressed. A new question, another chat, or Stop on
the answer silences it. `SpeechBar` shows the reading with Pause/Resume and Stop above the
composer; the window's actions give them keys.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import (
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QSettings,
    Signal,
)
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QWidget

from app.services.read_aloud import NothingPlaying, ReadAloud, ReadState, VoiceSettings
from app.ui.chat_model import ChatModel
from app.ui.chat_view import ChatView
from app.ui.speech_voices import LocalVoice, MakeVoice, Speaker, make_voice

Index = QModelIndex | QPersistentModelIndex
SETTINGS_GROUP = "speech"
HANDS_FREE_WORDS = {
    "listening": "listening…",
    "hearing": "hearing you…",
    "transcribing": "writing down what you said…",
    "answering": "answering",
}


def voice_settings(settings: QSettings) -> VoiceSettings:
    """The voice kept in the app's settings."""
    stored = {k: settings.value(f"{SETTINGS_GROUP}/{k}") for k in ("engine", "voice", "rate")}
    return VoiceSettings.from_stored({k: v for k, v in stored.items() if v is not None})


def save_voice_settings(settings: QSettings, voice: VoiceSettings) -> None:
    for k, v in voice.to_stored().items():
        settings.setValue(f"{SETTINGS_GROUP}/{k}", v)


class ReadAloudController(QObject):
    # (idle | speaking | paused, the id of the message read or None)
    state_changed = Signal(str, object)
    finished = Signal(str)  # every sentence of this message was spoken
    error = Signal(str)

    def __init__(
        self,
        chat: ChatModel,
        view: ChatView,
        voice: VoiceSettings,
        *,
        auto_read: Callable[[], bool],
        make: MakeVoice = make_voice,
        parent: QObject | None = None,
    ) -> None:
        """`auto_read`: whether the chat on screen reads its answers as they stream;
        `make`: builds the voice the settings name."""
        super().__init__(parent)
        self.chat, self.view = chat, view
        self._auto_read = auto_read
        self._make = make
        self.queue = ReadAloud(_NoVoice(), _Listener(self))
        self.voice: Speaker = make(self.queue, voice, self)
        self.queue.set_voice(self.voice)
        self._seen = 0  # characters of the answer read so far given to the queue
        self._speaking_row: int | None = None
        chat.rowsInserted.connect(self._on_inserted)
        chat.dataChanged.connect(self._on_changed)
        chat.modelReset.connect(self.stop)  # another chat, or a new one
        chat.rowsRemoved.connect(self._on_removed)
        view.message_action.connect(self._on_action)

    @property
    def state(self) -> ReadState:
        return self.queue.state

    def use_voice(self, voice: VoiceSettings) -> None:
        """Read with another voice from now on."""
        self.queue.stop()
        old = self.voice
        self.voice = self._make(self.queue, voice, self)
        self.queue.set_voice(self.voice)
        _close(old)

    def read_row(self, row: int) -> None:
        """Read the message at `row` (its text so far, and the rest if it still streams)."""
        m = self.chat.message(row)
        self.queue.start(m.id)
        self._seen = 0
        self._mark(row)
        self._follow(row)

    def say(self, text: str) -> None:
        """Read `text`, not a message (the voice settings' sample)."""
        self.queue.read("sample", text)

    def stop(self) -> None:
        self.queue.stop()

    def toggle_pause(self) -> None:
        self.queue.toggle_pause()

    def close(self) -> None:
        self.queue.stop()
        _close(self.voice)

    # -- the chat's model ------------------------------------------------------------------

    def _row_of(self, message_id: str | None) -> int | None:
        for row in range(self.chat.rowCount()):
            if self.chat.message(row).id == message_id:
                return row
        return None

    def _on_inserted(self, _parent: Index, first: int, last: int) -> None:
        for row in range(first, last + 1):
            m = self.chat.message(row)
            if m.role == "user":
                self.stop()  # the user asked something else
            elif (
                m.role == "assistant"
                and m.state == "streaming"
                and m.answer_format == "markdown"
                and self._auto_read()
            ):
                self.read_row(row)

    def _on_changed(self, top: Index, bottom: Index, _roles: object = None) -> None:
        row = self._row_of(self.queue.source)
        if row is not None and top.row() <= row <= bottom.row():
            self._follow(row)

    def _follow(self, row: int) -> None:
        """Give the queue the new text of the message read; finish it once it is done."""
        m = self.chat.message(row)
        if len(m.text) > self._seen:
            delta, self._seen = m.text[self._seen :], len(m.text)
            self.queue.feed(m.id, delta)
        if m.state == "stopped":
            self.stop()  # Stop on the answer: the reading stops with it
        elif m.state != "streaming":
            self.queue.finish(m.id)

    def _on_removed(self, *_args: object) -> None:
        if self.queue.source is not None and self._row_of(self.queue.source) is None:
            self.stop()

    def _on_action(self, name: str, row: int) -> None:
        if name != "read_aloud" or not 0 <= row < self.chat.rowCount():
            return
        if self.queue.source == self.chat.message(row).id:
            self.stop()  # "Stop reading"
        else:
            self.read_row(row)

    # -- the view --------------------------------------------------------------------------

    def _mark(self, row: int | None) -> None:
        """The message read shows "Stop reading" in place of Read aloud."""
        widgets = self.view.message_widgets
        if self._speaking_row is not None and self._speaking_row < len(widgets):
            widgets[self._speaking_row].set_speaking(False)
        self._speaking_row = row
        if row is not None and row < len(widgets):
            widgets[row].set_speaking(True)

    def _state(self, state: ReadState, source: str | None) -> None:
        if state == "idle":
            self._mark(None)
        self.state_changed.emit(state, source)


class _NoVoice(NothingPlaying):
    """The queue's voice until the real one is made (it needs the queue to speak to)."""

    def speak(self, text: str, token: int) -> None:
        raise RuntimeError("no voice yet")

    def prepare(self, text: str) -> None:
        pass


class _Listener:
    def __init__(self, c: ReadAloudController) -> None:
        self.c = c

    def state_changed(self, state: ReadState, source: str | None) -> None:
        self.c._state(state, source)

    def finished(self, source: str) -> None:
        self.c.finished.emit(source)

    def failed(self, message: str) -> None:
        self.c.error.emit(message)


def _close(voice: Speaker) -> None:
    if isinstance(voice, LocalVoice):
        voice.close()
    voice.deleteLater()


class SpeechBar(QWidget):
    """Above the composer while an answer is read: what is happening, Pause/Resume, Stop."""

    def __init__(self, reader: ReadAloudController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("speechBar")
        self.setAccessibleName("Reading aloud")
        self.label = QLabel()
        self.label.setAccessibleName("Speech")
        self.pause_button = QToolButton()
        self.pause_button.setAutoRaise(True)
        self.pause_button.clicked.connect(reader.toggle_pause)
        self.stop_button = QToolButton()
        self.stop_button.setText("Stop reading")
        self.stop_button.setToolTip("Stop reading aloud · Ctrl+Alt+S")
        self.stop_button.setAccessibleName("Stop reading")
        self.stop_button.setAutoRaise(True)
        self.stop_button.clicked.connect(reader.stop)
        # Hands-free's state ("listening", ...) and the button that ends it.
        self.hands_free_label = QLabel()
        self.hands_free_label.setAccessibleName("Hands-free")
        self.hands_free_button = QToolButton()
        self.hands_free_button.setText("End hands-free")
        self.hands_free_button.setToolTip("Stop listening for the next question · Ctrl+Alt+H")
        self.hands_free_button.setAutoRaise(True)
        self._hands_free = "off"
        self._reading = "idle"
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 0, 10, 0)
        lay.addWidget(self.hands_free_label)
        lay.addWidget(self.label)
        lay.addStretch(1)
        lay.addWidget(self.pause_button)
        lay.addWidget(self.stop_button)
        lay.addWidget(self.hands_free_button)
        reader.state_changed.connect(self.show_state)
        self.show_state(reader.state, None)

    def show_hands_free(self, state: str) -> None:
        self._hands_free = state
        words = HANDS_FREE_WORDS.get(state, "")
        self.hands_free_label.setText(f"Hands-free: {words}" if words else "")
        self.hands_free_label.setVisible(bool(words))
        self.hands_free_button.setVisible(state != "off")
        self.setVisible(self._reading != "idle" or state != "off")

    def show_state(self, state: str, _source: object = None) -> None:
        self._reading = state
        self.setVisible(state != "idle" or self._hands_free != "off")
        self.label.setVisible(state != "idle")
        self.pause_button.setVisible(state != "idle")
        self.stop_button.setVisible(state != "idle")
        self.hands_free_button.setVisible(self._hands_free != "off")
        paused = state == "paused"
        self.label.setText("Paused" if paused else "Reading aloud…")
        self.pause_button.setText("Resume" if paused else "Pause")
        self.pause_button.setToolTip(
            f"{'Resume' if paused else 'Pause'} reading aloud · Ctrl+Alt+P"
        )
        self.pause_button.setAccessibleName(self.pause_button.text())


__all__ = [
    "ReadAloudController",
    "SpeechBar",
    "save_voice_settings",
    "voice_settings",
]
