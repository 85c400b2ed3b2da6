"""Tools → Voice…: which voice reads answers aloud (the engine, its voice, the rate), a
sample to hear it, hands-free, and the transcription model it uses (chosen on the Models
page).

The local engine's voices come from `engine.speech.synth.voices()` (espeak-ng's default
always; Kokoro's when it is installed); the system's from Qt TextToSpeech, listed when that
engine is chosen (starting it may take a moment, and on a machine without speech-dispatcher
it says why in one line instead).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from app.services.read_aloud import VoiceSettings
from app.services.speech_models import current_stt_model
from app.ui.speech_voices import system_engines

ENGINE_TITLES = {"local": "This app's voice (offline)", "system": "The system's voices"}
SAMPLE = "This is how answers will sound when they are read aloud."


class VoiceSettingsPanel(QWidget):
    changed = Signal(object)  # VoiceSettings
    hands_free_toggled = Signal(bool)
    sample_requested = Signal(str)

    def __init__(
        self,
        settings: VoiceSettings,
        *,
        local_voices: Callable[[], Sequence[str]],
        system_voices: Callable[[], tuple[list[str], str | None]],
        stt_model: Callable[[], Path | None] = current_stt_model,
        parent: QWidget | None = None,
    ) -> None:
        """`system_voices`: the system engine's voices and why it cannot speak (None: it can)."""
        super().__init__(parent)
        self.setWindowTitle("Voice")
        self._local_voices, self._system_voices = local_voices, system_voices
        self._stt_model = stt_model
        self._loading = False
        self._listed = False  # the voices are listed once the panel is shown
        self._chosen = settings.voice
        self.engine = QComboBox()
        self.engine.setAccessibleName("Speech engine")
        for key, title in ENGINE_TITLES.items():
            self.engine.addItem(title, key)
        if not system_engines():
            i = self.engine.findData("system")
            self.engine.setItemData(
                i,
                "No system speech engine is installed (speech-dispatcher)",
                Qt.ItemDataRole.ToolTipRole,
            )
        self.voice = QComboBox()
        self.voice.setAccessibleName("Voice")
        self.problem = QLabel()
        self.problem.setObjectName("voiceProblem")
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet("color: #c62828;")
        self.problem.hide()
        self.rate = QSlider(Qt.Orientation.Horizontal)
        self.rate.setAccessibleName("Speaking rate")
        self.rate.setRange(int(VoiceSettings.MIN_RATE * 100), int(VoiceSettings.MAX_RATE * 100))
        self.rate.setSingleStep(5)
        self.rate_label = QLabel()
        self.sample_button = QPushButton("Listen")
        self.sample_button.setToolTip("Read a sample sentence with this voice")
        self.sample_button.clicked.connect(lambda: self.sample_requested.emit(SAMPLE))
        self.hands_free = QCheckBox("Hands-free: listen, answer aloud, listen again")
        self.hands_free.setAccessibleName("Hands-free")
        self.hands_free.setToolTip(
            "The microphone listens; when you stop speaking your words are sent, the answer "
            "is read aloud, and then it listens again · Ctrl+Alt+H"
        )
        # Hands-free transcribes with the speech-to-text model chosen on the Models page.
        self.stt_label = QLabel()
        self.stt_label.setAccessibleName("Transcription model")
        self.stt_label.setWordWrap(True)
        rate_row = QHBoxLayout()
        rate_row.addWidget(self.rate, 1)
        rate_row.addWidget(self.rate_label)
        form = QFormLayout()
        form.addRow("Engine", self.engine)
        form.addRow("Voice", self.voice)
        form.addRow("", self.problem)
        form.addRow("Rate", rate_row)
        form.addRow("", self.sample_button)
        form.addRow("Hands-free", self.hands_free)
        form.addRow("Transcription", self.stt_label)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addStretch(1)
        self.set_settings(settings)
        self.engine.currentIndexChanged.connect(self._on_engine)
        self.voice.currentIndexChanged.connect(self._emit)
        self.rate.valueChanged.connect(self._on_rate)
        self.hands_free.toggled.connect(self.hands_free_toggled)

    def settings(self) -> VoiceSettings:
        engine = self.engine.currentData()
        voice = str(self.voice.currentData() or "") if self._listed else self._chosen
        return VoiceSettings(
            engine="system" if engine == "system" else "local",
            voice=voice,
            rate=self.rate.value() / 100,
        )

    def set_settings(self, s: VoiceSettings) -> None:
        self._loading = True
        try:
            self.engine.setCurrentIndex(max(0, self.engine.findData(s.engine)))
            self._chosen = s.voice
            if self.isVisible():
                self._fill_voices(s.voice)
            self.rate.setValue(round(s.rate * 100))
            self.rate_label.setText(f"{s.rate:.2f}x")
        finally:
            self._loading = False

    def showEvent(self, e: QShowEvent) -> None:
        model = self._stt_model()
        self.stt_label.setText(
            f"{model.name} (Models page → Speech to text)"
            if model is not None
            else "None: choose a speech-to-text model on the Models page (Speech to text)"
        )
        # The voices are listed when the panel is first shown: the local engine's list
        # loads espeak-ng, the system's starts its speech service.
        if not self._listed:
            self._listed = True
            was, self._loading = self._loading, True
            try:
                self._fill_voices(self._chosen)
            finally:
                self._loading = was
        super().showEvent(e)

    def set_hands_free(self, on: bool) -> None:
        self.hands_free.blockSignals(True)
        self.hands_free.setChecked(on)
        self.hands_free.blockSignals(False)

    def _fill_voices(self, chosen: str) -> None:
        self._listed = True
        self.voice.clear()
        problem: str | None = None
        if self.engine.currentData() == "system":
            names, problem = self._system_voices()
            self.voice.addItem("The system's default", "")
        else:
            names = list(self._local_voices())
        for name in names:
            self.voice.addItem(name, name)
        self.voice.setCurrentIndex(max(0, self.voice.findData(chosen)))
        self.problem.setText(problem or "")
        self.problem.setVisible(bool(problem))

    def _on_engine(self) -> None:
        was, self._loading = self._loading, True
        try:
            self._chosen = ""
            self._fill_voices("")
        finally:
            self._loading = was
        self._emit()

    def _on_rate(self, value: int) -> None:
        self.rate_label.setText(f"{value / 100:.2f}x")
        self._emit()

    def _emit(self) -> None:
        if self._listed:
            self._chosen = str(self.voice.currentData() or "")
        if not self._loading:
            self.changed.emit(self.settings())


__all__ = ["SAMPLE", "VoiceSettingsPanel"]
