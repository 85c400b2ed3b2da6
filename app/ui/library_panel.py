"""The model library panel: the table of local models, load settings, the memory estimate
before load, and Load / Cancel / Eject."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QItemSelection, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QSlider,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.services.library import LibraryEntry
from app.ui.estimate import EstimateWidget, Estimator
from app.ui.library_model import LibraryModel
from app.ui.worker import LoadedModel
from engine.runtime import KV_TYPES, GpuLayers, LoadParams

CTX_STEP = 256
DEFAULT_CTX = 4096


class LibraryPanel(QWidget):
    load_requested = Signal(object, object)  # Path, LoadParams
    cancel_requested = Signal()
    eject_requested = Signal()
    selection_changed = Signal(object)  # LibraryEntry | None

    def __init__(self, model: LibraryModel, estimator: Estimator | None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.table = QTableView()
        self.table.setModel(model)
        self.table.setAccessibleName("Model library")
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setStretchLastSection(False)
        self.table.setWordWrap(False)
        self.table.selectionModel().selectionChanged.connect(self._on_selection)
        model.modelReset.connect(self._after_reset)

        self.ctx_slider = QSlider(Qt.Orientation.Horizontal)
        self.ctx_slider.setAccessibleName("Context length")
        self.ctx_slider.setSingleStep(1)
        self.ctx_slider.setPageStep(4)
        self.ctx_label = QLabel()
        self.gpu_slider = QSlider(Qt.Orientation.Horizontal)
        self.gpu_slider.setAccessibleName("GPU layers")
        self.gpu_auto = QCheckBox("Auto")
        self.gpu_auto.setAccessibleName("GPU layers automatic")
        self.gpu_auto.setChecked(True)
        self.gpu_label = QLabel()
        self.type_k = QComboBox()
        self.type_k.setAccessibleName("K cache type")
        self.type_v = QComboBox()
        self.type_v.setAccessibleName("V cache type")
        for combo in (self.type_k, self.type_v):
            combo.addItems(list(KV_TYPES))
            combo.setCurrentText("f16")
        self.flash = QComboBox()
        self.flash.setAccessibleName("Flash attention")
        self.flash.addItems(["auto", "on", "off"])

        settings = QGroupBox("Load settings")
        form = QFormLayout(settings)
        ctx_row = QHBoxLayout()
        ctx_row.addWidget(self.ctx_slider, 1)
        ctx_row.addWidget(self.ctx_label)
        form.addRow("Context", ctx_row)
        gpu_row = QHBoxLayout()
        gpu_row.addWidget(self.gpu_slider, 1)
        gpu_row.addWidget(self.gpu_label)
        gpu_row.addWidget(self.gpu_auto)
        form.addRow("GPU layers", gpu_row)
        kv_row = QHBoxLayout()
        kv_row.addWidget(QLabel("K"))
        kv_row.addWidget(self.type_k)
        kv_row.addWidget(QLabel("V"))
        kv_row.addWidget(self.type_v)
        form.addRow("KV cache", kv_row)
        form.addRow("Flash attention", self.flash)

        self.estimate = EstimateWidget(estimator)
        est_box = QGroupBox("Memory before loading")
        QVBoxLayout(est_box).addWidget(self.estimate)

        self.load_button = QPushButton("Load")
        self.load_button.setAccessibleName("Load model")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Cancel loading")
        self.eject_button = QPushButton("Eject")
        self.eject_button.setAccessibleName("Eject model")
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setAccessibleName("Load progress")
        self.status = QLabel("No model loaded")
        self.status.setWordWrap(True)
        self.status.setAccessibleName("Model status")
        buttons = QHBoxLayout()
        buttons.addWidget(self.load_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.eject_button)

        lay = QVBoxLayout(self)
        lay.addWidget(self.table, 1)
        lay.addWidget(settings)
        lay.addWidget(est_box)
        lay.addLayout(buttons)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)

        self.load_button.clicked.connect(self._request_load)
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.eject_button.clicked.connect(self.eject_requested)
        self.ctx_slider.valueChanged.connect(self._settings_changed)
        self.gpu_slider.valueChanged.connect(self._settings_changed)
        self.gpu_auto.toggled.connect(self._settings_changed)
        for combo in (self.type_k, self.type_v, self.flash):
            combo.currentIndexChanged.connect(self._settings_changed)
        self._loaded: LoadedModel | None = None
        self._loading = False
        # The context the user asked for; kept across models, clamped to each one's maximum.
        self._ctx_wanted = DEFAULT_CTX
        self.ctx_slider.valueChanged.connect(self._remember_ctx)  # not fired by _configure_for
        self._configure_for(None)
        self._sync_buttons()

    # -- selection and settings ------------------------------------------------------------

    def selected_entry(self) -> LibraryEntry | None:
        rows = self.table.selectionModel().selectedRows()
        return self.model.entry(rows[0].row()) if rows else None

    def select(self, entry_id: str) -> bool:
        row = self.model.row_of(entry_id)
        if row < 0:
            return False
        self.table.selectRow(row)
        return True

    def context_length(self) -> int:
        return int(self.ctx_slider.value()) * CTX_STEP

    def set_context_length(self, n_ctx: int) -> None:
        self._ctx_wanted = n_ctx
        self.ctx_slider.setValue(max(1, n_ctx // CTX_STEP))

    def _remember_ctx(self, value: int) -> None:
        self._ctx_wanted = value * CTX_STEP

    def gpu_layers(self) -> GpuLayers:
        return "auto" if self.gpu_auto.isChecked() else int(self.gpu_slider.value())

    def load_params(self) -> LoadParams:
        return LoadParams(
            n_ctx=self.context_length(),
            n_gpu_layers=self.gpu_layers(),
            type_k=self.type_k.currentText(),
            type_v=self.type_v.currentText(),
            flash_attn=self.flash.currentText(),  # type: ignore[arg-type]
        )

    def _on_selection(self, _sel: QItemSelection, _desel: QItemSelection) -> None:
        entry = self.selected_entry()
        self._configure_for(entry)
        self._sync_buttons()
        self.selection_changed.emit(entry)

    def _after_reset(self) -> None:
        self._configure_for(self.selected_entry())
        self._sync_buttons()

    def _configure_for(self, entry: LibraryEntry | None) -> None:
        facts = entry.facts if entry else None
        trained = facts.context_length if facts and facts.context_length else 131072
        n_layer = facts.n_layer if facts else 0
        keep = self._ctx_wanted
        for w in (self.ctx_slider, self.gpu_slider):
            w.blockSignals(True)
        self.ctx_slider.setRange(1, max(1, trained // CTX_STEP))
        self.ctx_slider.setValue(min(keep, trained) // CTX_STEP or 1)
        self.gpu_slider.setRange(0, n_layer + 1)  # +1: the output layer offloads too
        for w in (self.ctx_slider, self.gpu_slider):
            w.blockSignals(False)
        self._settings_changed()

    def _settings_changed(self) -> None:
        self.ctx_label.setText(f"{self.context_length():,}")
        self.gpu_slider.setEnabled(not self.gpu_auto.isChecked())
        self.gpu_label.setText("auto" if self.gpu_auto.isChecked()
                               else str(self.gpu_slider.value()))
        entry = self.selected_entry()
        if entry is None:
            self.estimate.clear()
        elif entry.error:
            self.estimate.clear()
            self.estimate.verdict.setText(f"This file cannot be used: {entry.error}")
        else:
            self.estimate.update_for(entry.path, self.load_params())

    # -- load state ------------------------------------------------------------------------

    def _request_load(self) -> None:
        entry = self.selected_entry()
        if entry is not None:
            self.load_requested.emit(entry.path, self.load_params())

    def set_loading(self, loading: bool) -> None:
        self._loading = loading
        if loading:
            self.progress.setValue(0)
            self.status.setText("Loading…")
        self._sync_buttons()

    def set_progress(self, fraction: float) -> None:
        self.progress.setValue(round(fraction * 100))

    def set_loaded(self, info: LoadedModel | None) -> None:
        self._loaded = info
        self._loading = False
        if info is None:
            self.progress.setValue(0)
            self.status.setText("No model loaded")
            self.estimate.actual.setText("")
        else:
            self.progress.setValue(100)
            self.status.setText(f"Loaded {info.name} · context {info.n_ctx:,} · "
                                f"{info.load_s:.2f} s")
            if info.actual_bytes:
                self.estimate.show_actual(info.actual_total)
        self._sync_buttons()

    def set_status(self, text: str) -> None:
        self.status.setText(text)

    @property
    def loaded(self) -> LoadedModel | None:
        return self._loaded

    def _sync_buttons(self) -> None:
        entry = self.selected_entry()
        self.load_button.setEnabled(not self._loading and entry is not None
                                    and entry.error is None)
        self.cancel_button.setEnabled(self._loading)
        self.eject_button.setEnabled(not self._loading and self._loaded is not None)
        self.progress.setVisible(self._loading or self._loaded is not None)

    def selected_path(self) -> Path | None:
        e = self.selected_entry()
        return e.path if e else None
