"""Builds and wires the desktop application (placeholder until the desktop issue lands)."""

from __future__ import annotations

import sys


def run_app() -> int:
    from PySide6.QtWidgets import QApplication, QLabel

    app = QApplication.instance() or QApplication(sys.argv)
    label = QLabel("Candlewick")
    label.setWindowTitle("Candlewick")
    label.show()
    return int(app.exec())
