"""Hands-free in the window: the Qt side of `app.services.hands_free.HandsFree`.

The microphone is a `VoiceRecorder` (app/ui/voice_recorder.py) that also hands out each block
it receives as 16 kHz mono PCM (`ListeningRecorder.pcm`), for the turn detector; a turn is
transcribed by the same hosted thread push-to-talk uses (app/ui/voice_transcribe.py) with the
chosen transcription model, sent as the user's message, and its answer read aloud
(`ReadAloudController`, whatever the chat's auto-read says). When the reading ends, the next
turn listens.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from PySide6.QtCore import QObject, Signal

from app.services.hands_free import HandsFree, HandsFreeState
from app.services.speech_models import current_stt_model
from app.services.turn_detector import TurnRules
from app.services.voice_clip import RATE, to_pcm16
from app.ui.read_aloud import ReadAloudController
from app.ui.voice_recorder import VoiceRecorder
from app.ui.voice_transcribe import Transcription

NO_MODEL = "Hands-free needs a transcription model: choose one on the Models page (Speech to text)"


class ListeningRecorder(VoiceRecorder):
    """A recorder whose blocks are also told as they come (`pcm`: 16 kHz mono int16)."""

    pcm = Signal(bytes)

    def feed(self, data: bytes) -> None:
        conv = self._conv
        if conv is not None and data:
            # Each block converted on its own (its edges may click after resampling, which
            # the turn detector does not mind).
            self.pcm.emit(to_pcm16(data, conv.fmt))
        super().feed(data)


class HandsFreeController(QObject):
    state_changed = Signal(str)  # HandsFreeState
    notice = Signal(str)  # one line for the window

    def __init__(
        self,
        reader: ReadAloudController,
        send: Callable[[str], bool],
        *,
        stt_model: Callable[[], Path | None] = current_stt_model,
        rules: TurnRules | None = None,
        recorder: ListeningRecorder | None = None,
        parent: QObject | None = None,
    ) -> None:
        """`recorder`: the microphone (a test's is fed from a file)."""
        super().__init__(parent)
        self.reader = reader
        self._send = send
        self.stt_model = stt_model
        self.recorder = recorder or ListeningRecorder(self)
        self._wire(self.recorder)
        self.machine = HandsFree(_Ports(self), RATE, rules=rules)
        self._transcription: Transcription | None = None
        self._job = 0
        self.last_transcript: str | None = None
        reader.finished.connect(lambda _source: self._reading_ended())
        reader.state_changed.connect(self._on_reading)

    @property
    def state(self) -> HandsFreeState:
        return self.machine.state

    @property
    def on(self) -> bool:
        return self.machine.on

    def use_recorder(self, recorder: ListeningRecorder) -> None:
        """Listen through `recorder` from now on (a test's is fed from a file)."""
        old = self.recorder
        old.cancel()
        old.pcm.disconnect(self.audio)
        old.failed.disconnect(self._on_recorder_failed)
        old.finished.disconnect(self._on_recording_full)
        self.recorder = recorder
        self._wire(recorder)

    def _wire(self, recorder: ListeningRecorder) -> None:
        recorder.pcm.connect(self.audio)
        recorder.failed.connect(self._on_recorder_failed)
        # A recording ends at its length limit: a long wait for the next turn goes on.
        recorder.finished.connect(self._on_recording_full)

    def set_on(self, on: bool) -> None:
        if on and self.stt_model() is None:
            self.notice.emit(NO_MODEL)
            self.state_changed.emit(self.machine.state)
            return
        if on:
            self.machine.start()
        else:
            self._job = 0
            self.machine.stop()

    def audio(self, pcm: bytes | np.ndarray) -> None:
        """PCM from the microphone (or, in a test, from a file through the same path)."""
        self.machine.audio(pcm)

    def shutdown(self) -> None:
        self.machine.stop()
        self.recorder.cancel()
        if self._transcription is not None:
            self._transcription.shutdown()

    # -- the machine's ports ---------------------------------------------------------------

    def _transcribe(self, samples: np.ndarray, rate: int) -> None:
        model = self.stt_model()
        if model is None:
            self.notice.emit(NO_MODEL)
            self.machine.stop()
            return
        if self._transcription is None:
            self._transcription = Transcription(self)
            self._transcription.worker.done.connect(self._on_text)
            self._transcription.worker.failed.connect(self._on_failed)
        pcm = samples.astype("<i2").tobytes()
        if rate != RATE:  # the detector keeps the microphone's 16 kHz; a guard all the same
            raise ValueError(f"a turn at {rate} Hz, the transcriber reads {RATE}")
        self._job = self._transcription.submit(model, pcm)

    def _on_text(self, number: int, text: str) -> None:
        if number == self._job:
            self._job = 0
            self.last_transcript = text
            self.machine.transcribed(text)

    def _on_failed(self, number: int, message: str) -> None:
        if number == self._job:
            self._job = 0
            self.notice.emit(message)
            self.machine.transcribed(None)

    def _on_recorder_failed(self, message: str) -> None:
        self.notice.emit(message)
        self.machine.stop()

    def _on_recording_full(self, _wav: bytes) -> None:
        if self.machine.state in ("listening", "hearing"):
            self.recorder.start()

    def _reading_ended(self) -> None:
        self.machine.answer_done()

    def _on_reading(self, state: str, _source: object) -> None:
        # Stopped by hand (Stop reading, Esc): the turn is over all the same.
        if state == "idle" and self.machine.state == "answering" and self._answer_finished():
            self.machine.answer_done()

    def reply_ended(self) -> None:
        """The chat is no longer busy: an answer that was never read (it failed before any
        text, or was not read aloud) ends the turn too."""
        if self.machine.state == "answering" and self.reader.state == "idle":
            self.machine.answer_done()

    def _answer_finished(self) -> bool:
        chat = self.reader.chat
        rows = chat.rowCount()
        return rows > 0 and chat.message(rows - 1).state != "streaming"


class _Ports:
    def __init__(self, c: HandsFreeController) -> None:
        self.c = c

    def listen(self) -> None:
        self.c.recorder.start()

    def mute(self) -> None:
        self.c.recorder.cancel()

    def transcribe(self, samples: np.ndarray, rate: int) -> None:
        self.c._transcribe(samples, rate)

    def send(self, text: str) -> bool:
        return self.c._send(text)

    def state_changed(self, state: HandsFreeState) -> None:
        self.c.state_changed.emit(state)


__all__ = ["HandsFreeController", "ListeningRecorder"]
