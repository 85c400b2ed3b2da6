"""Speech to text with whisper.cpp: `Transcriber` over a long-lived child process.

The model is checked in this process first (engine.model.whisper_file: a file that is not a
whisper.cpp model, or is cut short, is refused in one line before anything loads it), then
loaded once by the child (engine.speech.whisper_child), which keeps it for every later
transcription. A child that dies (an abort inside whisper.cpp) fails that call with its last
words and is started again, with the model, on the next one.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from engine.errors import EngineError
from engine.media.audio import decode_wav
from engine.model.whisper_file import read_whisper
from engine.native.load_probe import child_env, death, last_words, python_child
from engine.speech.whisper_child import CHILD_ARG, SAMPLE_RATE

DEFAULT_THREADS = 4


@dataclass(frozen=True)
class Segment:
    start_s: float
    end_s: float
    text: str


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str
    segments: tuple[Segment, ...]
    audio_seconds: float


class TranscriptionRefused(EngineError):
    """A request whisper cannot honour (a language it does not know); `field` names it."""

    def __init__(self, message: str, field: str | None) -> None:
        super().__init__(message)
        self.field = field


def child_command() -> list[str]:
    """The child's command: this interpreter on the module, or a frozen app on itself."""
    return python_child("engine.speech.whisper_child", CHILD_ARG)


class Transcriber:
    """A whisper.cpp model loaded in a child process; calls are serialised (one at a time)."""

    def __init__(self, model_path: Path, *, threads: int | None = None) -> None:
        self.model_path = Path(model_path)
        self.model = read_whisper(self.model_path)  # WhisperFileError: one line
        self.threads = threads or min(DEFAULT_THREADS, os.cpu_count() or 1)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._pump: threading.Thread | None = None
        self._closed = False
        with self._lock:
            self._start()

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs (its memory is the model's)."""
        return self._proc.pid if self._proc is not None else None

    def transcribe(
        self,
        samples: npt.NDArray[np.float32],
        *,
        language: str | None = None,
        translate: bool = False,
        prompt: str | None = None,
    ) -> Transcript:
        """`samples` (float32 mono at 16 kHz) to text, greedy and deterministic."""
        pcm = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
        req = {"op": "transcribe", "language": language or None, "translate": translate}
        if prompt:
            req["prompt"] = prompt
        with self._lock:
            if self._closed:
                raise EngineError("the transcriber is closed")
            if self._proc is None:
                self._start()
            reply = self._ask(req, pcm.tobytes(), doing="transcribing")
        if "error" in reply:
            raise TranscriptionRefused(str(reply["error"]), reply.get("field"))
        raw = [
            (float(s["start"]), float(s["end"]), bytes.fromhex(s["text"]))
            for s in reply["segments"]
        ]
        segments = tuple(
            Segment(a, b, t.decode("utf-8", errors="replace").strip()) for a, b, t in raw
        )
        text = b"".join(t for _, _, t in raw).decode("utf-8", errors="replace").strip()
        return Transcript(text, str(reply["language"]), segments, len(pcm) / SAMPLE_RATE)

    def transcribe_wav(
        self,
        data: bytes,
        *,
        language: str | None = None,
        translate: bool = False,
        prompt: str | None = None,
    ) -> Transcript:
        """A WAV file's audio (any rate and channels; engine.media.audio) to text."""
        pcm = decode_wav(data, SAMPLE_RATE)  # MediaError: one line
        samples = np.frombuffer(pcm.pcm, dtype=np.float32)
        return self.transcribe(samples, language=language, translate=translate, prompt=prompt)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stop()

    def __enter__(self) -> Transcriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the child

    def _start(self) -> None:
        try:
            proc = subprocess.Popen(
                child_command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child_env(),
            )
        except OSError as e:
            raise EngineError(f"could not start the speech-to-text process: {e}") from None
        self._proc = proc
        self._stderr.clear()
        assert proc.stderr is not None
        self._pump = threading.Thread(
            target=_pump, args=(proc.stderr, self._stderr), name="whisper-stderr", daemon=True
        )
        self._pump.start()
        load = {"op": "load", "path": str(self.model_path.resolve()), "threads": self.threads}
        reply = self._ask(load, b"", doing="loading")
        if "error" in reply:
            self._stop()
            raise EngineError(
                f"whisper.cpp could not load {self.model_path.name}: {reply['error']}"
            )

    def _ask(self, req: dict[str, Any], payload: bytes, *, doing: str) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps({**req, "bytes": len(payload)}).encode() + b"\n")
            proc.stdin.write(payload)
            proc.stdin.flush()
            line = proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = b""
        if not line:
            rc = proc.wait()
            if self._pump is not None:
                self._pump.join(timeout=5)  # its last lines say why
            self._stop()
            why = last_words("\n".join(self._stderr))
            name = self.model_path.name
            raise EngineError(f"whisper.cpp stopped while {doing} {name} ({death(rc)}): {why}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()  # the child's loop ends on end of input
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self._pump is not None:
            self._pump.join(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _pump(stream: IO[bytes], into: collections.deque[str]) -> None:
    with contextlib.suppress(OSError, ValueError):
        for line in stream:
            into.append(line.decode("utf-8", errors="replace").rstrip())


__all__ = ["Segment", "Transcriber", "Transcript", "TranscriptionRefused"]
