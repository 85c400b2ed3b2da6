"""The chosen transcription model: kept across restarts in the profile, refused when it is not
a whisper.cpp model, forgotten when its file is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.services.paths import AppPaths
from app.services.speech_models import (
    SpeechLibrary,
    choose_stt_model,
    clear_stt_model,
    current_stt_model,
)
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


def test_whisper_files_in_the_hugging_face_cache(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    repo = cache / "models--ggerganov--whisper.cpp"
    blob = repo / "blobs" / "0123abcd"
    blob.parent.mkdir(parents=True)
    write_whisper(blob)
    snap = repo / "snapshots" / "c0ffee"
    snap.mkdir(parents=True)
    (snap / "ggml-tiny.bin").symlink_to(Path("../../blobs/0123abcd"))
    (snap / "ggml-silero-v5.bin").write_bytes(b"not whisper")  # a ggml name, not a model
    lib = SpeechLibrary(tmp_path / "models", hf_cache=cache)
    [e] = lib.entries()
    assert (e.id, e.source, e.label) == (
        "ggml-tiny",
        "hf-cache",
        "ggerganov/whisper.cpp/ggml-tiny.bin",
    )
    assert e.file is not None and e.file.model_type == "tiny"
    assert e.warning is not None and "Hugging Face cache" in e.warning
    lib.choose("ggml-tiny")
    assert current_stt_model() == snap / "ggml-tiny.bin"
    size = blob.stat().st_size
    gone, freed = lib.delete("ggml-tiny")
    assert gone.id == "ggml-tiny" and freed == size
    assert not blob.exists() and not (snap / "ggml-tiny.bin").is_symlink()
    assert current_stt_model() is None and lib.entries() == []
