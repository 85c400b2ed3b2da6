"""The memory estimate shown before a model is loaded.

The widget does not compute anything: it is given an `Estimator` (a callable) by
app/main.py. Without one it says that no estimate is available rather than guessing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPalette, QPen
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.ui.library_model import human_bytes
from engine.settings import LoadParams

Verdict = str  # "fits" | "partial" | "no" (won't fit)


@dataclass(frozen=True)
class EstimateView:
    """What the estimate widget shows; app/main.py adapts the engine's estimate to this."""

    weights: int
    kv: int
    compute: int
    output: int
    ram: int  # bytes that land in system RAM
    vram: int  # bytes that land in GPU memory (all GPUs)
    free_ram: int | None
    free_vram: int | None
    gpu_layers: int
    verdict: Verdict
    reason: str
    # RAM saved prompt states may grow to: not a llama.cpp buffer (not in `total`, nor in the
    # actual figure it is compared with), but RAM the fit counts.
    prompt_cache: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.output


Estimator = Callable[[Path, LoadParams], EstimateView]

# Hues readable on light and dark palettes; outlines and text come from the palette.
SEGMENTS = (
    ("weights", "Weights", "#4e79a7"),
    ("kv", "KV cache", "#f28e2b"),
    ("compute", "Compute", "#59a14f"),
    ("output", "Output", "#b07aa1"),
)
VERDICT_TEXT = {
    "fits": "Fits in memory",
    "partial": "Fits with partial GPU offload",
    "no": "Won't fit",
}


class MemoryBar(QWidget):
    """A horizontal bar: weights / KV / compute / output, with a mark at free memory."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.estimate: EstimateView | None = None
        self.setMinimumHeight(22)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setAccessibleName("Memory estimate bar")

    def sizeHint(self) -> QSize:
        return QSize(240, 22)

    def set_estimate(self, est: EstimateView | None) -> None:
        self.estimate = est
        if est is not None:
            parts = ", ".join(
                f"{label} {human_bytes(getattr(est, key))}" for key, label, _ in SEGMENTS
            )
            self.setAccessibleDescription(parts)
        self.update()

    def paintEvent(self, _e: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        r = QRectF(self.rect()).adjusted(1, 1, -1, -1)
        p.setPen(QPen(pal.color(QPalette.ColorRole.Mid), 1))
        p.setBrush(pal.color(QPalette.ColorRole.Base))
        p.drawRoundedRect(r, 3, 3)
        est = self.estimate
        if est is None or est.total <= 0:
            p.end()
            return
        # Against free memory when that is comparable; a small model on a big machine would
        # otherwise be a sliver, so then the bar shows the split and the text the share.
        free = est.free_ram or 0
        scale_max = (max(est.total, free) if free and free < 4 * est.total else est.total) * 1.02
        x = r.left()
        p.setPen(Qt.PenStyle.NoPen)
        for key, _label, color in SEGMENTS:
            w = r.width() * getattr(est, key) / scale_max
            p.setBrush(QColor(color))
            p.drawRect(QRectF(x, r.top() + 1, w, r.height() - 2))
            x += w
        if free and free <= scale_max:
            fx = r.left() + r.width() * free / scale_max
            p.setPen(QPen(pal.color(QPalette.ColorRole.Text), 2, Qt.PenStyle.DashLine))
            p.drawLine(int(fx), int(r.top()), int(fx), int(r.bottom()))
        p.end()


class EstimateWidget(QWidget):
    def __init__(self, estimator: Estimator | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.estimator = estimator
        self.current: EstimateView | None = None
        self.bar = MemoryBar()
        self.legend = QLabel()
        self.legend.setWordWrap(True)
        self.placement = QLabel()
        self.placement.setWordWrap(True)  # with VRAM it is longer than a side panel is wide
        self.verdict = QLabel()
        self.verdict.setWordWrap(True)
        self.verdict.setAccessibleName("Memory verdict")
        self.actual = QLabel()
        self.actual.setWordWrap(True)
        self.actual.setAccessibleName("Estimated and actual memory")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        for w in (self.bar, self.legend, self.placement, self.verdict, self.actual):
            lay.addWidget(w)
        self.clear()

    def clear(self) -> None:
        self.current = None
        self.bar.set_estimate(None)
        self.legend.setText("")
        self.placement.setText("")
        self.actual.setText("")
        self.verdict.setText(
            "Select a model to see how much memory it needs."
            if self.estimator
            else "Memory estimate not available in this build."
        )

    def update_for(self, path: Path, params: LoadParams) -> EstimateView | None:
        """Recompute for a model file and load settings; shows and returns the estimate."""
        self.actual.setText("")
        if self.estimator is None:
            self.clear()
            return None
        try:
            est = self.estimator(path, params)
        except (OSError, ValueError, RuntimeError, LookupError) as e:
            # GGUFError / EngineError are ValueError / RuntimeError subclasses.
            self.current = None
            self.bar.set_estimate(None)
            self.legend.setText("")
            self.placement.setText("")
            self.verdict.setText(f"No estimate: {e}")
            return None
        self.current = est
        self.bar.set_estimate(est)
        # Each item on one line (non-breaking spaces): a narrow panel wraps between items.
        self.legend.setText(
            "&nbsp; ".join(
                f"<span style='color:{color}'>■</span>&nbsp;"
                + f"{label} {human_bytes(getattr(est, key))}".replace(" ", "&nbsp;")
                for key, label, color in SEGMENTS
            )
        )
        cache = f" + prompt cache ≤ {human_bytes(est.prompt_cache)}" if est.prompt_cache else ""
        free = (
            f" of {human_bytes(est.free_ram)} free "
            f"({(est.ram + est.prompt_cache) / est.free_ram:.0%})"
            if est.free_ram
            else ""
        )
        vram = ""
        if est.vram or est.free_vram:
            vfree = f" of {human_bytes(est.free_vram)} free" if est.free_vram is not None else ""
            vram = f" · VRAM {human_bytes(est.vram)}{vfree} ({est.gpu_layers} layers)"
        self.placement.setText(
            f"Total {human_bytes(est.total)} · RAM {human_bytes(est.ram)}{cache}{free}{vram}"
        )
        head = VERDICT_TEXT.get(est.verdict, est.verdict)
        self.verdict.setText(f"<b>{head}</b>" + (f" — {est.reason}" if est.reason else ""))
        return est

    def show_actual(self, actual_bytes: int) -> None:
        if self.current is None:
            self.actual.setText(f"Loaded: actual {human_bytes(actual_bytes)}")
        else:
            self.actual.setText(
                f"Estimated {human_bytes(self.current.total)}, actual {human_bytes(actual_bytes)}"
            )
