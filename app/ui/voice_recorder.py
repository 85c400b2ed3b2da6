"""The microphone: one recording at a time from the system's default input, through
QtMultimedia's `QAudioSource`, delivered as a 16 kHz mono 16-bit WAV file's bytes.

It asks the device for 16 kHz mono 16-bit PCM; a device that cannot give that is opened in
its own preferred format and converted as the sound arrives (app/services/voice_clip.py).
While it records it reports the level of each block (`level`, RMS and peak, 0..1) and the
time recorded (`elapsed`, seconds of sound received, not of wall clock). `stop()` ends it and
emits `finished(wav_bytes)`; `cancel()` ends it and keeps nothing. A problem (no microphone,
access refused, the device lost) is one line in `failed` and ends the recording.

QtMultimedia comes with PySide6-Addons. Where it cannot be imported (a trimmed install, a
bundle without it) `unavailable()` says why in one line and the recorder refuses to start,
so the window shows the microphone disabled instead of failing to open.

The composer's push-to-talk and the hands-free mode both use this class; it owns no widget.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QCoreApplication, QIODevice, QObject, Qt, QTimer, Signal, Slot

from app.services.voice_clip import RATE, Converter, RawFormat, SampleKind, level, wav_bytes
from app.ui.multimedia import MISSING as _MISSING
from app.ui.multimedia import QtMultimedia
from engine.media.audio import MAX_SECONDS

if QtMultimedia is not None:
    from PySide6.QtMultimedia import QAudioDevice, QAudioFormat, QAudioSource, QtAudio

try:
    from PySide6.QtCore import QMicrophonePermission
except ImportError:  # Qt before 6.5: no permission API, access is the system's business
    QMicrophonePermission = None  # type: ignore[assignment,misc]

NO_MICROPHONE = "No microphone found: connect one or choose a default input in the system"
DENIED = "Candlewick may not use the microphone: allow it in the system's privacy settings"
LEVEL_EVERY_MS = 50  # how often the level and the elapsed time are reported


def unavailable() -> str | None:
    """Why there is no voice input at all (None: QtMultimedia is there)."""
    return _MISSING


def _kind(fmt: Any) -> SampleKind:
    kinds: dict[Any, SampleKind] = {
        QAudioFormat.SampleFormat.UInt8: "uint8",
        QAudioFormat.SampleFormat.Int16: "int16",
        QAudioFormat.SampleFormat.Int32: "int32",
        QAudioFormat.SampleFormat.Float: "float32",
    }
    return kinds.get(fmt.sampleFormat(), "int16")


def choose_format(device: Any) -> Any:
    """16 kHz mono 16-bit when the device offers it, else its own preferred format."""
    wanted = QAudioFormat()
    wanted.setSampleRate(RATE)
    wanted.setChannelCount(1)
    wanted.setSampleFormat(QAudioFormat.SampleFormat.Int16)
    return wanted if device.isFormatSupported(wanted) else device.preferredFormat()


class VoiceRecorder(QObject):
    """Records from the default microphone; see the module's text."""

    started = Signal()
    level = Signal(float, float)  # rms, peak: 0..1 of full scale
    elapsed = Signal(float)  # seconds recorded so far
    finished = Signal(bytes)  # the recording, a WAV file's bytes
    cancelled = Signal()
    failed = Signal(str)  # one line

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._source: Any = None
        self._io: QIODevice | None = None
        self._conv: Converter | None = None
        self._pending: bytes = b""
        self._waiting_permission = False
        self.device_name = ""
        self._tick = QTimer(self)
        self._tick.setInterval(LEVEL_EVERY_MS)
        self._tick.timeout.connect(self._report)

    @property
    def recording(self) -> bool:
        return self._conv is not None or self._waiting_permission

    @property
    def seconds(self) -> float:
        return self._conv.seconds if self._conv is not None else 0.0

    def start(self) -> bool:
        """Start recording (False, with `failed` emitted, when it cannot)."""
        if self.recording:
            return True
        if _MISSING is not None:
            self.failed.emit(_MISSING)
            return False
        return self._check_permission()

    def _check_permission(self) -> bool:
        app = QCoreApplication.instance()
        if QMicrophonePermission is None or app is None:
            return self._open()
        perm = QMicrophonePermission()
        status = app.checkPermission(perm)
        if status == Qt.PermissionStatus.Granted:
            return self._open()
        if status == Qt.PermissionStatus.Denied:
            self.failed.emit(DENIED)
            return False
        self._waiting_permission = True  # asked once; the answer comes later (macOS)
        app.requestPermission(perm, self, self._on_permission)
        return True

    def _on_permission(self, perm: Any) -> None:
        if not self._waiting_permission:
            return  # cancelled meanwhile
        self._waiting_permission = False
        if perm.status() == Qt.PermissionStatus.Granted:
            self._open()
        else:
            self.failed.emit(DENIED)

    def _open(self) -> bool:
        device: QAudioDevice = QtMultimedia.QMediaDevices.defaultAudioInput()
        if device.isNull():
            self.failed.emit(NO_MICROPHONE)
            return False
        fmt = choose_format(device)
        source = QAudioSource(device, fmt, self)
        source.stateChanged.connect(self._on_state)
        self._source = source
        self._begin(
            RawFormat(fmt.sampleRate(), fmt.channelCount(), _kind(fmt)), device.description()
        )
        io = source.start()
        if io is None or source.error() != QtAudio.Error.NoError:
            self._end()
            self.failed.emit(f"The microphone ({self.device_name}) could not be opened")
            return False
        self._io = io
        io.readyRead.connect(self._read)
        self.started.emit()
        return True

    def _begin(self, fmt: RawFormat, name: str) -> None:
        """A recording of `fmt` from the input `name` begins: what arrives goes to `feed`."""
        self.device_name = name
        self._conv = Converter(fmt)
        self._pending = b""
        self._tick.start()

    def _read(self) -> None:
        if self._io is not None:
            self.feed(bytes(self._io.readAll().data()))

    def feed(self, data: bytes) -> None:
        """Sound from the input, in its own format (the device's `readyRead`)."""
        if self._conv is None or not data:
            return
        self._conv.add(data)
        self._pending += data
        if self._conv.seconds >= MAX_SECONDS:
            self.stop()  # the most an attachment or a transcription takes

    def _report(self) -> None:
        if self._conv is None:
            return
        lv = level(self._pending, self._conv.fmt)
        self._pending = b""
        self.level.emit(lv.rms, lv.peak)
        self.elapsed.emit(self._conv.seconds)

    @Slot()
    def _on_state(self) -> None:
        # No parameter: PySide cannot convert the signal's QAudio::State (QtAudio in Python)
        # into a call, so the state is asked for instead.
        source = self._source
        if source is None or source.state() != QtAudio.State.StoppedState:
            return
        error = source.error()
        if error == QtAudio.Error.NoError:
            return
        words = {
            QtAudio.Error.OpenError: "could not be opened (in use, or access refused)",
            QtAudio.Error.IOError: "stopped delivering sound",
            QtAudio.Error.FatalError: "is gone",
        }.get(error, "failed")
        self._end()
        self.failed.emit(f"The microphone ({self.device_name}) {words}; nothing was recorded")

    def stop(self) -> bytes | None:
        """End the recording; emits `finished` with the WAV and returns it (None: none)."""
        if self._waiting_permission:
            self.cancel()
            return None
        if self._conv is None:
            return None
        self._read()  # what the device still holds
        conv = self._conv
        self._end()
        wav = wav_bytes(conv.finish())
        self.finished.emit(wav)
        return wav

    def cancel(self) -> None:
        """End the recording and drop it."""
        if not self.recording:
            return
        self._waiting_permission = False
        self._end()
        self.cancelled.emit()

    def _end(self) -> None:
        self._tick.stop()
        source, self._source, self._io, self._conv = self._source, None, None, None
        self._pending = b""
        if source is not None:
            source.stateChanged.disconnect(self._on_state)
            source.stop()
            source.deleteLater()


__all__ = ["DENIED", "NO_MICROPHONE", "VoiceRecorder", "unavailable"]
