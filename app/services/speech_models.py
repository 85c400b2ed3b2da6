"""The transcription (speech-to-text) model the user chose, kept across restarts.

One whisper.cpp model file is the app's transcription model: push-to-talk, the
`/v1/audio/transcriptions` route and `candlewick serve` use it unless told otherwise. The
choice is kept as its path in `speech.json` in the config folder (written whole or not at
all); a file chosen once and since deleted or moved is no choice at all (None), never an
error at the moment the user speaks.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.services.atomic_write import write_text_atomic
from app.services.paths import AppPaths
from engine.model.whisper_file import WhisperFile, read_whisper

FILE_NAME = "speech.json"
STT_KEY = "stt_model"


def _settings_file(paths: AppPaths | None) -> Path:
    return (paths or AppPaths.default()).config / FILE_NAME


def _read(paths: AppPaths | None) -> dict[str, object]:
    try:
        data = json.loads(_settings_file(paths).read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def current_stt_model(paths: AppPaths | None = None) -> Path | None:
    """The chosen transcription model's file, or None when none is chosen or the chosen
    file is gone."""
    value = _read(paths).get(STT_KEY)
    if not isinstance(value, str) or not value:
        return None
    path = Path(value)
    return path if path.is_file() else None


def choose_stt_model(path: str | Path, paths: AppPaths | None = None) -> WhisperFile:
    """Make `path` the transcription model. The file is read first: a GGUF chat model, a
    truncated download or any other file is refused (WhisperFileError, one line) and the
    previous choice stays."""
    model = read_whisper(Path(path).expanduser().resolve())
    _write(paths, str(model.path))
    return model


def clear_stt_model(paths: AppPaths | None = None) -> None:
    """No transcription model chosen (the file itself stays)."""
    _write(paths, None)


def _write(paths: AppPaths | None, value: str | None) -> None:
    data = _read(paths)
    if value is None:
        data.pop(STT_KEY, None)
    else:
        data[STT_KEY] = value
    target = _settings_file(paths)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(target, json.dumps(data, indent=1))
