"""The Benchmark page of the rail: two tabs, "Speed" (the workload benchmark on the chat's
model, `app.ui.bench_view`) and "Compare quants" (quality loss against speed and memory for
quants of one model, `app.ui.quant_compare_view`)."""

from __future__ import annotations

from PySide6.QtWidgets import QTabWidget, QWidget

from app.ui.bench_view import BenchView
from app.ui.quant_compare_view import QuantCompareView


class BenchPage(QTabWidget):
    def __init__(
        self, speed: BenchView, quants: QuantCompareView, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setDocumentMode(True)
        self.speed, self.quants = speed, quants
        self.addTab(speed, "Speed")
        self.addTab(quants, "Compare quants")
        self.setTabToolTip(0, "Requests per second, latency and tokens/s of the chat's model")
        self.setTabToolTip(1, "Which quant should I run? Quality loss, speed and memory")

    def shutdown(self) -> None:
        self.speed.shutdown()
        self.quants.shutdown()
