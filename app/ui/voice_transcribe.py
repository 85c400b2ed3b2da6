"""Transcription off the GUI thread: a recording's WAV read by the chosen speech-to-text
model (engine.speech) on a hosted thread, its text delivered back on the GUI thread.

The model is loaded on the first transcription and kept for the next ones (whisper.cpp
models take seconds to load); choosing another file loads that one instead. Each job has a
number: a result that comes back after the user cancelled (Esc) or started another
recording carries an old number and is dropped by the caller.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from app.services.voice_clip import pcm16_samples
from app.ui.thread_host import JobHost
from engine.errors import EngineError


@dataclass(frozen=True)
class TranscribeJob:
    number: int
    model: Path
    pcm16: bytes  # 16 kHz mono 16-bit PCM


class TranscribeWorker(QObject):
    done = Signal(int, str)  # job number, the text
    failed = Signal(int, str)  # job number, one line

    def __init__(self) -> None:
        super().__init__()
        self._model: Path | None = None
        self._transcriber: Any = None

    @Slot(object, object)
    def run(self, job: TranscribeJob, cancel: threading.Event) -> None:
        if cancel.is_set():
            return
        try:
            transcriber = self._open(job.model)
            result = transcriber.transcribe(pcm16_samples(job.pcm16))
        except (EngineError, OSError, RuntimeError, ValueError) as e:  # one line each
            self.failed.emit(job.number, _one_line(e))
            return
        if not cancel.is_set():
            self.done.emit(job.number, str(result.text).strip())

    def _open(self, model: Path) -> Any:
        if self._transcriber is not None and self._model == model:
            return self._transcriber
        self.close()
        from engine.speech.transcriber import Transcriber  # loads whisper.cpp: only when used

        self._transcriber = Transcriber(model)
        self._model = model
        return self._transcriber

    @property
    def threads(self) -> int | None:
        """The loaded model's thread count (None: none loaded yet)."""
        return None if self._transcriber is None else int(self._transcriber.threads)

    def close(self) -> None:
        t, self._transcriber, self._model = self._transcriber, None, None
        if t is not None:
            t.close()


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return f"Transcription failed: {text}"


class Transcription(JobHost[TranscribeWorker]):
    """The hosted thread, started on the first job."""

    def __init__(self, parent: QObject | None = None) -> None:
        worker = TranscribeWorker()
        super().__init__(worker, "candlewick-transcribe", worker.run, parent)
        self._number = 0

    def submit(self, model: Path, pcm16: bytes) -> int:
        """Queue a transcription; its job number."""
        self._number += 1
        self.run(TranscribeJob(self._number, model, pcm16))
        return self._number

    def shutdown(self) -> None:
        """Cancel, end the thread, then free the model (its thread no longer uses it)."""
        super().shutdown()
        self.worker.close()


__all__ = ["TranscribeJob", "TranscribeWorker", "Transcription"]
