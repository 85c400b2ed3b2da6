"""Screenshots the UI tests take: into the folder CANDLEWICK_SCREENSHOTS names (the docs'
screenshots, refreshed that way), else the test's temporary folder, where they are still
checked to be pictures."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtWidgets import QApplication, QWidget


def shots_dir(tmp_path: Path) -> Path:
    return Path(os.environ.get("CANDLEWICK_SCREENSHOTS") or tmp_path)


def save_shot(widget: QWidget, path: Path) -> None:
    QApplication.processEvents()
    path.parent.mkdir(parents=True, exist_ok=True)
    assert widget.grab().save(str(path))
    assert path.stat().st_size > 10_000  # a picture, not an empty grab
