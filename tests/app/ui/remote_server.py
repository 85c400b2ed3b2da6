"""`candlewick serve` as a separate process for the desktop's remote-engine tests: the bundled
SmolLM2 on a free port, with an API key read from a file."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
API_KEY = "remote-test-key-0123456789"
_LISTENING = re.compile(r"on (http://127\.0\.0\.1:\d+) \(")


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def kill(self) -> None:
        """SIGKILL: the server dies mid-whatever, as a crashed or unplugged one would."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(workdir: Path, *, key: str = API_KEY, ctx: int = 2048) -> Served:
    """Start the server and return once it listens (it prints its URL after loading)."""
    workdir.mkdir(parents=True, exist_ok=True)
    key_file = workdir / "key"
    key_file.write_text(key + "\n")
    log = workdir / "serve.log"
    env = dict(os.environ, CANDLEWICK_HOME=str(workdir / "home"))
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
                "--ctx",
                str(ctx),
                "--threads",
                "2",
                "--api-key-file",
                str(key_file),
                "--no-embeddings",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    served = Served(proc, "", log)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        m = _LISTENING.search(log.read_text(errors="replace"))
        if m:
            served.url = m.group(1)
            return served
        time.sleep(0.05)  # a separate process: nothing to wait on but its output
    served.kill()
    raise RuntimeError(
        f"candlewick serve did not start (exit {proc.poll()}): "
        f"{log.read_text(errors='replace')[-2000:]}"
    )
