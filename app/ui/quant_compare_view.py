"""The Benchmark page's "Compare quants" tab: which quant should I run?

Pick a reference (the highest-precision file of a model) and candidates from the library (its
quants: the same architecture and tensors), or have candidates made from the reference; the
quality pass scores them on the built-in text off the GUI thread (`app.ui.quant_worker`). The
lists come from the same thread (every file's header read there), so a slow disk never stalls
the window.
Then a table and a scatter of quality loss (mean KL divergence) against generation speed, the
marker's size the memory each needs, and one sentence: the smallest file within the KL
divergence and speed limits set here that fits this machine's memory. The last comparison is
saved and shown again when the app opens; changing a limit re-chooses without running again.
"""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.services.quant_compare import CompareJob, Comparison, LibraryScan
from app.ui.quant_chart import QuantScatter
from app.ui.quant_worker import QuantHost
from engine.bench.quality_pass import DEFAULT_CTX
from engine.bench.quant_choice import QuantChoice, QuantOption, Thresholds
from engine.bench.result import BenchError

MAKE_TYPES = ("Q8_0", "Q4_K_M", "Q4_0", "Q2_K")
HEADERS = (
    "File",
    "Type",
    "Size",
    "KL divergence\n(mean)",
    "Same top\ntoken",
    "Generation\ntokens/s",
    "Speed",
    "Memory\nestimate",
    "Fits",
    "Choice",
)


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.0f} MB"


class QuantCompareView(QWidget):
    """`running_changed` tells the window to pause the chat while the files are scored;
    `library_read`: the lists show the library as it was just read."""

    running_changed = Signal(bool)
    library_read = Signal()

    def __init__(self, host: QuantHost, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.services = host.worker.services
        self.running = False
        self.scanning = False  # the library is being read on the worker's thread
        self._rescan = False  # asked again while it was
        self._scan = LibraryScan()
        self.comparison: Comparison | None = None
        self.ctx = DEFAULT_CTX  # tokens per chunk, as `bench quality --ctx`
        self._build()
        q = Qt.ConnectionType.QueuedConnection
        w = host.worker
        w.progress.connect(self._on_progress, q)
        w.finished.connect(self._on_finished, q)
        w.cancelled.connect(self._on_cancelled, q)
        w.failed.connect(self._on_failed, q)
        w.scanned.connect(self._on_scanned, q)
        self.refresh_library()
        self.load_saved()
        self._sync()

    # -- layout ----------------------------------------------------------------------------

    def _build(self) -> None:
        self.reference = QComboBox()
        self.reference.setAccessibleName("Reference model")
        self.reference.setToolTip(
            "The model's highest-precision file (F16, Q8_0...): the others are scored against it"
        )
        self.reference.currentIndexChanged.connect(lambda _i: self._fill_candidates())
        self.candidates = QListWidget()
        self.candidates.setAccessibleName("Candidate files")
        self.candidates.setToolTip("The library's other quants of the same model")
        self.candidates.setMaximumHeight(110)
        self.make: dict[str, QCheckBox] = {}
        makes = QHBoxLayout()
        for name in MAKE_TYPES:
            box = QCheckBox(name)
            box.setToolTip(f"Make a {name} quant of the reference first (added to the library)")
            self.make[name] = box
            makes.addWidget(box)
        makes.addStretch(1)
        self.chunks = QSpinBox()
        self.chunks.setRange(1, 200)
        self.chunks.setValue(8)
        self.chunks.setAccessibleName("Chunks of text")
        self.chunks.setToolTip(
            f"Chunks of {DEFAULT_CTX} tokens of the built-in text to score: more is steadier "
            "and slower"
        )
        self.max_kld = QDoubleSpinBox()
        self.max_kld.setRange(0.0, 10.0)
        self.max_kld.setDecimals(3)
        self.max_kld.setSingleStep(0.01)
        self.max_kld.setSpecialValueText("no limit")
        self.max_kld.setValue(0.05)
        self.max_kld.setAccessibleName("Largest KL divergence")
        self.max_kld.setToolTip("the quality loss you accept: mean KL divergence, nats")
        self.min_speed = QDoubleSpinBox()
        self.min_speed.setRange(0.0, 10000.0)
        self.min_speed.setDecimals(0)
        self.min_speed.setSingleStep(5)
        self.min_speed.setSuffix(" tokens/s")
        self.min_speed.setSpecialValueText("no limit")
        self.min_speed.setAccessibleName("Slowest generation speed")
        for spin in (self.max_kld, self.min_speed):
            spin.valueChanged.connect(lambda _v: self._rechoose())

        form = QFormLayout()
        form.addRow("Reference", self.reference)
        form.addRow("Candidates", self.candidates)
        form.addRow("Make from it", makes)
        form.addRow("Text", self.chunks)
        setup = QGroupBox("Files")
        setup.setLayout(form)
        limits_form = QFormLayout()
        limits_form.addRow("KL divergence at most", self.max_kld)
        limits_form.addRow("Speed at least", self.min_speed)
        limits = QGroupBox("Your limits")
        limits.setLayout(limits_form)

        self.run_button = QPushButton("Compare")
        self.run_button.setAccessibleName("Compare quants")
        self.run_button.clicked.connect(self.run)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Cancel comparison")
        self.cancel_button.clicked.connect(self.cancel)
        buttons = QVBoxLayout()
        buttons.addWidget(limits)
        row = QHBoxLayout()
        row.addWidget(self.run_button)
        row.addWidget(self.cancel_button)
        row.addStretch(1)
        buttons.addLayout(row)
        buttons.addStretch(1)
        top = QHBoxLayout()
        top.addWidget(setup, 3)
        top.addLayout(buttons, 2)

        self.progress = QProgressBar()
        self.progress.setAccessibleName("Comparison progress")
        self.progress.setRange(0, 1)
        self.status = QLabel("Pick a reference and its quants, then press Compare.")
        self.status.setAccessibleName("Comparison status")
        self.error_label = QLabel()
        self.error_label.setStyleSheet("color: #c62828;")
        self.error_label.setWordWrap(True)
        self.error_label.hide()
        self.sentence = QLabel()
        self.sentence.setAccessibleName("Recommendation")
        self.sentence.setWordWrap(True)
        self.sentence.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.table = QTableWidget(0, len(HEADERS))
        self.table.setAccessibleName("Quants compared")
        self.table.setHorizontalHeaderLabels(list(HEADERS))
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        # Room for a reference and a few candidates without scrolling.
        self.table.setMinimumHeight(190)
        self.chart = QuantScatter()
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(self.table)
        self.splitter.addWidget(self.chart)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 2)

        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addWidget(self.error_label)
        lay.addWidget(self.sentence)
        lay.addWidget(self.splitter, 1)

    # -- the library -----------------------------------------------------------------------

    def refresh_library(self) -> None:
        """Read the library again on the worker's thread; the lists follow (`library_read`)."""
        if self.scanning:
            self._rescan = True  # a file added while the last read was under way
            return
        self.scanning = True
        if self.reference.count() == 0:
            self.reference.setPlaceholderText("Reading the library…")
        self.host.scan()

    def _on_scanned(self, scan: LibraryScan) -> None:
        """The library's readable files as references, the current one kept."""
        self.scanning = False
        self._scan = scan
        keep = self.reference.currentData()
        self.reference.blockSignals(True)
        self.reference.clear()
        for f in scan.references():
            e = f.entry
            q = e.facts.quantization if e.facts is not None else ""
            self.reference.addItem(e.name if q and q in e.name else f"{e.name} ({q or '?'})", e.id)
        i = self.reference.findData(keep)
        self.reference.setCurrentIndex(max(i, 0) if self.reference.count() else -1)
        self.reference.setPlaceholderText(scan.error or "No models in the library")
        self.reference.blockSignals(False)
        self._fill_candidates()
        self._sync()
        if self._rescan:
            self._rescan = False
            self.refresh_library()
        else:
            self.library_read.emit()

    def _fill_candidates(self) -> None:
        self.candidates.clear()
        for f in self._scan.family(str(self.reference.currentData())):
            e = f.entry
            q = e.facts.quantization if e.facts is not None else ""
            item = QListWidgetItem(f"{e.name} ({q or '?'}, {_mb(f.size)})")
            item.setData(Qt.ItemDataRole.UserRole, e.id)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked)
            self.candidates.addItem(item)

    def showEvent(self, e: QShowEvent) -> None:
        super().showEvent(e)
        if not self.running:
            self.refresh_library()  # a quant made or downloaded since

    # -- running ---------------------------------------------------------------------------

    def thresholds(self) -> Thresholds:
        kld, tps = self.max_kld.value(), self.min_speed.value()
        return Thresholds(max_kld=kld if kld > 0 else None, min_tokens_per_s=tps or None)

    def job(self) -> CompareJob | None:
        ref = self._scan.get(str(self.reference.currentData()))
        if ref is None:
            return None
        picked = [
            str(self.candidates.item(i).data(Qt.ItemDataRole.UserRole))
            for i in range(self.candidates.count())
            if self.candidates.item(i).checkState() == Qt.CheckState.Checked
        ]
        return CompareJob(
            reference=ref.entry.id,
            candidates=picked,
            make=[n for n, box in self.make.items() if box.isChecked()],
            ctx=self.ctx,
            max_chunks=self.chunks.value(),
            thresholds=self.thresholds(),
        )

    def run(self) -> bool:
        job = self.job()
        if self.running:
            return False
        if job is None or not (job.candidates or job.make):
            self.show_error("Pick a reference and at least one candidate, or a type to make")
            return False
        self.hide_error()
        self.progress.setRange(0, 0)
        self.status.setText("Starting…")
        self._set_running(True)
        self.host.run(job)
        return True

    def cancel(self) -> None:
        if self.running:
            self.host.cancel()
            self.status.setText("Cancelling…")

    def shutdown(self) -> None:
        self.host.shutdown()

    def _set_running(self, running: bool) -> None:
        if running != self.running:
            self.running = running
            self.running_changed.emit(running)
        self._sync()

    def _sync(self) -> None:
        self.run_button.setEnabled(not self.running and self.reference.count() > 0)
        self.cancel_button.setEnabled(self.running)
        self.progress.setVisible(self.running)  # an empty bar says nothing between runs
        for w in (self.reference, self.candidates, self.chunks, *self.make.values()):
            w.setEnabled(not self.running)

    def _on_progress(self, phase: str, done: int, total: int) -> None:
        if not self.running:
            return
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        unit = "tensor" if phase.startswith("making") else "chunk"
        self.status.setText(f"{phase[:1].upper()}{phase[1:]}: {unit} {done} of {total}")

    def _on_finished(self, comparison: Comparison) -> None:
        self.progress.setRange(0, 1)
        self.progress.setValue(1)
        self.status.setText(f"Done: {len(comparison.result.candidates)} files scored; saved.")
        self.show_comparison(comparison.rechoose(self.thresholds()))
        self._set_running(False)
        self.refresh_library()  # the quants made are in the library now

    def _on_cancelled(self) -> None:
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status.setText("Cancelled; the last comparison is still shown.")
        self._set_running(False)

    def _on_failed(self, message: str) -> None:
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status.setText("The comparison did not run.")
        self.show_error(message)
        self._set_running(False)

    def show_error(self, message: str) -> None:
        self.error_label.setText(" ".join(message.split()))
        self.error_label.show()

    def hide_error(self) -> None:
        self.error_label.clear()
        self.error_label.hide()

    # -- the result ------------------------------------------------------------------------

    def load_saved(self) -> bool:
        """The last comparison, with the limits it was shown with."""
        path = self.services.saved
        if not path.is_file():
            return False
        try:
            comparison = Comparison.load(path)
        except (BenchError, OSError, ValueError) as e:
            self.status.setText(f"The last comparison could not be read: {e}")
            return False
        t = comparison.choice.thresholds
        for spin, value in ((self.max_kld, t.max_kld), (self.min_speed, t.min_tokens_per_s)):
            spin.blockSignals(True)
            spin.setValue(value or 0.0)
            spin.blockSignals(False)
        self.show_comparison(comparison)
        r = comparison.result
        self.status.setText(f"The last comparison ({r.created[:16].replace('T', ' ')} UTC).")
        return True

    def _rechoose(self) -> None:
        if self.comparison is None:
            return
        self.show_comparison(self.comparison.rechoose(self.thresholds()))
        try:
            self.comparison.save(self.services.saved)  # the limits shown next time
        except OSError as e:
            self.show_error(f"Could not save the limits: {e.strerror or e}")

    def show_comparison(self, comparison: Comparison) -> None:
        self.comparison = comparison
        choice = comparison.choice
        self._fill_table(choice)
        self.chart.show_choice(choice)
        self.sentence.setText(f"<b>{html.escape(choice.sentence)}</b>")

    def _fill_table(self, choice: QuantChoice) -> None:
        self.table.setRowCount(len(choice.options))
        for row, o in enumerate(choice.options):
            cells = self._cells(o, choice)
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if col:
                    item.setTextAlignment(
                        Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
                    )
                if col == 6 and o.speed.detail:
                    item.setToolTip(o.speed.detail)
                if col == 9 and o.name in choice.excluded:
                    item.setToolTip(choice.excluded[o.name])
                if o.name == choice.chosen:
                    font = QFont(item.font())
                    font.setBold(True)
                    item.setFont(font)
                self.table.setItem(row, col, item)

    @staticmethod
    def _cells(o: QuantOption, choice: QuantChoice) -> list[str]:
        tps = o.speed.tokens_per_s
        fits = {True: "yes", False: "no", None: "?"}[o.memory.fits]
        verdict = (
            "recommended"
            if o.name == choice.chosen
            else ("left out" if o.name in choice.excluded else "")
        )
        return [
            o.name + (" (reference)" if o.reference else ""),
            o.quantization or "?",
            _mb(o.size_bytes),
            "0 (reference)" if o.reference else f"{o.kld_mean:.4f}",
            f"{100 * o.top1_agreement:.1f}%",
            "-" if tps is None else f"{tps:.0f}",
            o.speed.source,
            _mb(o.memory.total_bytes),
            fits,
            verdict,
        ]

    @staticmethod
    def saved_path(data_dir: Path) -> Path:
        return data_dir / "quality" / "compare-quants.json"
