"""Take docs/images/compare-quants.png: the window's Benchmark page, Compare quants tab,
showing a comparison `bench quality` made (its `--out` file, written with `--max-kld` and/or
`--min-speed`, so it carries each file's speed and memory):

    candlewick bench quality --reference default --make Q4_0 --make Q2_K --make Q4_K_M \\
        --ctx 256 --chunks 8 --max-kld 0.1 --min-speed 40 --out compare.json
    Xvfb :59 -screen 0 1920x1200x24 &
    QT_QPA_PLATFORM=xcb DISPLAY=:59 .venv/bin/python scripts/quant_compare_screenshot.py \
        compare.json --max-kld 0.3

Uses a private, empty profile (the comparison is copied in as the last one saved), so nothing
from your own settings shows up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from PySide6.QtWidgets import QApplication  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("comparison", type=Path, help="a bench quality --out file with a choice")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "compare-quants.png")
    ap.add_argument("--size", default="1400x980", help="the window's size, WxH")
    ap.add_argument(
        "--max-kld", type=float, default=None, help="the limit shown (default: the file's)"
    )
    ap.add_argument(
        "--min-speed", type=float, default=None, help="the limit shown (default: the file's)"
    )
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="candlewick-shots-"))
    os.environ["CANDLEWICK_HOME"] = str(home)
    qapp = QApplication.instance() or QApplication([])
    from app.main import build_window
    from app.services.paths import AppPaths
    from app.ui.bench_page import BenchPage
    from app.ui.quant_compare_view import QuantCompareView

    saved = QuantCompareView.saved_path(AppPaths.default().ensure().data)
    saved.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(args.comparison, saved)
    window = build_window()
    try:
        w, h = (int(x) for x in args.size.split("x"))
        window.resize(w, h)
        window.show()
        window.show_page("benchmark")
        page = window.page("benchmark")
        assert isinstance(page, BenchPage)
        page.setCurrentWidget(page.quants)
        if args.max_kld is not None:
            page.quants.max_kld.setValue(args.max_kld)
        if args.min_speed is not None:
            page.quants.min_speed.setValue(args.min_speed)
        end = time.monotonic() + 2.0
        while time.monotonic() < end:  # let the window lay itself out and paint
            qapp.processEvents()
            time.sleep(0.02)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if not window.grab().save(str(args.out), "PNG"):
            raise SystemExit(f"could not write {args.out}")
        print(args.out)
    finally:
        window.shutdown()
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
