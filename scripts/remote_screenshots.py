"""Screenshots of the remote-engine parts of the window, from the real app and a real server.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/remote_screenshots.py

Starts `candlewick serve` (the bundled SmolLM2, a free port, an API key) in a private, empty
profile, saves a connection to it (the key in a throwaway in-memory keyring), and takes
docs/screenshots/connections.png (the dialog after a successful test) and remote-chat.png (a
chat answered by the server, with its footer).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from PySide6.QtCore import QEventLoop, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication, QWidget  # noqa: E402

from engine.settings import SamplingParams  # noqa: E402
from tests.memory_keyring import MemoryKeyring  # noqa: E402

KEY = "screenshot-key-0123456789"
QUESTION = "Give me three tips for a good night's sleep."


def spin_until(cond: Callable[[], bool], timeout_s: float = 600) -> None:
    loop = QEventLoop()
    check = QTimer()
    end = time.monotonic() + timeout_s
    check.timeout.connect(lambda: loop.quit() if cond() or time.monotonic() > end else None)
    check.start(20)
    if not cond():
        loop.exec()
    check.stop()


def save(widget: QWidget, path: Path) -> None:
    QApplication.processEvents()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not widget.grab().save(str(path)):
        raise SystemExit(f"could not write {path}")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def start_server(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    (work / "key").write_text(KEY + "\n")
    log = work / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.cli",
                "serve",
                "--model",
                "default",
                "--port",
                "0",
                "--parallel",
                "1",
                "--api-key-file",
                str(work / "key"),
                "--no-embeddings",
            ],
            cwd=ROOT,
            env=dict(os.environ, CANDLEWICK_HOME=str(work / "server-home")),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    end = time.monotonic() + 180
    while time.monotonic() < end and proc.poll() is None:
        m = re.search(r"on (http://127\.0\.0\.1:\d+) \(", log.read_text(errors="replace"))
        if m:
            return proc, m.group(1)
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server did not start: {log.read_text(errors='replace')[-1000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="candlewick-remote-shots-"))
    os.environ["CANDLEWICK_HOME"] = str(work / "home")
    qapp = QApplication.instance() or QApplication([])  # noqa: F841 (kept alive)
    from app.main import build_window
    from app.services.connections import Connection, ConnectionStore
    from app.services.secrets import SecretStore
    from app.ui.connections_dialog import ConnectionsDialog

    proc, url = start_server(work)
    connections = ConnectionStore(work / "connections.json", SecretStore(MemoryKeyring()))
    connections.add(Connection("Office server", url, model="default"), KEY)
    window = build_window(
        sampling=SamplingParams(temperature=0.0, max_tokens=120), connections=connections
    )
    window.resize(1440, 900)
    window.show()
    try:
        dialog = window.open_connections()
        assert isinstance(dialog, ConnectionsDialog)
        results: list[bool] = []
        dialog.tested.connect(lambda ok, _text: results.append(ok))
        dialog.test_button.click()
        spin_until(lambda: bool(results), 60)
        save(dialog, args.out / "connections.png")
        dialog.close()

        picker = window.engine_picker
        assert picker is not None
        picker.refresh()
        spin_until(lambda: picker.fetching == 0, 60)
        picker.choose({"connection": "Office server", "model": "default"})
        window.chat_view.input.setPlainText(QUESTION)
        window.chat_view.input.submitted.emit(QUESTION)
        spin_until(lambda: not window.controller.busy)
        t_end = time.monotonic() + 1.0  # a few panel ticks after the reply
        spin_until(lambda: time.monotonic() > t_end)
        save(window, args.out / "remote-chat.png")
    finally:
        window.close()
        window.shutdown()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
