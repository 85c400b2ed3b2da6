"""Push-to-talk in the composer, offscreen: the Speak button held or clicked, the keys, Esc,
the level meter and the time recorded, and where a recording goes (attached and sent, or
a one-line reason it is not transcribed).

The recorder here is the real `VoiceRecorder` with its device replaced by what the test
feeds it (`FedRecorder`): its conversion, level, elapsed time and WAV are the product's. The
X-server tier records from a real (virtual) microphone (tests/app/ui/visual/test_voice.py).
"""

from __future__ import annotations

import io
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import QApplication, QVBoxLayout, QWidget
from pytestqt.qtbot import QtBot

from app.services.voice_clip import RawFormat
from app.ui import voice_input
from app.ui.attacher import Attacher
from app.ui.composer import Composer
from app.ui.voice_input import NO_SPEECH_MODEL, TOO_SHORT, VoiceInput
from app.ui.voice_recorder import NO_MICROPHONE, VoiceRecorder

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

# A 48 kHz stereo float device, so every recording is converted.
DEVICE = RawFormat(48000, 2, "float32")


class FedRecorder(VoiceRecorder):
    """The recorder with no device: `feed` is the microphone."""

    def __init__(self, fail: str | None = None) -> None:
        super().__init__()
        self.fail = fail

    def _open(self) -> bool:
        if self.fail is not None:
            self.failed.emit(self.fail)
            return False
        self._begin(DEVICE, "test input")
        self.started.emit()
        return True

    def speak(self, seconds: float, amp: float = 0.3) -> None:
        t = np.arange(round(seconds * DEVICE.rate)) / DEVICE.rate
        x = (amp * np.sin(2 * np.pi * 220 * t)).astype("<f4")
        self.feed(np.repeat(x, 2).tobytes())


@dataclass
class Pane:
    widget: QWidget
    voice: VoiceInput
    recorder: FedRecorder
    attacher: Attacher
    sent: list[int] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


def build(qtbot: QtBot, reads_audio: bool, fail: str | None = None) -> Pane:
    w = QWidget()
    qtbot.addWidget(w)
    attacher = Attacher(w)
    attacher.check = (lambda _k: None) if reads_audio else (lambda _k: "text only")
    recorder = FedRecorder(fail)
    sent: list[int] = []

    def send() -> bool:
        sent.append(len(attacher.items()))
        return True

    voice = VoiceInput(attacher, send, w, recorder=recorder)
    recorder.setParent(voice)
    composer = Composer(attacher, voice)
    QVBoxLayout(w).addWidget(composer)
    w.show()
    qtbot.waitExposed(w)
    pane = Pane(w, voice, recorder, attacher, sent)
    voice.notice.connect(pane.notices.append)
    voice.stt_model = lambda: None
    return pane


@pytest.fixture
def audio_pane(qtbot: QtBot) -> Iterator[Pane]:
    p = build(qtbot, reads_audio=True)
    yield p
    p.voice.shutdown()


@pytest.fixture
def text_pane(qtbot: QtBot) -> Iterator[Pane]:
    p = build(qtbot, reads_audio=False)
    yield p
    p.voice.shutdown()


def wav_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as f:
        assert (f.getnchannels(), f.getsampwidth(), f.getframerate()) == (1, 2, 16000)
        return f.getnframes() / f.getframerate()


def test_idle_state(audio_pane: Pane) -> None:
    v = audio_pane.voice
    assert v.button.text() == "Speak" and v.button.isEnabled()
    assert "Ctrl+Shift+Space" in v.button.toolTip()
    assert not v.meter.isVisible() and not v.time_label.isVisible()


def test_held_button_records_shows_level_and_time_and_sends_the_recording(
    qtbot: QtBot, audio_pane: Pane
) -> None:
    v, rec = audio_pane.voice, audio_pane.recorder
    v.hold_s = 0.0  # every release ends it: push-to-talk
    qtbot.mousePress(v.button, Qt.MouseButton.LeftButton)
    assert v.recording and v.button.text() == "Listening…"
    assert v.meter.isVisible() and v.time_label.isVisible()
    rec.speak(1.25)
    qtbot.waitUntil(lambda: v.time_label.text() == "0:01")
    qtbot.waitUntil(lambda: v.meter.rms > 0.5)  # -13 dB of a 0.3 sine: most of the bar
    assert v.meter.peak >= v.meter.rms
    qtbot.mouseRelease(v.button, Qt.MouseButton.LeftButton)
    assert not v.recording and v.button.text() == "Speak" and not v.meter.isVisible()
    (item,) = audio_pane.attacher.items()
    assert item.kind == "audio" and item.name.startswith("recording-")
    assert item.name.endswith(".wav") and item.data == v.last_recording
    assert wav_seconds(item.data) == pytest.approx(1.25, abs=1 / 16000)
    assert audio_pane.sent == [1] and audio_pane.notices == []


def test_a_click_starts_and_the_next_click_ends(qtbot: QtBot, audio_pane: Pane) -> None:
    v, rec = audio_pane.voice, audio_pane.recorder
    v.hold_s = 3600.0  # every release is a quick one: a toggle
    qtbot.mouseClick(v.button, Qt.MouseButton.LeftButton)
    assert v.recording and v.button.isDown() and v.button.text() == "Listening…"
    rec.speak(0.5)
    assert audio_pane.sent == []
    qtbot.mouseClick(v.button, Qt.MouseButton.LeftButton)
    assert not v.recording and not v.button.isDown()
    assert audio_pane.sent == [1]
    assert wav_seconds(audio_pane.attacher.items()[0].data) == pytest.approx(0.5, abs=1e-4)


def test_esc_cancels_nothing_is_sent_or_kept_and_the_window_esc_waits(
    qtbot: QtBot, audio_pane: Pane
) -> None:
    v, rec = audio_pane.voice, audio_pane.recorder
    stops: list[bool] = []
    stop = QAction("Stop", audio_pane.widget)
    stop.setShortcut(QKeySequence("Esc"))
    stop.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    stop.triggered.connect(lambda: stops.append(True))
    audio_pane.widget.addAction(stop)
    assert v.box is not None
    v.box.setPlainText("typed before")
    v.box.setFocus()
    v.hold_s = 3600.0
    qtbot.mouseClick(v.button, Qt.MouseButton.LeftButton)
    rec.speak(0.8)
    with qtbot.waitSignal(rec.cancelled):
        qtbot.keyClick(v.box, Qt.Key.Key_Escape)
    assert not v.recording and v.button.text() == "Speak"
    assert audio_pane.attacher.items() == [] and audio_pane.sent == []
    assert v.last_recording is None and v.box.toPlainText() == "typed before"
    assert stops == []  # Esc was the recording's
    qtbot.keyClick(v.box, Qt.Key.Key_Escape)  # not recording: the window's again
    assert stops == [True]


def test_the_shortcut_held_ends_on_the_space_key_release(qtbot: QtBot, audio_pane: Pane) -> None:
    v, rec = audio_pane.voice, audio_pane.recorder
    v.hold_s = 0.0
    v.shortcut()
    assert v.recording
    rec.speak(0.6)
    mods = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    repeat = QKeyEvent(QEvent.Type.KeyRelease, Qt.Key.Key_Space, mods, " ", True)
    QApplication.sendEvent(audio_pane.widget, repeat)
    assert v.recording  # an auto-repeat's release is not the key coming up
    QApplication.sendEvent(
        audio_pane.widget, QKeyEvent(QEvent.Type.KeyRelease, Qt.Key.Key_Space, mods)
    )
    assert not v.recording and audio_pane.sent == [1]


def test_the_shortcut_tapped_is_a_toggle(audio_pane: Pane) -> None:
    v, rec = audio_pane.voice, audio_pane.recorder
    v.hold_s = 3600.0
    v.shortcut()
    QApplication.sendEvent(
        audio_pane.widget,
        QKeyEvent(QEvent.Type.KeyRelease, Qt.Key.Key_Space, Qt.KeyboardModifier.NoModifier),
    )
    assert v.recording
    rec.speak(0.4)
    v.shortcut()
    assert not v.recording and audio_pane.sent == [1]


def test_too_short_a_recording_is_not_used(qtbot: QtBot, audio_pane: Pane) -> None:
    v, rec = audio_pane.voice, audio_pane.recorder
    v.hold_s = 0.0
    qtbot.mousePress(v.button, Qt.MouseButton.LeftButton)
    rec.speak(0.1)
    qtbot.mouseRelease(v.button, Qt.MouseButton.LeftButton)
    assert audio_pane.notices == [TOO_SHORT] and audio_pane.attacher.items() == []


def test_no_speech_model_is_one_line_and_the_draft_stays(qtbot: QtBot, text_pane: Pane) -> None:
    v, rec = text_pane.voice, text_pane.recorder
    assert v.box is not None
    v.box.setPlainText("my draft")
    v.hold_s = 0.0
    qtbot.mousePress(v.button, Qt.MouseButton.LeftButton)
    rec.speak(0.7)
    qtbot.mouseRelease(v.button, Qt.MouseButton.LeftButton)
    assert text_pane.notices == [NO_SPEECH_MODEL] and "\n" not in NO_SPEECH_MODEL
    assert v.box.toPlainText() == "my draft"
    assert text_pane.attacher.items() == [] and text_pane.sent == []
    assert v.button.text() == "Speak" and v.button.isEnabled()


def test_no_microphone_is_one_line_and_speak_is_ready_again(qtbot: QtBot) -> None:
    p = build(qtbot, reads_audio=True, fail=NO_MICROPHONE)
    try:
        qtbot.mousePress(p.voice.button, Qt.MouseButton.LeftButton)
        qtbot.mouseRelease(p.voice.button, Qt.MouseButton.LeftButton)
        assert p.notices == [NO_MICROPHONE]
        assert not p.voice.recording and p.voice.button.text() == "Speak"
        assert p.voice.button.isEnabled() and p.sent == []
    finally:
        p.voice.shutdown()


def test_without_qt_multimedia_speak_is_disabled_and_says_why(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    why = "Voice input needs Qt Multimedia, which is not available here (no module)"
    monkeypatch.setattr(voice_input, "unavailable", lambda: why)
    p = build(qtbot, reads_audio=True)
    try:
        assert not p.voice.button.isEnabled() and p.voice.button.toolTip() == why
    finally:
        p.voice.shutdown()


def test_a_transcript_goes_in_at_the_cursor_spaced_from_its_neighbours(text_pane: Pane) -> None:
    v = text_pane.voice
    assert v.box is not None
    v.box.setPlainText("Hello world")
    cursor = v.box.textCursor()
    cursor.setPosition(5)
    v.box.setTextCursor(cursor)
    v.insert("there")
    assert v.box.toPlainText() == "Hello there world"
    cursor.movePosition(cursor.MoveOperation.End)
    v.box.setTextCursor(cursor)
    v.insert("again.")
    assert v.box.toPlainText() == "Hello there world again."
