"""Push-to-talk on a real X server, recording from a virtual microphone (a private PulseAudio
daemon: virtual_mic.py) into which espeak-ng's speech of a known sentence is played while
the Speak button is held.

- With a text-only model, the recording is transcribed by the test speech-to-text model
  (random weights: the words mean nothing) and the message box gets exactly what
  whisper.cpp's own command line makes of the same recording with the same model. The
  recording Qt captured is not the played file bit for bit (PulseAudio resampled and mixed
  it), so whisper-cli reads the WAV the recorder produced; that recording is checked
  separately to resemble the played one (length, loudness, where the speech is).
- With SmolLM2 and the test audio projector, the recording goes with the message as an
  audio attachment, is kept with it, and is answered.
"""

from __future__ import annotations

import subprocess
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.services.speech_models import choose_stt_model
from app.ui.main_window import MainWindow
from engine.media.audio import decode_wav
from engine.settings import SamplingParams
from tests.app.ui.model_window import linked_folder, model_window
from tests.app.ui.shots import save_shot, shots_dir
from tests.app.ui.visual.virtual_mic import VirtualMicrophone, tier_microphone
from tests.speech_assets import SpeechAssets, whisper_cli_text

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
pytestmark = [
    pytest.mark.xserver,
    pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints"),
]


@pytest.fixture(scope="module")
def mic() -> Iterator[VirtualMicrophone]:
    with tier_microphone() as m:
        yield m


def wav_samples(data: bytes) -> np.ndarray:
    """A WAV as 16 kHz mono float samples (the engine's own reader)."""
    return np.frombuffer(decode_wav(data, 16000).pcm, np.float32)


def voiced(x: np.ndarray, threshold_db: float = -35.0) -> np.ndarray:
    """Which 20 ms frames of `x` (16 kHz) are louder than `threshold_db` of full scale."""
    n = len(x) // 320
    frames = x[: n * 320].reshape(n, 320).astype(np.float64)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    return rms > 10 ** (threshold_db / 20)


def talk(qtbot: QtBot, w: MainWindow, mic: VirtualMicrophone, clip: Path, shot: Path) -> bytes:
    """Hold Speak, play `clip` into the microphone, let go once it has all been recorded;
    the recording (a screenshot taken while it records)."""
    voice = w.chat_view.voice
    rec = voice.recorder
    qtbot.mousePress(voice.button, Qt.MouseButton.LeftButton)
    assert voice.recording
    qtbot.waitUntil(lambda: rec.seconds > 0.3, timeout=20_000)  # the stream runs
    with wave.open(str(clip)) as f:
        played_s = f.getnframes() / f.getframerate()
    before = rec.seconds
    player = subprocess.Popen(
        ["paplay", "--server", mic.server, "--device", "candlewick_feed", str(clip)]
    )
    try:
        qtbot.waitUntil(lambda: rec.seconds > before + played_s / 2, timeout=60_000)
        qtbot.waitUntil(lambda: voice.meter.rms > 0.2, timeout=20_000)
        save_shot(w, shot)
        qtbot.waitUntil(lambda: player.poll() is not None, timeout=60_000)
    finally:
        if player.poll() is None:
            player.kill()
        player.wait(10)
    assert player.returncode == 0
    # All of it, and some silence after: the device delivers in blocks.
    qtbot.waitUntil(lambda: rec.seconds > before + played_s + 0.5, timeout=60_000)
    assert voice.time_label.text() != "0:00"
    qtbot.mouseRelease(voice.button, Qt.MouseButton.LeftButton)
    assert not voice.recording
    assert voice.last_recording is not None
    return voice.last_recording


def check_resembles(recorded: bytes, clip: Path) -> None:
    """The recording holds the played speech: as long (plus the silence around it), as
    loud, and voiced for as many frames."""
    got, want = wav_samples(recorded), wav_samples(clip.read_bytes())
    assert len(got) > len(want)
    energy = float(np.sum(got.astype(np.float64) ** 2))
    assert energy == pytest.approx(float(np.sum(want.astype(np.float64) ** 2)), rel=0.25)
    assert int(voiced(got).sum()) == pytest.approx(int(voiced(want).sum()), rel=0.15)


@pytest.fixture
def audio_model(tmp_path: Path, smollm2_path: Path, audio_projector_path: Path) -> Path:
    """SmolLM2 (a link) with the test audio projector beside it, as a Hub repo has them."""
    return linked_folder(tmp_path / "Ultravox-test", smollm2_path, audio_projector_path)


def test_push_to_talk_sends_the_recording_to_a_model_that_hears(
    qtbot: QtBot,
    mic: VirtualMicrophone,
    speech_assets: SpeechAssets,
    audio_model: Path,
    tmp_path: Path,
) -> None:
    with model_window(qtbot, audio_model, GREEDY) as (w, entry):
        assert entry.capabilities == ("audio",)
        assert w.chat_view.attacher.check is not None
        assert w.chat_view.attacher.check("audio") is None  # the recording goes as audio
        clip = speech_assets.wavs["weather"]
        recorded = talk(qtbot, w, mic, clip, shots_dir(tmp_path) / "voice-recording.png")
        check_resembles(recorded, clip)
        c = w.controller
        qtbot.waitUntil(lambda: c.chat.rowCount() == 2 and not c.busy, timeout=300_000)
        question, answer = c.chat.message(0), c.chat.message(1)
        assert question.role == "user" and question.text == ""  # the recording alone
        (kept,) = question.attachments
        assert kept.kind == "audio" and kept.name.startswith("recording-")
        assert c.attachment_data(kept) == recorded  # kept with the message, as recorded
        assert answer.state == "done" and answer.stats is not None, answer.error
        assert c.loaded is not None and c.loaded.media == frozenset({"audio"})
        assert answer.stats.prompt_tokens > 150  # the projector's rows for the audio went in
        assert w.chat_view.attacher.items() == []
        sent = w.chat_view.message_widgets[0].attachments
        assert [t.name for t in sent.thumbs] == [kept.name]
        assert w.chat_view.input.toPlainText() == ""


@pytest.fixture
def text_model(tmp_path: Path, smollm2_path: Path) -> Path:
    return linked_folder(tmp_path / "text-only", smollm2_path, model_name="SmolLM2.gguf")


def test_push_to_talk_transcribes_into_the_box_as_whisper_cli_does(
    qtbot: QtBot,
    mic: VirtualMicrophone,
    speech_assets: SpeechAssets,
    whisper_cli: Path,
    text_model: Path,
    tmp_path: Path,
) -> None:
    choose_stt_model(speech_assets.stt_model)
    with model_window(qtbot, text_model, GREEDY) as (w, _):
        check = w.chat_view.attacher.check
        assert check is not None and check("audio") is not None  # it reads text only
        box, voice = w.chat_view.input, w.chat_view.voice
        qtbot.keyClicks(box, "Transcribed:")
        clip = speech_assets.wavs["lighthouse"]
        recorded = talk(qtbot, w, mic, clip, tmp_path / "recording.png")
        check_resembles(recorded, clip)
        assert voice.transcribing and voice.button.text() == "Transcribing…"
        qtbot.waitUntil(lambda: not voice.transcribing, timeout=120_000)
        saved = tmp_path / "recorded.wav"
        saved.write_bytes(recorded)
        threads = voice.transcription_threads()
        assert threads is not None
        expected, _ = whisper_cli_text(whisper_cli, speech_assets.stt_model, saved, threads=threads)
        assert expected  # the random model says something: the comparison means something
        assert box.toPlainText() == f"Transcribed: {expected}"
        assert w.banner.isHidden() or not w.banner.isVisible()
        assert not w.controller.busy and w.controller.chat.rowCount() == 0  # nothing sent
        assert w.chat_view.attacher.items() == []
