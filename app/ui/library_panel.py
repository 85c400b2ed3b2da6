"""The model library panel: the table of local models, load settings, the memory estimate
before load, and Load / Cancel / Eject.

Load settings (context, GPU layers, K/V cache types, flash attention, speculative decoding)
are remembered per model in the profile's settings per model (app.services.model_settings),
which the Local server and `candlewick serve` apply too, and restored when it is selected
again; a model with nothing saved starts from the defaults. A line says which it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import QItemSelection, QPoint, QSettings, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMenu,
    QProgressBar,
    QPushButton,
    QSlider,
    QSpinBox,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.services.library import LibraryEntry
from app.services.model_settings import LOAD_KEYS, ModelSettingsStore, check_value
from app.ui.estimate import EstimateWidget, Estimator
from app.ui.library_model import LibraryModel, is_embedding, not_for_chat
from app.ui.worker import LoadedModel
from engine.errors import EngineError
from engine.host.runtime import drafting_exact
from engine.host.speculative import DEFAULT_MODEL_DRAFT_MAX, vocab_size_mismatch
from engine.memory.cpu_kernels import Exactness
from engine.model.gguf import GGUFError
from engine.settings import (
    DEFAULT_DRAFT_MAX,
    KV_TYPES,
    FlashAttn,
    GpuLayers,
    LoadParams,
    SpecMode,
    SpeculativeSettings,
)

CTX_STEP = 256
DEFAULT_CTX = 4096
SPEC_MODES: tuple[tuple[SpecMode, str], ...] = (
    ("off", "Off"),
    ("lookup", "Prompt lookup"),
    ("draft", "Draft model"),
)
FLASH_NOTE = "Flash attention is on while drafting: exact output needs it."


def inexact_note(reason: str) -> str:
    """What drafting gives where this model's kernels differ between a batch and one token."""
    return f"A drafted reply can take another branch where two words are nearly tied: {reason}."


# Where earlier versions kept them (window.ini): read once per model, moved to the store.
SETTINGS_GROUP = "load_settings"
LEGACY_KEYS = {"gpu_layers": "n_gpu_layers"}


def settings_key(path: Path) -> str:
    """A QSettings key for a model file (paths hold characters QSettings treats specially)."""
    return hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:16]


def source_text(saved: bool) -> str:
    return f"Settings: {'saved for this model' if saved else 'defaults'}"


class LibraryPanel(QWidget):
    load_requested = Signal(object, object)  # Path, LoadParams
    cancel_requested = Signal()
    eject_requested = Signal()
    selection_changed = Signal(object)  # LibraryEntry | None

    def __init__(
        self,
        model: LibraryModel,
        estimator: Estimator | None,
        parent: QWidget | None = None,
        *,
        settings: QSettings | None = None,
        model_settings: ModelSettingsStore | None = None,
    ) -> None:
        super().__init__(parent)
        self.model = model
        self.settings = settings
        self.model_settings = model_settings
        self._restoring = False
        self.table = QTableView()
        self.table.setModel(model)
        self.table.setAccessibleName("Model library")
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        # Every column as wide as its text, the name's too: a long name makes the table
        # scroll sideways rather than shrink to "S…". (No stretched section: with one, the
        # header took the panel's width, not the view's, and always scrolled.)
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(False)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        # Rename: F2, a double-click on the name, or the context menu; the window applies it.
        self.table.setEditTriggers(
            QAbstractItemView.EditTrigger.EditKeyPressed
            | QAbstractItemView.EditTrigger.DoubleClicked
        )
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.table.customContextMenuRequested.connect(self._context_menu)
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
        self._flash_wanted = "auto"  # the user's choice, back when drafting is switched off
        # The selected model's kernels decide whether drafting can be exact (set per model).
        self._drafting_exact = Exactness(False, "no model selected")
        self._exact_by_path: dict[Path, Exactness] = {}
        self.spec_mode = QComboBox()
        self.spec_mode.setAccessibleName("Speculative decoding")
        for mode, title in SPEC_MODES:
            self.spec_mode.addItem(title, mode)
        self.spec_mode.setToolTip(
            "Draft tokens cheaply and let the model check several at once. Output is the "
            "model's own. Whether checking several at once is faster depends on the model "
            "and this computer: the model measures it as it answers, drafts only while it "
            "pays, and the performance panel shows the measured gain. Prompt lookup copies "
            "from the conversation (useful when the answer quotes it); a draft model is a "
            "smaller model with the same tokenizer."
        )
        self.draft_model = QComboBox()
        self.draft_model.setAccessibleName("Draft model")
        self.draft_max = QSpinBox()
        self.draft_max.setAccessibleName("Draft max")
        self.draft_max.setRange(0, 64)
        self.draft_max.setSpecialValueText("auto")
        self.draft_max.setToolTip(
            "Most tokens drafted per step (auto: "
            f"{DEFAULT_DRAFT_MAX} for lookup, {DEFAULT_MODEL_DRAFT_MAX} "
            "for a draft model)"
        )
        self.spec_note = QLabel()
        self.spec_note.setWordWrap(True)
        self.spec_note.setAccessibleName("Speculative decoding note")
        self.remember = QCheckBox("Remember for this model")
        self.remember.setAccessibleName("Remember settings for this model")
        self.remember.setToolTip(
            "Load this model with these settings next time, here and when an app asks the "
            "Local server or `candlewick serve` for it. Off: its saved settings are forgotten."
        )
        self.remember.setChecked(True)
        self.settings_source = QLabel(source_text(False))
        self.settings_source.setAccessibleName("Where the settings come from")

        settings_box = QGroupBox("Load settings")
        form = QFormLayout(settings_box)
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
        spec_row = QHBoxLayout()
        spec_row.addWidget(self.spec_mode, 1)
        spec_row.addWidget(QLabel("max"))
        spec_row.addWidget(self.draft_max)
        form.addRow("Speculative", spec_row)
        form.addRow("Draft model", self.draft_model)
        form.addRow(self.spec_note)
        form.addRow(self.remember)
        form.addRow(self.settings_source)

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
        # Settings changed since the selected model was loaded only apply after a reload.
        self.reload_hint = QLabel()
        self.reload_hint.setObjectName("reloadHint")
        self.reload_hint.setWordWrap(True)
        self.reload_hint.setAccessibleName("Reload to apply")
        self.reload_hint.setStyleSheet("color: #b26a00;")  # readable on light and dark
        self.reload_hint.hide()
        # An embedding model is selected: why Load is off.
        self.kind_note = QLabel()
        self.kind_note.setWordWrap(True)
        self.kind_note.setAccessibleName("Not a chat model")
        self.kind_note.hide()
        buttons = QHBoxLayout()
        buttons.addWidget(self.load_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.eject_button)

        lay = QVBoxLayout(self)
        lay.addWidget(self.table, 1)
        lay.addWidget(settings_box)
        lay.addWidget(est_box)
        lay.addLayout(buttons)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addWidget(self.reload_hint)
        lay.addWidget(self.kind_note)

        self.load_button.clicked.connect(self._request_load)
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.eject_button.clicked.connect(self.eject_requested)
        self.ctx_slider.valueChanged.connect(self._settings_changed)
        self.gpu_slider.valueChanged.connect(self._settings_changed)
        self.gpu_auto.toggled.connect(self._settings_changed)
        self.flash.currentIndexChanged.connect(self._remember_flash)  # before it is saved
        for combo in (self.type_k, self.type_v, self.flash, self.spec_mode, self.draft_model):
            combo.currentIndexChanged.connect(self._settings_changed)
        self.draft_max.valueChanged.connect(self._settings_changed)
        self.remember.toggled.connect(self._remember_toggled)
        self._loaded: LoadedModel | None = None
        self._loading = False
        # The context the user asked for; kept across models, clamped to each one's maximum.
        self._ctx_wanted = DEFAULT_CTX
        self.ctx_slider.valueChanged.connect(self._remember_ctx)  # not fired by _configure_for
        self._fill_draft_models()
        self._configure_for(None)
        self._sync_buttons()

    # -- names -----------------------------------------------------------------------------

    def rename_actions(self, entry: LibraryEntry) -> QMenu:
        """The table's context menu for `entry`: Rename…, and back to the derived name."""
        menu = QMenu(self)
        row = self.model.row_of(entry.id)
        rename = menu.addAction("Rename…")
        rename.setEnabled(entry.error is None)
        rename.triggered.connect(lambda: self.start_rename(row))
        reset = menu.addAction(f"Use the derived name ({entry.derived_name})")
        reset.setEnabled(entry.custom_name is not None)
        reset.triggered.connect(lambda: self.model.rename_requested.emit(entry.id, ""))
        return menu

    def start_rename(self, row: int) -> None:
        """Open the name's editor in the table (as F2 does)."""
        index = self.model.index(row, 0)
        if index.isValid():
            self.table.setCurrentIndex(index)
            self.table.edit(index)

    def _context_menu(self, pos: QPoint) -> None:
        index = self.table.indexAt(pos)
        if not index.isValid():
            return
        menu = self.rename_actions(self.model.entry(index.row()))
        menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        menu.popup(self.table.viewport().mapToGlobal(pos))

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

    def speculative(self) -> SpeculativeSettings | None:
        mode: SpecMode = self.spec_mode.currentData()
        if mode == "off":
            return None
        draft = self.draft_model.currentData() if mode == "draft" else None
        return SpeculativeSettings(
            mode=mode,
            draft_model=str(draft) if draft else None,
            draft_max=self.draft_max.value() or None,
        )

    def spec_problem(self) -> str | None:
        """Why the speculative settings cannot be used with the selected model (one line)."""
        if self.spec_mode.currentData() != "draft":
            return None
        draft = self.draft_model.currentData()
        if not draft:
            return "Pick a draft model: a smaller model of the same family in the library."
        entry = self.selected_entry()
        if entry is None:
            return None
        if Path(draft) == entry.path:
            return "A model cannot be its own draft model: pick a smaller one."
        d = self._entry_for(Path(draft))
        if entry.facts and d is not None and d.facts:
            why = vocab_size_mismatch(entry.facts.vocab_size, d.facts.vocab_size)
            if why:
                return f"{d.path.name} cannot be a draft model for {entry.path.name}: {why}."
        return None

    def load_params(self) -> LoadParams:
        spec = self.speculative()
        flash: FlashAttn = self.flash.currentText()  # type: ignore[assignment]
        entry = self.selected_entry()
        return LoadParams(
            # A model paired with a projector loads with it: it reads images or audio.
            mmproj=entry.mmproj if entry is not None else None,
            n_ctx=self.context_length(),
            n_gpu_layers=self.gpu_layers(),
            type_k=self.type_k.currentText(),
            type_v=self.type_v.currentText(),
            flash_attn="on" if spec is not None and self._drafting_exact.exact else flash,
            speculative=spec,
        )

    def _entry_for(self, path: Path) -> LibraryEntry | None:
        for row in range(self.model.rowCount()):
            e = self.model.entry(row)
            if e.path == path:
                return e
        return None

    def _fill_draft_models(self) -> None:
        current = self.draft_model.currentData()
        self.draft_model.blockSignals(True)
        self.draft_model.clear()
        for row in range(self.model.rowCount()):
            e = self.model.entry(row)
            if e.error is None and not is_embedding(e):  # a draft model generates
                self.draft_model.addItem(
                    e.name if e.name == e.path.name else f"{e.name} ({e.path.name})", str(e.path)
                )
        i = self.draft_model.findData(current) if current else -1
        self.draft_model.setCurrentIndex(max(i, 0) if self.draft_model.count() else -1)
        self.draft_model.blockSignals(False)

    def _remember_flash(self) -> None:
        if self.flash.isEnabled():
            self._flash_wanted = self.flash.currentText()

    # -- per-model memory ------------------------------------------------------------------

    def _stored(self) -> dict[str, Any]:
        """The panel's load settings under the store's names (LoadParams' own)."""
        return {
            "n_ctx": self.context_length(),
            "n_gpu_layers": self.gpu_layers(),
            "type_k": self.type_k.currentText(),
            "type_v": self.type_v.currentText(),
            "flash_attn": self._flash_wanted,
            "speculative": self.spec_mode.currentData(),
            "draft_model": self.draft_model.currentData() or None,
            "draft_max": self.draft_max.value(),
        }

    def save_model_settings(self) -> None:
        entry = self.selected_entry()
        store = self.model_settings
        if store is None or entry is None or self._restoring or not self.remember.isChecked():
            return
        # The sampling defaults saved for the model (by the CLI) stay.
        keep = {k: v for k, v in store.get(entry.path).saved.items() if k not in self._stored()}
        try:
            store.save(entry.path, {**keep, **self._stored()})
        except (OSError, ValueError) as e:  # a full disk: the load goes on, unsaved
            self.set_status(f"Settings not saved: {e}")
            return
        self.settings_source.setText(source_text(True))

    def _remember_toggled(self, on: bool) -> None:
        entry = self.selected_entry()
        if self.model_settings is None or entry is None:
            return
        if on:
            self.save_model_settings()
            return
        try:
            self.model_settings.update(entry.path, dict.fromkeys(self._stored()))
        except (OSError, ValueError) as e:
            self.set_status(f"Settings not forgotten: {e}")
            return
        self.settings_source.setText(source_text(False))

    def _saved_for(self, entry: LibraryEntry) -> dict[str, Any]:
        """The model's saved load settings; those of window.ini moved to the store once."""
        store = self.model_settings
        if store is None:
            return {}
        saved = dict(store.get(entry.path).saved)
        if saved or self.settings is None:
            return saved
        key = f"{SETTINGS_GROUP}/{settings_key(entry.path)}"
        raw = self.settings.value(key)
        try:
            old = json.loads(str(raw)) if raw else None
        except ValueError:
            old = None
        if isinstance(old, dict):
            moved: dict[str, Any] = {}
            for k, v in old.items():
                name = LEGACY_KEYS.get(str(k), str(k))
                with contextlib.suppress(ValueError):  # a hand-edited value: its default
                    moved[name] = check_value(name, v)
            try:
                saved = dict(store.save(entry.path, moved).saved)
            except OSError:
                return moved  # shown now, moved on a later try
            self.settings.remove(key)
        return saved

    def _restore_model_settings(self, entry: LibraryEntry | None) -> bool:
        if entry is None:
            return False
        d = {k: v for k, v in self._saved_for(entry).items() if k in LOAD_KEYS}
        self._restoring = True
        try:
            if not d:
                self._show_defaults()
            if isinstance(d.get("n_ctx"), int):
                self.set_context_length(d["n_ctx"])
            gpu = d.get("n_gpu_layers")
            if gpu is not None:
                self.gpu_auto.setChecked(gpu == "auto")
            if isinstance(gpu, int):
                self.gpu_slider.setValue(gpu)
            for combo, key in ((self.type_k, "type_k"), (self.type_v, "type_v")):
                if d.get(key) in KV_TYPES:
                    combo.setCurrentText(d[key])
            if d.get("flash_attn") in ("auto", "on", "off"):
                self._flash_wanted = d["flash_attn"]
                self.flash.setCurrentText(d["flash_attn"])
            i = self.draft_model.findData(d.get("draft_model"))
            if i >= 0:
                self.draft_model.setCurrentIndex(i)
            if "speculative" in d:
                i = self.spec_mode.findData(d.get("speculative"))
                self.spec_mode.setCurrentIndex(max(i, 0))
            if isinstance(d.get("draft_max"), int):
                self.draft_max.setValue(d["draft_max"])
        finally:
            self._restoring = False
        self.settings_source.setText(source_text(bool(d)))
        return bool(d)

    def _show_defaults(self) -> None:
        """A model with nothing saved starts from the defaults, not the last model's."""
        d = LoadParams()
        self.set_context_length(DEFAULT_CTX)
        self.gpu_auto.setChecked(d.n_gpu_layers == "auto")
        self.type_k.setCurrentText(d.type_k)
        self.type_v.setCurrentText(d.type_v)
        self._flash_wanted = d.flash_attn
        if self.flash.isEnabled():
            self.flash.setCurrentText(d.flash_attn)
        self.spec_mode.setCurrentIndex(0)
        self.draft_max.setValue(0)

    def _on_selection(self, _sel: QItemSelection, _desel: QItemSelection) -> None:
        entry = self.selected_entry()
        self._restoring = True  # the new model's ranges must not overwrite its saved settings
        try:
            self._configure_for(entry)
        finally:
            self._restoring = False
        self._restore_model_settings(entry)
        self._restoring = True  # showing the model's settings is not changing them
        try:
            self._settings_changed()
        finally:
            self._restoring = False
        self._sync_buttons()
        self.selection_changed.emit(entry)

    def _after_reset(self) -> None:
        self._fill_draft_models()
        self._restoring = True
        try:
            self._configure_for(self.selected_entry())
        finally:
            self._restoring = False
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

    def _exactness_of(self, path: Path) -> Exactness:
        if path not in self._exact_by_path:  # reads the header: once per file, not per slider
            try:
                self._exact_by_path[path] = drafting_exact(path)
            except (EngineError, GGUFError) as e:
                return Exactness(False, str(e))
        return self._exact_by_path[path]

    def _settings_changed(self) -> None:
        drafting = self.spec_mode.currentData() != "off"
        selected = self.selected_entry()
        if drafting and selected is not None:
            self._drafting_exact = self._exactness_of(selected.path)
        # Flash attention makes drafted output exact unless the weight kernels differ
        # between a batch and one token (AMX, repacked or sgemm weights): then it only costs.
        force_flash = drafting and self._drafting_exact.exact
        if force_flash and self.flash.isEnabled():
            self.flash.blockSignals(True)
            self.flash.setCurrentText("on")
            self.flash.setEnabled(False)
            self.flash.blockSignals(False)
        elif not force_flash and not self.flash.isEnabled():
            self.flash.blockSignals(True)
            self.flash.setEnabled(True)
            self.flash.setCurrentText(self._flash_wanted)
            self.flash.blockSignals(False)
        self.draft_model.setEnabled(self.spec_mode.currentData() == "draft")
        self.draft_max.setEnabled(drafting)
        problem = self.spec_problem()
        note = (
            (
                FLASH_NOTE
                if self._drafting_exact.exact
                else inexact_note(self._drafting_exact.reason)
            )
            if drafting
            else ""
        )
        self.spec_note.setText(problem or note)
        self.spec_note.setVisible(bool(problem) or drafting)
        self._sync_buttons()
        self.ctx_label.setText(f"{self.context_length():,}")
        self.gpu_slider.setEnabled(not self.gpu_auto.isChecked())
        self.gpu_label.setText(
            "auto" if self.gpu_auto.isChecked() else str(self.gpu_slider.value())
        )
        entry = self.selected_entry()
        if entry is None:
            self.estimate.clear()
        elif entry.error:
            self.estimate.clear()
            self.estimate.verdict.setText(f"This file cannot be used: {entry.error}")
        else:
            self.estimate.update_for(entry.path, self.load_params())
        self.save_model_settings()

    # -- load state ------------------------------------------------------------------------

    def _request_load(self) -> None:
        entry = self.selected_entry()
        if entry is not None and is_embedding(entry):
            self.kind_note.setText(not_for_chat(entry))
            self.kind_note.show()
            return
        if entry is not None and self.spec_problem() is None:
            self.save_model_settings()
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
            self.status.setText(
                f"Loaded {info.name} · context {info.n_ctx:,} · {info.load_s:.2f} s"
            )
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
        embedding = entry is not None and is_embedding(entry)
        self.load_button.setEnabled(
            not self._loading
            and entry is not None
            and entry.error is None
            and not embedding
            and self.spec_problem() is None
        )
        self.kind_note.setText(not_for_chat(entry) if entry is not None and embedding else "")
        self.kind_note.setVisible(embedding)
        self.cancel_button.setEnabled(self._loading)
        self.eject_button.setEnabled(not self._loading and self._loaded is not None)
        self.progress.setVisible(self._loading or self._loaded is not None)
        self._show_reload_hint()

    def _show_reload_hint(self) -> None:
        info, entry = self._loaded, self.selected_entry()
        stale = (
            not self._loading
            and info is not None
            and info.remote is None
            and info.params is not None
            and entry is not None
            and entry.path == info.path
            and self.load_params() != info.params
        )
        text = ""
        if stale and info is not None and info.params is not None:
            text = "Reload to apply: the model was loaded with other settings"
            if self.context_length() != info.params.n_ctx:
                text += f" (context {info.params.n_ctx:,})"
        self.reload_hint.setText(text)
        self.reload_hint.setVisible(bool(text))
        self.load_button.setText("Reload" if text else "Load")

    def selected_path(self) -> Path | None:
        e = self.selected_entry()
        return e.path if e else None
