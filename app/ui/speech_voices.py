"""The voices that read answers aloud, as thin Qt adapters of `app.services.read_aloud.Voice`.

- `SystemVoice`: the operating system's voices through Qt TextToSpeech (speech-dispatcher on
  Linux, when it is installed; on a machine without one the voice says so in one line).
- `LocalVoice`: the app's own engine (`engine.speech.synth`: espeak-ng, or Kokoro when it is
  installed), synthesised off the GUI thread one sentence ahead, played through an
  `AudioOut`: `SinkOut` on Qt Multimedia's default output, or `WavOut`, which writes the
  answer's audio to a WAV file instead of playing it.
"""

from __future__ import annotations

import math
import wave
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np
from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QObject, QTimer, Signal

from app.ui.multimedia import MISSING, QtMultimedia

try:
    from PySide6.QtTextToSpeech import QTextToSpeech

    NO_TTS: str | None = None
except ImportError as e:  # PySide6-Addons missing (a trimmed install or bundle)
    QTextToSpeech = None  # type: ignore[assignment,misc]
    NO_TTS = f"The system's voices need Qt TextToSpeech, which is not available here ({e})"

from app.services.read_aloud import NothingPlaying, ReadAloud, VoiceSettings
from app.ui.background import Background

if TYPE_CHECKING:
    from engine.speech.synth import Pcm

# Qt's test engine: never offered to the user (tests name it).
HIDDEN_ENGINES = ("mock",)


class VoiceSink(Protocol):
    """Where a voice tells that an utterance ended: the queue (`ReadAloud`)."""

    def spoken(self, token: int) -> None: ...

    def failed(self, token: int, message: str) -> None: ...


def system_engines() -> list[str]:
    """Qt TextToSpeech's engines on this machine (speechd, flite, ...), the test one left out."""
    if QTextToSpeech is None:
        return []
    return [e for e in QTextToSpeech.availableEngines() if e not in HIDDEN_ENGINES]


class SystemVoice(QObject):
    """The operating system's voices (Qt TextToSpeech)."""

    uttered = Signal(str, object)  # (text, None) as each utterance is handed to the engine

    def __init__(
        self,
        sink: VoiceSink,
        settings: VoiceSettings,
        engine: str = "",
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._sink = sink
        names = system_engines() if not engine else [engine]
        self.tts: QTextToSpeech | None = (
            QTextToSpeech(names[0], self) if names and QTextToSpeech is not None else None
        )
        self._token: int | None = None
        self._spoke = False  # the utterance out has been heard starting
        if self.tts is None:
            return
        self.tts.stateChanged.connect(self._on_state)
        if settings.voice:
            for v in self.tts.availableVoices():
                if v.name() == settings.voice:
                    self.tts.setVoice(v)
                    break
        # Qt's rate is -1..1 around the voice's normal speed, an octave each way.
        self.tts.setRate(max(-1.0, min(1.0, math.log2(settings.rate))))

    @property
    def problem(self) -> str | None:
        """Why this voice cannot speak, in one line (None: it can)."""
        if self.tts is None:
            return NO_TTS or (
                "No system voice: install speech-dispatcher (speechd) or pick the local voice"
            )
        if self.tts.state() == QTextToSpeech.State.Error:
            why = self.tts.errorString() or "its engine did not start"
            return f"The system voice cannot speak: {why}"
        return None

    def voices(self) -> list[str]:
        return [] if self.tts is None else [v.name() for v in self.tts.availableVoices()]

    def speak(self, text: str, token: int) -> None:
        problem = self.problem
        if problem is not None or self.tts is None:
            QTimer.singleShot(0, lambda: self._sink.failed(token, problem or ""))
            return
        self._token, self._spoke = token, False
        self.uttered.emit(text, None)
        self.tts.say(text)

    def prepare(self, text: str) -> None:
        pass  # the system's engine speaks as it synthesises

    def pause(self) -> None:
        if self.tts is not None:
            self.tts.pause(QTextToSpeech.BoundaryHint.Immediate)

    def resume(self) -> None:
        if self.tts is not None:
            self.tts.resume()

    def stop(self) -> None:
        self._token = None  # its "ready" after the stop is no utterance's end
        if self.tts is not None:
            self.tts.stop(QTextToSpeech.BoundaryHint.Immediate)

    def _on_state(self, state: QTextToSpeech.State) -> None:
        token = self._token
        if token is None or self.tts is None:
            return
        if state == QTextToSpeech.State.Speaking:
            self._spoke = True
        elif state == QTextToSpeech.State.Ready and self._spoke:
            self._token = None
            self._sink.spoken(token)
        elif state == QTextToSpeech.State.Error:
            self._token = None
            self._sink.failed(token, f"The system voice failed: {self.tts.errorString()}")


class AudioOut(Protocol):
    """Plays one utterance's PCM; tells `done()` when it has all been heard."""

    def play(self, pcm: Pcm, done: Callable[[], None], failed: Callable[[str], None]) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self) -> None: ...


class SinkOut(QObject):
    """The default audio output (Qt Multimedia's QAudioSink over the PCM in memory)."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._sink: QtMultimedia.QAudioSink | None = None
        self._buffer: QBuffer | None = None
        self._done: Callable[[], None] | None = None
        self._failed: Callable[[str], None] | None = None

    def play(self, pcm: Pcm, done: Callable[[], None], failed: Callable[[str], None]) -> None:
        self.stop()
        if MISSING is not None:
            QTimer.singleShot(0, lambda: failed(MISSING or ""))
            return
        device = QtMultimedia.QMediaDevices.defaultAudioOutput()
        if device.isNull():
            QTimer.singleShot(0, lambda: failed("No audio output device to speak on"))
            return
        fmt = QtMultimedia.QAudioFormat()
        fmt.setSampleRate(pcm.rate)
        fmt.setChannelCount(1)
        fmt.setSampleFormat(QtMultimedia.QAudioFormat.SampleFormat.Int16)
        self._done, self._failed = done, failed
        self._buffer = QBuffer(self)
        self._buffer.setData(QByteArray(np.asarray(pcm.samples, dtype="<i2").tobytes()))
        self._buffer.open(QIODevice.OpenModeFlag.ReadOnly)
        self._sink = QtMultimedia.QAudioSink(device, fmt, self)
        # The state is asked for: PySide cannot hand QAudio::State to a Python slot.
        self._sink.stateChanged.connect(self._on_state)
        self._sink.start(self._buffer)

    def _on_state(self) -> None:
        sink = self._sink
        if sink is None:
            return
        state, audio = sink.state(), QtMultimedia.QtAudio
        if state == audio.State.IdleState:  # the buffer ran out: all of it was played
            done = self._done
            self._release()
            if done is not None:
                done()
        elif state == audio.State.StoppedState and sink.error() != audio.Error.NoError:
            failed = self._failed
            self._release()
            if failed is not None:
                failed(f"The audio output failed ({sink.error().name})")

    def pause(self) -> None:
        if self._sink is not None:
            self._sink.suspend()

    def resume(self) -> None:
        if self._sink is not None:
            self._sink.resume()

    def stop(self) -> None:
        self._release()

    def _release(self) -> None:
        sink, buffer = self._sink, self._buffer
        self._sink = self._buffer = None
        self._done = self._failed = None
        if sink is not None:
            sink.stateChanged.disconnect(self._on_state)
            sink.stop()
            sink.deleteLater()
        if buffer is not None:
            buffer.close()
            buffer.deleteLater()


class WavOut(NothingPlaying):
    """Writes each utterance to one WAV file, one after the other, instead of playing it:
    the audio an answer was read as, for a recording (and for tests on machines with no
    audio device). Each utterance is 'heard' once written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._wav: wave.Wave_write | None = None
        self._rate = 0
        self.utterances: list[int] = []  # the samples of each utterance written, in order

    def play(self, pcm: Pcm, done: Callable[[], None], failed: Callable[[str], None]) -> None:
        if self._wav is None:
            # Open across utterances, closed by `close` (the answer's audio is one file).
            self._wav = wave.open(str(self.path), "wb")  # noqa: SIM115
            self._wav.setnchannels(1)
            self._wav.setsampwidth(2)
            self._wav.setframerate(pcm.rate)
            self._rate = pcm.rate
        if pcm.rate != self._rate:
            QTimer.singleShot(0, lambda: failed(f"{pcm.rate} Hz audio after {self._rate} Hz"))
            return
        self._wav.writeframes(np.asarray(pcm.samples, dtype="<i2").tobytes())
        self.utterances.append(len(pcm.samples))
        QTimer.singleShot(0, done)

    def close(self) -> None:
        if self._wav is not None:
            self._wav.close()
            self._wav = None


class LocalVoice(QObject):
    """The app's own voice: each sentence synthesised off the GUI thread (the next one while
    this one plays), then played."""

    # (text, its audio) as each utterance starts: what was said, in order
    uttered = Signal(str, object)

    def __init__(
        self,
        sink: VoiceSink,
        settings: VoiceSettings,
        out: AudioOut | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._sink = sink
        self._voice = settings.voice or "default"
        self._speed = settings.rate
        self.out: AudioOut = out if out is not None else SinkOut(self)
        self._jobs = Background(self, max_threads=1)  # in order, one at a time
        self._ready: dict[str, Pcm | BaseException | None] = {}  # None: being synthesised
        self._wanted: tuple[str, int] | None = None  # (text, token) waiting for its audio
        self._playing: int | None = None
        self._generation = 0  # a stop drops what was synthesised for before it

    def speak(self, text: str, token: int) -> None:
        self._wanted = (text, token)
        if text not in self._ready:
            self._synthesise(text)
        self._play_if_ready()

    def prepare(self, text: str) -> None:
        if text not in self._ready:
            self._synthesise(text)

    def pause(self) -> None:
        self.out.pause()

    def resume(self) -> None:
        self.out.resume()

    def stop(self) -> None:
        self._generation += 1
        self._wanted = self._playing = None
        self._ready.clear()
        self.out.stop()

    def close(self) -> None:
        """At shutdown: silence, and wait for a synthesis under way."""
        self.stop()
        self._jobs.wait()

    def _synthesise(self, text: str) -> None:
        self._ready[text] = None
        generation, voice, speed = self._generation, self._voice, self._speed

        def job() -> Pcm:
            # Imported here: the engine's synthesiser may load a neural voice's runtime.
            from engine.speech.synth import synthesizer

            engine = synthesizer()
            v = engine.voice(voice)  # the rate within what this voice can do
            return engine.synthesize(text, voice, min(max(speed, v.min_speed), v.max_speed))

        def landed(result: object, error: BaseException | None) -> None:
            if generation != self._generation:
                return
            self._ready[text] = error if error is not None else cast("Pcm", result)
            self._play_if_ready()

        self._jobs.run(job, landed, "candlewick-tts")

    def _play_if_ready(self) -> None:
        if self._wanted is None:
            return
        text, token = self._wanted
        audio = self._ready.get(text)
        if audio is None:
            return  # still being synthesised
        self._wanted = None
        del self._ready[text]
        if isinstance(audio, BaseException):
            self._sink.failed(token, f"The local voice failed: {audio}")
            return
        self._playing = token
        self.uttered.emit(text, audio)
        self.out.play(audio, lambda: self._played(token), lambda why: self._out_failed(token, why))

    def _played(self, token: int) -> None:
        if self._playing == token:
            self._playing = None
            self._sink.spoken(token)

    def _out_failed(self, token: int, why: str) -> None:
        if self._playing == token:
            self._playing = None
            self._sink.failed(token, why)


Speaker = SystemVoice | LocalVoice
MakeVoice = Callable[[ReadAloud, VoiceSettings, QObject | None], Speaker]


def make_voice(queue: ReadAloud, settings: VoiceSettings, parent: QObject | None = None) -> Speaker:
    """The voice the settings name, speaking for `queue`."""
    if settings.engine == "system":
        return SystemVoice(queue, settings, parent=parent)
    return LocalVoice(queue, settings, parent=parent)


__all__ = [
    "AudioOut",
    "LocalVoice",
    "MakeVoice",
    "SinkOut",
    "Speaker",
    "SystemVoice",
    "WavOut",
    "make_voice",
    "system_engines",
]
