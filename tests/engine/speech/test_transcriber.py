"""engine.speech.transcriber on the tiny random-weight whisper model (tests/speech_assets.py):
the transcript equals whisper.cpp's own whisper-cli's for the same model, file and options,
and bad input is one line. The model is noise, so the text is meaningless but exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import EngineError
from engine.media.images import MediaError
from engine.model.whisper_file import WhisperFileError
from engine.speech.transcriber import Transcriber, TranscriptionRefused
from tests.speech_assets import SpeechAssets, whisper_cli_text

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def transcriber(speech_assets: SpeechAssets) -> object:
    t = Transcriber(speech_assets.stt_model, threads=2)
    yield t
    t.close()


@pytest.mark.parametrize(
    ("wav", "options"),
    [
        ("weather", {}),
        ("lighthouse", {"language": "en"}),
        ("weather", {"translate": True, "prompt": "Paris"}),
    ],
)
def test_transcript_equals_whisper_cli(
    transcriber: Transcriber,
    speech_assets: SpeechAssets,
    whisper_cli: Path,
    wav: str,
    options: dict[str, object],
) -> None:
    path = speech_assets.wavs[wav]
    ours = transcriber.transcribe_wav(path.read_bytes(), **options)  # type: ignore[arg-type]
    text, language = whisper_cli_text(whisper_cli, speech_assets.stt_model, path, **options)  # type: ignore[arg-type]
    assert ours.text and ours.text == text
    assert ours.language == language
    assert ours.segments and " ".join(s.text for s in ours.segments).split() == text.split()
    assert all(0 <= s.start_s <= s.end_s for s in ours.segments)
    assert ours.audio_seconds == pytest.approx(path.stat().st_size / 2 / 16000, abs=0.01)


def test_the_child_ends_cleanly_on_close(speech_assets: SpeechAssets) -> None:
    """Closing ends the child's input; it frees the model and exits with 0 (a log callback
    left set in whisper.cpp would abort it during the interpreter's finalization)."""
    t = Transcriber(speech_assets.stt_model, threads=1)
    proc = t._proc
    assert proc is not None and t.pid == proc.pid
    t.close()
    assert proc.returncode == 0 and t.pid is None
    with pytest.raises(EngineError, match="closed"):
        t.transcribe(np.zeros(1600, np.float32))


def test_samples_and_wav_agree(transcriber: Transcriber, speech_assets: SpeechAssets) -> None:
    from engine.media.audio import decode_wav

    data = speech_assets.wavs["weather"].read_bytes()
    samples = np.frombuffer(decode_wav(data, 16000).pcm, dtype=np.float32)
    assert transcriber.transcribe(samples) == transcriber.transcribe_wav(data)


def test_refusals_are_one_line(transcriber: Transcriber, tmp_path: Path) -> None:
    with pytest.raises(TranscriptionRefused, match="no language 'xx'") as refused:
        transcriber.transcribe(np.zeros(16000, np.float32), language="xx")
    assert refused.value.field == "language"
    with pytest.raises(MediaError, match="not a WAV file"):
        transcriber.transcribe_wav(b"RIFX" + bytes(100))
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(WhisperFileError) as e:
        Transcriber(bad)
    assert "\n" not in str(e.value)


def test_a_model_whisper_cpp_aborts_on_fails_the_call_not_the_process(tmp_path: Path) -> None:
    """whisper.cpp loads an all-f32 file (ftype 0) and then asserts inside its convolution:
    the child dies, the caller gets one line naming the assert, and this process goes on."""
    from tests.speech_assets import write_whisper_model

    f32 = write_whisper_model(tmp_path / "f32.bin", ftype=0)
    t = Transcriber(f32, threads=1)
    try:
        for _ in range(2):  # the second call starts the child again and dies the same way
            with pytest.raises(EngineError) as e:
                t.transcribe(np.zeros(8000, np.float32))
            message = str(e.value)
            assert "\n" not in message and "f32.bin" in message
            assert "SIGABRT" in message and "GGML_ASSERT" in message
    finally:
        t.close()
