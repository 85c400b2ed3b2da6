"""The Benchmark window: run a workload on the loaded model at several concurrency levels, with
progress and cancel, then the table, the charts and the machine it ran on.

The run happens in the benchmark thread (`app.ui.bench_worker`) on a second instance of the
chat's model, sized for the benchmark (see `engine.bench.embedded`). Everything here runs on
the GUI thread and only reacts to that thread's queued signals.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt, Signal, Slot
from PySide6.QtGui import QPainter, QPaintEvent, QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.ui.bench_table import BenchTable, BenchTableModel
from app.ui.bench_worker import BenchHost, BenchOutcome, BenchRequest
from app.ui.library_model import human_bytes
from app.ui.worker import LoadedModel
from engine.bench.harness import BenchConfig, Progress
from engine.bench.levels import parse_levels
from engine.bench.report import summary_lines
from engine.bench.result import BenchError, BenchResult
from engine.bench.workloads import BUILTIN, Workload, WorkloadError, load_workload

MAX_LEVEL = 64  # each concurrent request is a sequence with its own context
NO_MODEL_TIP = (
    "Load a model in the library first: the benchmark runs the model the chat "
    "uses, with the same settings"
)
CHAT_BUSY_TIP = (
    "Wait for the chat's reply to finish (or press Stop): both would share the "
    "processor and the numbers would be wrong"
)
REMOTE_TIP = (
    "The chat uses a remote server: benchmark it with `candlewick bench --url`; "
    "this view runs models loaded on this computer"
)
INSTANCE_NOTE = (
    "Runs the chat's model file with its load settings (GPU layers, KV cache type, flash "
    "attention) in a second instance sized for the benchmark: one sequence per concurrent "
    "request and a context that fits the workload, freed when the run ends. The weights are "
    "memory-mapped from the same file, so their pages in RAM are shared with the chat's "
    "copy; layers offloaded to a GPU take GPU memory a second time. The chat waits while a "
    "benchmark runs."
)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def build_flags(system_info: str) -> str:
    """'CPU : SSE3 = 1 | AVX2 = 1 | ...' -> 'SSE3 AVX2 ...' (the features that are on)."""
    flags = re.findall(r"([A-Z0-9_]+)\s*=\s*1\b", system_info or "")
    return " ".join(flags) if flags else (system_info or "").strip()


def _count(n: Any, noun: str) -> str:
    if not isinstance(n, int):
        return f"? {noun}s"
    return f"{n} {noun}" + ("" if n == 1 else "s")


def context_line(result: BenchResult) -> str:
    """Hardware and software a result was measured on, as one readable line."""
    m: Mapping[str, Any] = result.machine
    t: Mapping[str, Any] = result.target
    gpus = m.get("gpus") or []
    gpu = ", ".join(
        f"{g.get('name', '?')} ({human_bytes(g['total_bytes'])})"
        if g.get("total_bytes")
        else str(g.get("name", "?"))
        for g in gpus
    )
    parts = [
        f"CPU {m.get('cpu', '?')}",
        f"{m.get('cores_physical', '?')} cores / {m.get('cores_logical', '?')} threads",
        f"RAM {human_bytes(m['ram_bytes'])}" if m.get("ram_bytes") else "RAM ?",
        f"GPU {gpu or 'none'}",
        f"llama-cpp-python {m.get('llama_cpp_python') or '?'} "
        f"({build_flags(str(m.get('llama_cpp_system_info') or ''))})",
        f"model {t.get('name') or t.get('file', '?')}",
        f"{t.get('quantization') or '?'}",
        f"context {t.get('n_ctx_per_request', t.get('n_ctx', '?'))} per request"
        + (f" x {t['n_slots']} sequences" if t.get("n_slots") else ""),
        f"{_count(t.get('n_threads'), 'thread')}, "
        f"{_count(t.get('n_gpu_layers') or 0, 'GPU layer')}",
    ]
    load = m.get("load_avg_1m_before")
    if isinstance(load, int | float):
        parts.append(f"load average {load:.1f} before the run")
    return " · ".join(parts)


class ChartView(QWidget):
    """The charts PNG, scaled to the width available, aspect kept."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.pixmap = QPixmap()
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMinimumHeight(160)
        self.setAccessibleName("Benchmark charts")

    def set_png(self, png: bytes) -> bool:
        pm = QPixmap()
        ok = bool(png) and pm.loadFromData(png, "PNG")
        self.pixmap = pm if ok else QPixmap()
        self.update()
        return ok

    def sizeHint(self) -> QSize:
        return QSize(900, 280)

    def paintEvent(self, e: QPaintEvent) -> None:
        if self.pixmap.isNull():
            return
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
        scaled = self.pixmap.size().scaled(self.size(), Qt.AspectRatioMode.KeepAspectRatio)
        x = (self.width() - scaled.width()) // 2
        p.drawPixmap(x, 0, scaled.width(), scaled.height(), self.pixmap)
        p.end()


class BenchView(QWidget):
    """`running_changed` tells the window to pause the chat; `set_loaded` and `set_chat_busy`
    tell the view what the chat is doing."""

    running_changed = Signal(bool)

    def __init__(
        self,
        host: BenchHost | None = None,
        loaded: Callable[[], LoadedModel | None] | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Benchmark — Candlewick")
        self.host = host or BenchHost(parent=self)
        self._loaded_fn = loaded
        self.loaded: LoadedModel | None = None
        self.chat_busy = False
        self.running = False
        self.result: BenchResult | None = None
        self.png = b""
        self._t_start = 0.0
        self._t_run: float | None = None  # first timed request started
        # The bandwidth measurement's buffer; well above CPU caches (tests may shrink it).
        self.bandwidth_bytes = 512 << 20

        self.table_model = BenchTableModel(self)
        self._build()
        q = Qt.ConnectionType.QueuedConnection
        w = self.host.worker
        w.loading.connect(self._on_loading, q)
        w.progress.connect(self._on_progress, q)
        w.finished.connect(self._on_finished, q)
        w.cancelled.connect(self._on_cancelled, q)
        w.failed.connect(self._on_failed, q)
        self._sync()

    # -- layout ----------------------------------------------------------------------------

    def _build(self) -> None:
        self.workload = QComboBox()
        self.workload.setAccessibleName("Workload")
        for name in BUILTIN:
            self.workload.addItem(name, name)
        self.workload.setToolTip(
            "chat: short questions · rag: long retrieved context · "
            "code: programming tasks · or your own JSONL file"
        )
        self.file_button = QPushButton("JSONL file…")
        self.file_button.setToolTip(
            "Your own prompts: one JSON object a line with 'messages' "
            "(or 'prompt') and 'max_tokens'"
        )
        self.file_button.clicked.connect(self._ask_workload_file)
        wl = QHBoxLayout()
        wl.addWidget(self.workload, 1)
        wl.addWidget(self.file_button)

        self.levels = QLineEdit("1,2,4")
        self.levels.setAccessibleName("Concurrency levels")
        self.levels.setToolTip("comma-separated; at each level that many requests run at once")
        self.requests = QSpinBox()
        self.requests.setRange(1, 1000)
        self.requests.setValue(8)
        self.requests.setAccessibleName("Requests per level")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(0, 8192)
        self.max_tokens.setSpecialValueText("workload's own")
        self.max_tokens.setValue(0)
        self.max_tokens.setAccessibleName("Max tokens per answer")
        self.slo = QDoubleSpinBox()
        self.slo.setRange(0.0, 600.0)
        self.slo.setDecimals(2)
        self.slo.setSingleStep(0.25)
        self.slo.setSuffix(" s")
        self.slo.setSpecialValueText("none")
        self.slo.setValue(1.0)
        self.slo.setAccessibleName("TTFT objective")
        self.slo.setToolTip("report the most concurrent requests whose TTFT p95 stays within it")
        self.roofline = QCheckBox("Measure memory bandwidth (decode roofline)")
        self.roofline.setChecked(True)

        form = QFormLayout()
        form.addRow("Workload", wl)
        form.addRow("Concurrency levels", self.levels)
        form.addRow("Requests per level", self.requests)
        form.addRow("Max tokens per answer", self.max_tokens)
        form.addRow("TTFT objective", self.slo)
        form.addRow("", self.roofline)
        setup = QGroupBox("Setup")
        setup.setLayout(form)

        self.model_label = QLabel()
        self.model_label.setWordWrap(True)
        self.note = QLabel(INSTANCE_NOTE)
        self.note.setWordWrap(True)
        self.note.setEnabled(False)  # dimmed, from the palette
        self.run_button = QPushButton("Run")
        self.run_button.setAccessibleName("Run benchmark")
        self.run_button.clicked.connect(self.run)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Cancel benchmark")
        self.cancel_button.clicked.connect(self.cancel)
        self.save_json_button = QPushButton("Save JSON…")
        self.save_json_button.clicked.connect(self._ask_save_json)
        self.save_png_button = QPushButton("Save PNG…")
        self.save_png_button.clicked.connect(self._ask_save_png)
        buttons = QHBoxLayout()
        for b in (self.run_button, self.cancel_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        for b in (self.save_json_button, self.save_png_button):
            buttons.addWidget(b)
        about = QVBoxLayout()
        about.addWidget(self.model_label)
        about.addWidget(self.note)
        about.addStretch(1)
        about.addLayout(buttons)
        top = QHBoxLayout()
        top.addWidget(setup, 0)
        top.addLayout(about, 1)

        self.progress = QProgressBar()
        self.progress.setAccessibleName("Benchmark progress")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status = QLabel("Choose a workload and press Run.")
        self.status.setAccessibleName("Benchmark status")
        self.error_label = QLabel()
        self.error_label.setAccessibleName("Benchmark error")
        self.error_label.setStyleSheet("color: #c62828;")  # readable on light and dark
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error_label.hide()

        self.table = BenchTable(self.table_model)
        self.table.setAccessibleName("Benchmark results")
        # Which columns a narrow window hides, and how to get them back.
        self.hidden_note = QLabel()
        self.hidden_note.setWordWrap(True)
        self.hidden_note.setEnabled(False)
        self.hidden_note.setAccessibleName("Hidden columns")
        self.hidden_note.hide()
        self.table.hidden_changed.connect(self._on_hidden_columns)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.chart = ChartView()
        results = QWidget()
        rl = QVBoxLayout(results)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.table, 1)
        rl.addWidget(self.hidden_note)
        rl.addWidget(self.summary)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(results)
        self.splitter.addWidget(self.chart)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 2)
        self.context = QLabel()
        self.context.setWordWrap(True)
        self.context.setAccessibleName("Hardware and software")
        self.context.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addWidget(self.error_label)
        lay.addWidget(self.splitter, 1)
        lay.addWidget(self.context)
        self.resize(1280, 860)

    def _on_hidden_columns(self, names: list[str]) -> None:
        self.hidden_note.setText(
            f"Columns hidden: {', '.join(names)}. Right-click the table's header to choose "
            "which show."
        )
        self.hidden_note.setVisible(bool(names))

    # -- what the chat is doing ------------------------------------------------------------

    def set_loaded(self, info: LoadedModel | None) -> None:
        self.loaded = info
        self._sync()

    @Slot()
    def refresh_model(self) -> None:
        """Ask the chat which model is loaded now (after a load, eject or failed load)."""
        if self._loaded_fn is not None:
            self.set_loaded(self._loaded_fn())

    def set_chat_busy(self, busy: bool) -> None:
        self.chat_busy = busy
        self._sync()

    def _sync(self) -> None:
        info = self.loaded
        remote = info is not None and getattr(info, "remote", None) is not None
        can_run = info is not None and not remote and not self.chat_busy and not self.running
        self.run_button.setEnabled(can_run)
        self.run_button.setToolTip(
            NO_MODEL_TIP
            if info is None and not self.running
            else REMOTE_TIP
            if remote and not self.running
            else CHAT_BUSY_TIP
            if self.chat_busy and not self.running
            else "A benchmark is running"
            if self.running
            else "Run the workload on the loaded model at each concurrency level"
        )
        self.cancel_button.setEnabled(self.running)
        have = self.result is not None and not self.running
        self.save_json_button.setEnabled(have)
        self.save_png_button.setEnabled(have and bool(self.png))
        for w in (
            self.workload,
            self.file_button,
            self.levels,
            self.requests,
            self.max_tokens,
            self.slo,
            self.roofline,
        ):
            w.setEnabled(not self.running)
        self.model_label.setText(
            f"<b>Model:</b> {html.escape(info.name)} (a remote server)"
            if remote and info is not None
            else f"<b>Model:</b> {html.escape(info.name)} ({html.escape(info.path.name)})"
            if info is not None
            else "<b>No model loaded.</b> Load one in the library, then run the benchmark."
        )
        if self.result is None:
            self.context.setText("")

    # -- workload --------------------------------------------------------------------------

    def load_workload_file(self, path: Path) -> bool:
        """Add a JSONL workload and select it; a bad file is one line under the progress."""
        try:
            wl = load_workload(str(path))
        except WorkloadError as e:
            self.show_error(f"Workload not loaded: {e}")
            return False
        self.hide_error()
        label = f"{Path(path).name} ({len(wl.prompts)} prompts)"
        i = self.workload.findData(str(path))
        if i < 0:
            self.workload.addItem(label, str(path))
            i = self.workload.count() - 1
        else:
            self.workload.setItemText(i, label)
        self.workload.setCurrentIndex(i)
        return True

    def _ask_workload_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Benchmark workload", "", "JSON Lines (*.jsonl *.json);;All files (*)"
        )
        if path:
            self.load_workload_file(Path(path))

    def chosen_workload(self) -> Workload:
        return load_workload(str(self.workload.currentData()))

    def config(self) -> BenchConfig:
        """The settings on screen; ValueError (one line) when they do not make sense."""
        slo = self.slo.value()
        return BenchConfig(
            concurrency=parse_levels(self.levels.text(), limit=MAX_LEVEL),
            requests=self.requests.value(),
            max_tokens=self.max_tokens.value() or None,
            slo_ttft_s=slo if slo > 0 else None,
            measure_bandwidth=self.roofline.isChecked(),
            bandwidth_bytes=self.bandwidth_bytes,
        )

    # -- running ---------------------------------------------------------------------------

    def run(self) -> bool:
        """Start a run on the loaded model; False (with the reason) when it cannot start."""
        info = self.loaded
        if not self.run_button.isEnabled() or info is None:
            return False
        try:
            workload = self.chosen_workload()
            config = self.config()
            config.validate()
        except (WorkloadError, ValueError, BenchError) as e:
            self.show_error(_one_line(str(e)))
            return False
        self.hide_error()
        self.result, self.png = None, b""
        self.table_model.set_result(None)
        self.chart.set_png(b"")
        self.summary.setText("")
        self._t_start = time.monotonic()
        self._t_run = None
        self.progress.setRange(0, 0)  # busy until the first figure arrives
        self.status.setText("Starting…")
        self._set_running(True)
        self.host.run(BenchRequest(info.host_key, workload, config, title=info.name))
        return True

    def cancel(self) -> None:
        if self.running:
            self.host.cancel()
            self.status.setText(
                "Cancelling… (the request in progress stops at its next "
                "token; finished levels are kept)"
            )

    def shutdown(self) -> None:
        """Cancel a run, end the benchmark thread and close this window."""
        self.host.shutdown()
        self.close()

    def _set_running(self, running: bool) -> None:
        if running != self.running:
            self.running = running
            self.running_changed.emit(running)
        self._sync()

    def _on_loading(self, p: float) -> None:
        if p < 1.0:
            self.status.setText("Giving the benchmark the model's slots (the chat waits)…")

    def _on_progress(self, p: Progress) -> None:
        if not self.running:
            return
        if p.phase == "warmup":
            self.progress.setRange(0, 0)
            self.status.setText("Warming up (an untimed request first)…")
            return
        if p.phase == "bandwidth":
            self.progress.setRange(0, 0)
            self.status.setText("Measuring memory bandwidth for the decode roofline…")
            return
        total = p.levels * p.total
        done = p.level_index * p.total + p.done
        now = time.monotonic()
        if self._t_run is None:
            self._t_run = now
        self.progress.setRange(0, max(1, total))
        self.progress.setValue(done)
        eta = "estimating time left"
        if done > 0 and now > self._t_run:
            left = (now - self._t_run) / done * (total - done)
            eta = f"about {left:.0f} s left" if done < total else "finishing"
        failed = f" · {p.failed} failed" if p.failed else ""
        self.status.setText(
            f"Level {p.level_index + 1} of {p.levels} · {p.concurrency} concurrent · "
            f"request {min(p.done + 1, p.total)} of {p.total}{failed} · {eta}"
        )

    def _on_finished(self, outcome: BenchOutcome) -> None:
        result = outcome.result
        if result.cancelled and not result.levels:
            self._on_cancelled()
            return
        self.result, self.png = result, outcome.png
        self.table_model.set_result(result)
        self.chart.set_png(outcome.png)
        self.summary.setText("\n".join(summary_lines(result)))
        self.context.setText(context_line(result))
        took = time.monotonic() - self._t_start
        levels = result.levels
        planned = len(result.config.concurrency)
        self.progress.setRange(0, 1)
        self.progress.setValue(1 if not result.cancelled else 0)
        if result.cancelled:
            self.status.setText(
                f"Cancelled after {took:.0f} s: results of {len(levels)} of "
                f"{planned} levels kept (the interrupted level is marked)"
            )
        else:
            self.status.setText(f"Done in {took:.0f} s.")
        self._set_running(False)

    def _on_cancelled(self) -> None:
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status.setText("Cancelled before the first level; nothing was measured.")
        self._set_running(False)

    def _on_failed(self, message: str) -> None:
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status.setText("The benchmark did not run.")
        self.show_error(_one_line(message))
        self._set_running(False)

    # -- errors and saving -----------------------------------------------------------------

    def show_error(self, message: str) -> None:
        self.error_label.setText(_one_line(message))
        self.error_label.show()

    def hide_error(self) -> None:
        self.error_label.clear()
        self.error_label.hide()

    def save_json(self, path: Path) -> bool:
        """The full result, as `candlewick bench --out` writes it."""
        if self.result is None:
            return False
        try:
            Path(path).write_text(self.result.to_json(), encoding="utf-8")
        except OSError as e:
            self.show_error(f"Could not save {Path(path).name}: {e.strerror or e}")
            return False
        self.status.setText(f"Saved {path}")
        return True

    def save_png(self, path: Path) -> bool:
        if not self.png:
            return False
        try:
            Path(path).write_bytes(self.png)
        except OSError as e:
            self.show_error(f"Could not save {Path(path).name}: {e.strerror or e}")
            return False
        self.status.setText(f"Saved {path}")
        return True

    def _ask_save_json(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Save benchmark result", "candlewick-bench.json", "JSON (*.json)"
        )
        if path:
            self.save_json(Path(path))

    def _ask_save_png(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Save benchmark charts", "candlewick-bench.png", "PNG image (*.png)"
        )
        if path:
            self.save_png(Path(path))
