"""The Models page's "Speech to text" box: the whisper.cpp models on this computer, what each
is and the memory whisper.cpp will take, and which one push-to-talk and hands-free voice
use.

The list is read off the GUI thread (each file's header is read once, a big vocabulary takes
a tenth of a second) through the page's background runner; "Use for speech to text" keeps
the choice in the profile (app.services.speech_models). These are never offered to the chat:
the chat's model list is the GGUF library's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.services.speech_models import SpeechLibrary, SpeechModel, clear_stt_model
from app.ui.background import Done
from engine.memory.whisper import WhisperMemory
from engine.model.gguf import human_bytes

Run = Callable[[Callable[[], Any], Done], None]
Confirm = Callable[[str, str], bool]  # (title, text) -> yes?
COLUMNS = ["Model", "Type", "Quantization", "Size", "Memory", "Source"]
NONE_CHOSEN = (
    "No speech-to-text model chosen. Find one on the Hub with “Speech to text” ticked "
    "(ggerganov/whisper.cpp has them), download it, then use it here."
)


def memory_tip(m: WhisperMemory) -> str:
    """The estimate's parts, as whisper.cpp allocates them."""
    return (
        f"weights {human_bytes(m.weights)} + caches {human_bytes(m.kv)} + compute buffers "
        f"{human_bytes(m.compute)} + logits {human_bytes(m.logits)}"
        + (f" + {human_bytes(m.fallback)} for a best-of fallback" if m.fallback else "")
    )


class SpeechModelsBox(QGroupBox):
    chosen_changed = Signal(object)  # the chosen file's Path, or None

    deleted = Signal()

    def __init__(
        self, library: SpeechLibrary, run: Run, confirm: Confirm, parent: QWidget | None = None
    ) -> None:
        super().__init__("Speech to text", parent)
        self.library, self._run, self._confirm = library, run, confirm
        self.entries: list[SpeechModel] = []
        self._note = ""  # what was just done, said once before the choice
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setAccessibleName("Speech-to-text models")
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        rows = self.table.verticalHeader()
        rows.setVisible(False)
        rows.setMinimumSectionSize(1)
        rows.setDefaultSectionSize(self.table.fontMetrics().height() + 8)  # single-line rows
        header = self.table.horizontalHeader()
        for col in range(len(COLUMNS)):
            header.setSectionResizeMode(
                col,
                QHeaderView.ResizeMode.Stretch
                if col == 0
                else QHeaderView.ResizeMode.ResizeToContents,
            )
        # Never shorter than its header and two rows (the page's splitter shares the rest).
        frame = 2 * self.table.frameWidth()
        self.table.setMinimumHeight(
            header.sizeHint().height() + 2 * rows.defaultSectionSize() + frame
        )
        self.use_button = QPushButton("Use for speech to text")
        self.use_button.setEnabled(False)
        self.use_button.clicked.connect(self.use_selected)
        self.clear_button = QPushButton("Use none")
        self.clear_button.clicked.connect(self.use_none)
        self.delete_button = QPushButton("Delete…")
        self.delete_button.setEnabled(False)
        self.delete_button.clicked.connect(self.delete_selected)
        self.table.itemSelectionChanged.connect(self._sync)
        self.status = QLabel(NONE_CHOSEN)
        self.status.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        row = QHBoxLayout()
        row.addWidget(self.use_button)
        row.addWidget(self.clear_button)
        row.addWidget(self.delete_button)
        row.addStretch(1)
        layout.addLayout(row)
        layout.addWidget(self.status)

    @Slot()
    def refresh(self) -> None:
        self._run(self.library.entries, self._show)

    def _show(self, entries: list[SpeechModel] | None, error: BaseException | None) -> None:
        if error is not None:
            self.status.setText(f"The speech models could not be listed: {error}")
            return
        self.entries = entries or []
        self.table.setRowCount(0)
        for e in self.entries:
            row = self.table.rowCount()
            self.table.insertRow(row)
            f, m = e.file, e.memory
            cells = [
                e.name + ("  ✓" if e.chosen else ""),
                f.description.split(" · ")[0] if f else "unusable",
                f.file_type.upper() if f else "-",
                human_bytes(f.size) if f else "-",
                human_bytes(m.total) if m else "-",
                e.label or e.source,
            ]
            tips = [str(e.path), e.error, None, None, memory_tip(m) if m else None, e.source]
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                tip = tips[col]
                if tip:
                    item.setToolTip(tip)
                self.table.setItem(row, col, item)
        self._show_choice()
        self._sync()

    def _show_choice(self) -> None:
        chosen = next((e for e in self.entries if e.chosen), None)
        note, self._note = self._note, ""
        if chosen is None or chosen.file is None or chosen.memory is None:
            self.status.setText(note + NONE_CHOSEN)
            return
        self.status.setText(
            f"{note}Speech to text uses {chosen.name} ({chosen.file.description}), "
            f"which needs about {human_bytes(chosen.memory.total)} while it transcribes."
        )

    def selected(self) -> SpeechModel | None:
        rows = {i.row() for i in self.table.selectedIndexes()}
        if len(rows) != 1:
            return None
        row = rows.pop()
        return self.entries[row] if row < len(self.entries) else None

    def _sync(self) -> None:
        e = self.selected()
        self.use_button.setEnabled(e is not None and e.file is not None and not e.chosen)
        self.clear_button.setEnabled(any(x.chosen for x in self.entries))
        self.delete_button.setEnabled(e is not None and e.source != "chosen")

    @Slot()
    def use_selected(self) -> None:
        e = self.selected()
        if e is None:
            return
        self.use_button.setEnabled(False)
        self._run(lambda: self.library.choose(e.path), self._chosen)

    def _chosen(self, chosen: SpeechModel | None, error: BaseException | None) -> None:
        if error is not None or chosen is None:
            self.status.setText(str(error))
            self._sync()
            return
        self.chosen_changed.emit(chosen.path)
        self.refresh()

    @Slot()
    def use_none(self) -> None:
        clear_stt_model(self.library.paths)
        self.chosen_changed.emit(None)
        self.refresh()

    @Slot()
    def delete_selected(self) -> None:
        e = self.selected()
        if e is None or not self._confirm(
            "Delete speech model",
            f"Delete {e.name}?\n{e.path}\nIts file is removed from disk."
            + (f"\n\nWarning: {e.warning}" if e.warning else ""),
        ):
            return
        self._run(lambda: self.library.delete(e.id), self._deleted)

    def _deleted(self, done: tuple[SpeechModel, int] | None, error: BaseException | None) -> None:
        if error is not None or done is None:
            self.status.setText(str(error))
            return
        gone, freed = done
        if gone.chosen:
            self.chosen_changed.emit(None)
        self._note = f"Deleted {gone.name}, freed {human_bytes(freed)}. "
        self.deleted.emit()
        self.refresh()
