"""Push-to-talk in the composer: the Speak button (and Ctrl+Shift+Space), the level meter
and the time recorded, and what becomes of a recording.

Hold Speak (or the keys) while talking and let go to finish; a quick click (a tap of the
keys) starts a recording that the next click ends. Esc while recording cancels: nothing is
sent and nothing is kept. When the recording ends:

- the chat's model reads audio (its projector takes it: the attachments' own check says
  so) -> the recording is attached as a WAV, like a file, and the message is sent with
  what was typed; while an answer is still being written it waits in the tray instead;
- otherwise -> the chosen speech-to-text model transcribes it off the GUI thread
  (voice_transcribe.py) and the text goes into the message box at the cursor.

Every problem (no microphone, access refused, no speech model, a model that fails) is one
line in `notice`; what was typed stays as it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QRectF, Qt, Signal
from PySide6.QtGui import QKeyEvent, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import QApplication, QLabel, QPlainTextEdit, QPushButton, QWidget

from app.services.attachments import AttachmentError
from app.services.speech_models import current_stt_model
from app.services.voice_clip import format_elapsed, meter_fraction, wav_pcm16
from app.ui.attacher import Attacher
from app.ui.chat_media import read_attachment
from app.ui.voice_recorder import VoiceRecorder, unavailable
from app.ui.voice_transcribe import Transcription
from engine.errors import EngineError

HOLD_S = 0.4  # held longer than this, the button is push-to-talk; shorter, a toggle
MIN_SECONDS = 0.3  # less sound than this is no recording
NO_SPEECH_MODEL = (
    "No transcription model is chosen: pick a whisper model from the library in Tools → Voice…"
)
TOO_SHORT = "Nothing was recorded: hold Speak (or Ctrl+Shift+Space) while you talk"
WAITS = "The recording is attached: it is sent with the next message"
IDLE_TIP = "Hold to talk, or click to start and click again to end (Ctrl+Shift+Space)"


class LevelMeter(QWidget):
    """The microphone's loudness: a bar for the RMS and a tick for the peak, in dB."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Microphone level")
        self.setFixedSize(64, 10)
        self.rms = 0.0
        self.peak = 0.0

    def set_level(self, rms: float, peak: float) -> None:
        self.rms, self.peak = meter_fraction(rms), meter_fraction(peak)
        self.setAccessibleDescription(f"{round(self.rms * 100)}%")
        self.update()

    def paintEvent(self, e: QPaintEvent) -> None:
        p = QPainter(self)
        pal = self.palette()
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        p.setPen(pal.color(QPalette.ColorRole.Mid))
        p.setBrush(pal.color(QPalette.ColorRole.Base))
        p.drawRoundedRect(r, 3, 3)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(pal.color(QPalette.ColorRole.Highlight))
        p.drawRoundedRect(QRectF(r.x(), r.y(), r.width() * self.rms, r.height()), 3, 3)
        if self.peak > 0:
            p.setBrush(pal.color(QPalette.ColorRole.Text))
            x = r.x() + (r.width() - 2) * self.peak
            p.drawRect(QRectF(x, r.y(), 2, r.height()))
        p.end()


class VoiceInput(QObject):
    """The composer's voice controls over one `VoiceRecorder`; see the module's text."""

    notice = Signal(str)  # one line for the window
    transcribed = Signal(str)  # the text put into the message box

    def __init__(
        self,
        attacher: Attacher,
        send: Callable[[], bool],
        parent: QObject | None = None,
        recorder: VoiceRecorder | None = None,
    ) -> None:
        super().__init__(parent)
        self.attacher = attacher
        self.box: QPlainTextEdit | None = None  # the message box (the composer sets it)
        self.send = send  # sends the draft with the tray's attachments; False: not now
        self.stt_model: Callable[[], Path | None] = current_stt_model
        self.hold_s = HOLD_S
        self.recorder = recorder or VoiceRecorder(self)
        self.last_recording: bytes | None = None  # the last finished WAV (tests read it)
        self._transcription: Transcription | None = None
        self._job = 0  # the transcription whose text is wanted (0: none)
        self._pressed_at = 0.0
        self._toggled = False  # a click started it: the next click ends it
        self._by_keys = False  # the shortcut started it: its key's release may end it
        self._count = 0

        self.button = QPushButton("Speak")
        self.button.setAccessibleName("Voice input")
        self.button.setCheckable(False)
        self.button.pressed.connect(self.press)
        self.button.released.connect(self.release)
        self.meter = LevelMeter()
        self.time_label = QLabel("0:00")
        self.time_label.setAccessibleName("Time recorded")
        why = unavailable()
        if why is not None:
            self.button.setEnabled(False)
        self.button.setToolTip(why or IDLE_TIP)
        self.recorder.level.connect(self.meter.set_level)
        self.recorder.elapsed.connect(lambda s: self.time_label.setText(format_elapsed(s)))
        self.recorder.failed.connect(self._on_failed)
        self.recorder.started.connect(self._show_state)
        self._show_state()

    # -- state -----------------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        return self.recorder.recording

    @property
    def transcribing(self) -> bool:
        return self._job != 0

    def _show_state(self) -> None:
        rec = self.recording
        self.meter.setVisible(rec)
        self.time_label.setVisible(rec)
        if rec:
            self.button.setText("Listening…")
            self.button.setToolTip("Let go (or click) to finish; Esc cancels")
        elif self.transcribing:
            self.button.setText("Transcribing…")
            self.button.setToolTip("Esc cancels the transcription")
        else:
            self.button.setText("Speak")
            self.button.setToolTip(unavailable() or IDLE_TIP)
            self.meter.set_level(0.0, 0.0)
            self.time_label.setText("0:00")
        self.button.setDown(rec)
        self.button.setEnabled(unavailable() is None and not self.transcribing)
        app = QApplication.instance()
        if app is not None:  # Esc (and the shortcut's release) are ours while busy
            if rec or self.transcribing:
                app.installEventFilter(self)  # once: Qt drops an earlier install
            else:
                app.removeEventFilter(self)

    # -- the button and the keys ----------------------------------------------------------

    def press(self) -> None:
        """The button (or the keys) went down."""
        if self.recording:
            return  # a toggled recording: it ends when this press is let go
        self._toggled = False
        self._by_keys = False
        self._pressed_at = time.monotonic()
        self._begin()

    def release(self) -> None:
        """The button (or the keys) came up: the end of push-to-talk, or of a toggle."""
        if not self.recording:
            return
        if not self._toggled and time.monotonic() - self._pressed_at < self.hold_s:
            self._toggled = True  # a click: keep recording until the next one
            self.button.setDown(True)
            return
        self.finish()

    def shortcut(self) -> None:
        """Ctrl+Shift+Space: as a press of the button; letting go of Space is its release."""
        if self.recording:
            self.finish()
            return
        self.press()
        self._by_keys = self.recording

    def _begin(self) -> None:
        self.cancel_transcription()
        self.recorder.start()
        self._show_state()

    def eventFilter(self, watched: QObject, e: QEvent) -> bool:
        if not isinstance(e, QKeyEvent) or not (self.recording or self.transcribing):
            return False
        key = e.key()
        if key == Qt.Key.Key_Escape:
            if e.type() == QEvent.Type.ShortcutOverride:
                e.accept()  # Esc is ours while recording, not the window's Stop
                return True
            if e.type() == QEvent.Type.KeyPress:
                self.cancel()
                return True
        if (
            self._by_keys
            and self.recording
            and key == Qt.Key.Key_Space
            and e.type() == QEvent.Type.KeyRelease
            and not e.isAutoRepeat()
        ):
            self.release()
            return True
        return False

    # -- ending -----------------------------------------------------------------------------

    def cancel(self) -> None:
        """Esc: the recording is dropped (or the transcription's text will be)."""
        self.recorder.cancel()
        self.cancel_transcription()
        self._show_state()

    def cancel_transcription(self) -> None:
        if self._job:
            self._job = 0
            if self._transcription is not None:
                self._transcription.cancel()
            self._show_state()

    def _on_failed(self, message: str) -> None:
        self._show_state()
        self.notice.emit(message)

    def finish(self) -> None:
        """End the recording and use it (attached, or transcribed into the box)."""
        seconds = self.recorder.seconds
        wav = self.recorder.stop()
        self._show_state()
        if wav is None:
            return
        self.last_recording = wav
        if seconds < MIN_SECONDS:
            self.notice.emit(TOO_SHORT)
            return
        check = self.attacher.check
        if check is not None and check("audio") is None:
            self._attach(wav)
        else:
            self._transcribe(wav)

    def _attach(self, wav: bytes) -> None:
        self._count += 1
        name = f"recording-{datetime.now():%H%M%S}-{self._count}.wav"
        try:
            item = read_attachment(name, wav, self.attacher.audio_rate(), self.attacher.check)
        except (AttachmentError, EngineError) as e:
            self.notice.emit(str(e))
            return
        self.attacher.tray.add(item)
        if not self.send():
            self.notice.emit(WAITS)

    def _transcribe(self, wav: bytes) -> None:
        model = self.stt_model()
        if model is None:
            self.notice.emit(NO_SPEECH_MODEL)
            return
        if self._transcription is None:
            self._transcription = Transcription(self)
            self._transcription.worker.done.connect(self._on_text)
            self._transcription.worker.failed.connect(self._on_transcription_failed)
        self._job = self._transcription.submit(model, wav_pcm16(wav))
        self._show_state()

    def transcription_threads(self) -> int | None:
        """The threads the loaded transcription model runs on (None: not loaded yet)."""
        return None if self._transcription is None else self._transcription.worker.threads

    def _on_text(self, number: int, text: str) -> None:
        if number != self._job:
            return  # cancelled, or an older recording's
        self._job = 0
        self._show_state()
        if text:
            self.insert(text)
        else:
            self.notice.emit("No speech was recognised in the recording")

    def _on_transcription_failed(self, number: int, message: str) -> None:
        if number == self._job:
            self._job = 0
            self._show_state()
            self.notice.emit(message)

    def insert(self, text: str) -> None:
        """Put `text` into the message box at its cursor, spaced from the words around it."""
        if self.box is None:
            return
        cursor = self.box.textCursor()
        doc = self.box.document()
        before = doc.characterAt(cursor.selectionStart() - 1) if cursor.selectionStart() else ""
        after = doc.characterAt(cursor.selectionEnd())
        if before and not before.isspace():
            text = " " + text
        if after and after not in ("\u2029", "\x00") and not after.isspace():
            text += " "
        cursor.insertText(text)
        self.box.setTextCursor(cursor)
        self.box.setFocus(Qt.FocusReason.OtherFocusReason)
        self.transcribed.emit(text.strip())

    def shutdown(self) -> None:
        """End any recording and the transcription thread. Safe to call twice."""
        self.recorder.cancel()
        self._job = 0
        self._show_state()
        if self._transcription is not None:
            self._transcription.shutdown()
            self._transcription = None


__all__ = ["HOLD_S", "NO_SPEECH_MODEL", "LevelMeter", "VoiceInput"]
