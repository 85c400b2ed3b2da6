"""Refresh docs/screenshots/bench_view.png: the Benchmark window after a real run on the
bundled model (chat workload, concurrency 1,2,4, a TTFT objective, the roofline).

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/bench_screenshot.py

Uses a private, empty profile so nothing from your own settings shows up. The numbers are
whatever this machine measures while the picture is taken.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from PySide6.QtCore import QEventLoop, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402


def spin_until(cond: Callable[[], bool], timeout_s: float = 900) -> None:
    loop = QEventLoop()
    check = QTimer()
    end = time.monotonic() + timeout_s
    check.timeout.connect(lambda: loop.quit() if cond() or time.monotonic() > end else None)
    check.start(50)
    if not cond():
        loop.exec()
    check.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots" / "bench_view.png")
    ap.add_argument("--levels", default="1,2,4")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    os.environ["CANDLEWICK_HOME"] = tempfile.mkdtemp(prefix="candlewick-shots-")
    qapp = QApplication.instance() or QApplication([])  # noqa: F841 (kept alive)
    from app.main import build_window
    from app.services.library import bundled_default_model
    from app.ui.bench_view import BenchView
    from engine.settings import LoadParams

    window = build_window()
    view = window.findChild(BenchView)
    assert view is not None
    path = bundled_default_model()
    if path is None:
        raise SystemExit("the bundled model is not installed: run `make setup`")
    try:
        window.controller.load(path, LoadParams(n_ctx=2048, n_threads=args.threads))
        spin_until(lambda: view.run_button.isEnabled(), 120)
        view.resize(1280, 900)
        view.show()
        view.levels.setText(args.levels)
        view.requests.setValue(args.requests)
        view.max_tokens.setValue(args.max_tokens)
        view.slo.setValue(1.0)
        if not view.run():
            raise SystemExit(f"the benchmark did not start: {view.error_label.text()}")
        spin_until(lambda: not view.running)
        if view.result is None:
            raise SystemExit(f"no result: {view.error_label.text() or view.status.text()}")
        QApplication.processEvents()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if not view.grab().save(str(args.out)):
            raise SystemExit(f"could not write {args.out}")
        print(f"wrote {args.out}")
    finally:
        window.close()
        window.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
