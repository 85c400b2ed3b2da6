"""Read aloud on a real X server with the real SmolLM2: a chat with auto-read on speaks its
answer as it streams, through the local engine (espeak-ng) played on the default audio
output (the tier's private PulseAudio daemon, whose default sink is a null sink: the same
Qt Multimedia path as on a desktop, heard by no one). The sentences spoken, in order, are the
answer's sentences. Read aloud on the finished answer with the audio written to a WAV gives
one file as long as its sentences. Screenshots of the answer's actions while it is read.

Run by test_xserver_tier.py on Xvfb; see conftest.py."""

from __future__ import annotations

import wave
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QRect, Qt
from pytestqt.qtbot import QtBot

from app.services.read_aloud import VoiceSettings
from app.ui.main_window import MainWindow
from app.ui.read_aloud import ReadAloudController, SpeechBar
from app.ui.speech_voices import LocalVoice, SinkOut, WavOut
from engine.settings import SamplingParams
from engine.speech.sentences import SentenceSplitter
from engine.speech.synth import Pcm, synthesize
from tests.app.ui.model_window import linked_folder, model_window
from tests.app.ui.shots import save_shot, shots_dir
from tests.app.ui.visual.virtual_mic import tier_microphone

pytestmark = [
    pytest.mark.xserver,
    pytest.mark.slow,
    pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints"),
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=60)
QUESTION = "Describe the sea in three short sentences."


@pytest.fixture(scope="module")
def speakers() -> Iterator[str]:
    """The default audio output: the tier's PulseAudio daemon, or this module's own."""
    with tier_microphone() as m:
        yield m.server


@pytest.fixture
def window(qtbot: QtBot, tmp_path: Path, smollm2_path: Path, speakers: str) -> Iterator[MainWindow]:
    folder = linked_folder(tmp_path / "text", smollm2_path)
    with model_window(qtbot, folder, GREEDY, QRect(0, 0, 1200, 800)) as (w, _):
        yield w


def sentences(text: str) -> list[str]:
    s = SentenceSplitter()
    return [x for x in s.feed(text) + s.flush() if x.strip()]


def reader_of(w: MainWindow) -> ReadAloudController:
    reader = w.findChild(ReadAloudController)
    assert reader is not None
    return reader


def test_auto_read_speaks_the_streamed_answer_sentence_by_sentence(
    window: MainWindow, qtbot: QtBot, tmp_path: Path
) -> None:
    w, view = window, window.chat_view
    reader = reader_of(w)
    assert isinstance(reader.voice, LocalVoice) and isinstance(reader.voice.out, SinkOut)
    said: list[tuple[str, Pcm]] = []
    reader.voice.uttered.connect(lambda text, pcm: said.append((text, pcm)))
    states: list[str] = []
    reader.state_changed.connect(lambda state, _source: states.append(state))
    assert w.chat_settings is not None
    w.chat_settings.auto_read.setChecked(True)
    qtbot.keyClicks(view.input, QUESTION)
    with qtbot.waitSignal(reader.finished, timeout=300_000) as done:
        qtbot.keyClick(view.input, Qt.Key.Key_Return)
        # Reading starts with the answer, before it is written.
        qtbot.waitUntil(lambda: reader.state == "speaking", timeout=120_000)
        qtbot.waitUntil(lambda: bool(said), timeout=120_000)
        answer = view.message_widgets[1]
        assert answer.read_aloud_button.text() == "Stop reading"
        bar = view.findChild(SpeechBar)
        assert bar is not None and bar.isVisible()
        answer.set_hovered(True)  # its actions shown, as under the mouse
        qtbot.wait(100)
        save_shot(w, shots_dir(tmp_path) / "read-aloud-speaking.png")
        save_shot(answer, shots_dir(tmp_path) / "read-aloud-actions.png")
    message = w.controller.chat.message(1)
    assert done.args == [message.id]
    assert message.state == "done" and message.text
    expected = sentences(message.text)
    assert len(expected) >= 2, message.text
    assert [t for t, _ in said] == expected
    for text, pcm in said:
        # Speech a sentence long: espeak-ng speaks about 10 to 25 characters a second.
        assert len(text) / 30 < pcm.seconds < len(text) / 5 + 1.0, (text, pcm.seconds)
    assert states[0] == "speaking" and states[-1] == "idle"
    assert answer.read_aloud_button.text() == "Read aloud" and not bar.isVisible()

    # Read aloud again, the audio written to a WAV: one file, as long as its sentences.
    path = tmp_path / "answer.wav"
    out = WavOut(path)
    voice = LocalVoice(reader.queue, VoiceSettings(), out=out, parent=reader)
    again: list[tuple[str, Pcm]] = []
    voice.uttered.connect(lambda text, pcm: again.append((text, pcm)))
    reader.queue.set_voice(voice)
    with qtbot.waitSignal(reader.finished, timeout=120_000):
        answer.read_aloud_button.click()
    out.close()
    voice.close()
    assert [t for t, _ in again] == expected
    with wave.open(str(path)) as f:
        frames, rate = f.getnframes(), f.getframerate()
    assert out.utterances == [len(p.samples) for _, p in again]
    assert frames == sum(out.utterances) and rate == again[0][1].rate
    # ...and within 10% of the answer's sentences spoken in one go.
    whole = synthesize(" ".join(expected)).seconds
    assert frames / rate == pytest.approx(whole, rel=0.10)
