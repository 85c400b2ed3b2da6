"""Pictures of the predicted decode speed: the Hub page's Speed column beside the fit badge, and
the chat's model bar with the predicted and the measured speed.

    QT_QPA_PLATFORM=xcb DISPLAY=:1 .venv/bin/python scripts/speed_screenshot.py [--gemma PATH]

A local Hub emulator (tests/hub_emulator.py) serves the bundled SmolLM2 (and Gemma-3-270M when
given) as a repository; this machine's figures are measured by the probe into a private,
empty profile, so the first prediction takes a few seconds. The model bar's measured figure
comes from a real reply of the bundled model. Writes docs/screenshots/hub-speed.png and
docs/screenshots/model-bar-speed.png.
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

from PySide6.QtWidgets import QApplication  # noqa: E402

OUT = ROOT / "docs" / "screenshots"


def wait(app: QApplication, done: Callable[[], bool], timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > end:
            raise SystemExit("timed out waiting for the window")
        app.processEvents()
        time.sleep(0.02)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--gemma", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="candlewick-speed-shot-") as tmp:
        os.environ["CANDLEWICK_HOME"] = tmp
        os.environ["HF_HOME"] = str(Path(tmp) / "hf")
        from keyring.backends import fail

        from app.main import build_window
        from app.services.download_manager import DownloadManager
        from app.services.hub import HubClient, default_fit, header_speed
        from app.services.library import ModelLibrary, bundled_default_model
        from app.services.paths import AppPaths
        from app.services.secrets import TokenStore
        from app.services.speed_records import SpeedService
        from app.ui.model_manager import ModelManagerView
        from engine.host.runtime import Model
        from engine.settings import SamplingParams
        from tests.hub_emulator import running_hub

        app = QApplication.instance() or QApplication(sys.argv)
        smol = bundled_default_model()
        assert smol is not None
        paths = AppPaths.default().ensure()
        speed = SpeedService(paths.data)
        # A measured speed for the bundled model, from a real reply as the chat records it.
        with Model(smol) as m:
            for i in range(3):
                g = m.generate(
                    [{"role": "user", "content": "Tell me about lighthouses."}],
                    SamplingParams(max_tokens=96),
                )
                g.consume()
                if i:  # the first reply after a load is slow (pages touched once): left out
                    speed.record_measured(smol, g.stats.gen_tps, g.stats.n_eval)
        with running_hub() as emu:
            repo = emu.repo("bartowski/SmolLM2-135M-Instruct-GGUF", downloads=1200)
            repo.add(smol.name, source=smol)
            if args.gemma is not None:
                repo.add(args.gemma.name, source=args.gemma)
            tokens = TokenStore(fail.Keyring())  # type: ignore[no-untyped-call]
            hub = HubClient(emu.url, fit=default_fit(), speed=header_speed(speed))
            library = ModelLibrary(paths.models, discovery=False)
            downloads = DownloadManager(library.downloads_state, hub)
            view = ModelManagerView(hub, downloads, library, tokens)
            view.resize(1000, 700)
            view.show()
            view.open_repo("bartowski/SmolLM2-135M-Instruct-GGUF")
            n = 2 if args.gemma is not None else 1
            wait(app, lambda: view.files.rowCount() == n)
            wait(
                app,
                lambda: all(
                    view.files.item(r, 4).text().endswith(("tok/s", "measured"))
                    or "·" in view.files.item(r, 4).text()
                    for r in range(n)
                ),
            )
            view.files.selectRow(0)
            app.processEvents()
            view.grab().save(str(OUT / "hub-speed.png"))
            for r in range(n):
                print(view.files.item(r, 0).text(), "|", view.files.item(r, 4).text())
                print("   ", view.files.item(r, 4).toolTip().replace("\n", "\n    "))
            view.shutdown()
            downloads.close()
        w = build_window(paths)
        w.resize(1000, 700)
        w.show()
        wait(app, lambda: w.model_bar.speed.isVisible())
        app.processEvents()
        bar = w.model_bar
        bar.grab().save(str(OUT / "model-bar-speed.png"))
        print("model bar:", bar.speed.text(), "|", bar.speed.toolTip().replace("\n", " | "))
        w.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
