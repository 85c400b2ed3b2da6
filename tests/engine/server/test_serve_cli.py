"""`candlewick serve` end to end: a real process, a free port, a key file, Ctrl+C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.engine.server.conftest import http


def test_serve_answers_and_stops_cleanly(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("file-key-0123456789\n")
    with subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", "0", "--parallel", "2",
         "--ctx", "512", "--api-key-file", str(key_file), "--no-embeddings"],
        stderr=subprocess.PIPE, text=True) as proc:
        rest = _drive(proc)
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest


def _drive(proc: subprocess.Popen[str]) -> str:
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed once the model is loaded
        m = re.search(r"on (http://127\.0\.0\.1:\d+) \(2 slots, API key required\)", line)
        assert m, line
        url = m.group(1)
        assert http.get(url + "/health").json()["status"] == "ok"
        assert http.get(url + "/v1/models").status_code == 401
        r = http.post(url + "/v1/chat/completions",
                      headers={"Authorization": "Bearer file-key-0123456789"},
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        r = http.post(url + "/v1/embeddings",
                      headers={"Authorization": "Bearer file-key-0123456789"},
                      json={"input": "hello"})
        assert r.status_code == 501
    finally:
        proc.send_signal(signal.SIGINT)
        end = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        rest = proc.stderr.read() if proc.stderr else ""
        proc.wait()
    return rest
