"""Hands-free in the window, offscreen, with the real SmolLM2 and the test transcription
model: espeak-ng's question fed to the recorder as a 48 kHz stereo float microphone gives it
(the code path below Qt's audio source: `VoiceRecorder.feed`); the turn's end is found, the
turn transcribed by whisper.cpp, sent, answered and read aloud (on Qt TextToSpeech's test
engine: no sound), and then the microphone listens again."""

from __future__ import annotations

import io
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pytestqt.qtbot import QtBot

from app.services.read_aloud import VoiceSettings
from app.services.voice_clip import RawFormat, resample
from app.ui.hands_free import HandsFreeController, ListeningRecorder
from app.ui.main_window import MainWindow
from app.ui.read_aloud import ReadAloudController, SpeechBar
from app.ui.speech_voices import SystemVoice
from engine.settings import SamplingParams
from engine.speech.sentences import SentenceSplitter
from tests.app.ui.model_window import linked_folder, model_window

pytestmark = [
    pytest.mark.slow,
    pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints"),
]
DEVICE = RawFormat(48000, 2, "float32")


class FedRecorder(ListeningRecorder):
    """The recorder with no device: `feed` is the microphone."""

    def _open(self) -> bool:
        self._begin(DEVICE, "test input")
        self.started.emit()
        return True


def device_blocks(wav: Path, hiss_s: float = 2.5) -> list[bytes]:
    """The WAV (16 kHz mono) with quiet hiss around it, as the device's 20 ms blocks."""
    with wave.open(io.BytesIO(wav.read_bytes())) as f:
        rate = f.getframerate()
        x = np.frombuffer(f.readframes(f.getnframes()), "<i2").astype(np.float32) / 32768.0
    rng = np.random.default_rng(7)
    lead = rng.normal(0, 0.001, round(0.5 * rate)).astype(np.float32)
    tail = rng.normal(0, 0.001, round(hiss_s * rate)).astype(np.float32)
    y = resample(np.concatenate([lead, x, tail]), rate, DEVICE.rate).astype("<f4")
    frames = np.repeat(y, 2).tobytes()  # stereo, interleaved
    step = DEVICE.rate // 50 * DEVICE.frame_bytes
    return [frames[i : i + step] for i in range(0, len(frames), step)]


@pytest.fixture
def window(qtbot: QtBot, tmp_path: Path, smollm2_path: Path) -> Iterator[MainWindow]:
    folder = linked_folder(tmp_path / "text", smollm2_path)
    with model_window(qtbot, folder, SamplingParams(temperature=0.0, max_tokens=24)) as (w, _):
        yield w


def test_hands_free_turn_after_turn(window: MainWindow, qtbot: QtBot, speech_assets: Any) -> None:
    w = window
    reader = w.findChild(ReadAloudController)
    hf = w.findChild(HandsFreeController)
    assert reader is not None and hf is not None
    voice = SystemVoice(reader.queue, VoiceSettings(rate=2.0), engine="mock", parent=reader)
    reader.queue.set_voice(voice)
    said: list[str] = []
    voice.uttered.connect(lambda text, _audio: said.append(text))
    rec = FedRecorder()
    hf.use_recorder(rec)
    hf.stt_model = lambda: speech_assets.stt_model
    states: list[str] = []
    hf.state_changed.connect(states.append)
    assert w.chat_settings is not None and not w.chat_settings.auto_read.isChecked()

    hf.set_on(True)
    assert hf.state == "listening" and rec.recording
    bar = w.chat_view.findChild(SpeechBar)
    assert bar is not None and bar.hands_free_label.text() == "Hands-free: listening…"
    for block in device_blocks(speech_assets.wavs["weather"]):
        rec.feed(block)
    # The turn ended on the hiss after the question: the microphone is off, it transcribes.
    assert states == ["listening", "hearing", "transcribing"]
    assert not rec.recording
    c = w.controller
    qtbot.waitUntil(lambda: hf.state == "listening", timeout=300_000)
    assert states == ["listening", "hearing", "transcribing", "answering", "listening"]
    assert rec.recording  # listening for the next turn
    question, answer = c.chat.message(0), c.chat.message(1)
    assert hf.last_transcript and question.role == "user"
    assert question.text == hf.last_transcript.strip()
    assert answer.state == "done" and answer.text, answer.error
    # The answer was read aloud (the chat's auto-read is off: hands-free reads it).
    s = SentenceSplitter()
    assert said == [x for x in s.feed(answer.text) + s.flush() if x.strip()]
    hf.set_on(False)
    assert hf.state == "off" and not rec.recording and bar.isHidden()
