"""The chosen transcription model: kept across restarts in the profile, refused when it is not
a whisper.cpp model, forgotten when its file is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.services.paths import AppPaths
from app.services.speech_models import choose_stt_model, clear_stt_model, current_stt_model
from engine.model.whisper_file import WhisperFileError
from tests.whisper_bin import write_whisper


def test_choice_is_kept_in_the_profile(tmp_path: Path) -> None:
    assert current_stt_model() is None
    p = write_whisper(tmp_path / "ggml-tiny.bin")
    chosen = choose_stt_model(p)
    assert chosen.model_type == "tiny"
    assert current_stt_model() == p.absolute()
    assert (AppPaths.default().config / "speech.json").is_file()
    clear_stt_model()
    assert current_stt_model() is None


def test_a_chat_model_is_refused_and_the_choice_stays(tmp_path: Path, smollm2_path: Path) -> None:
    p = write_whisper(tmp_path / "ggml-tiny.bin")
    choose_stt_model(p)
    with pytest.raises(WhisperFileError, match=r"GGUF model, not a whisper\.cpp speech model"):
        choose_stt_model(smollm2_path)
    assert current_stt_model() == p.absolute()


def test_a_deleted_model_is_no_choice(tmp_path: Path) -> None:
    p = write_whisper(tmp_path / "ggml-tiny.bin")
    choose_stt_model(p)
    p.unlink()
    assert current_stt_model() is None
