"""The command the installed unit runs, run exactly as written (its words, its environment, its
folder) in a private HOME: it serves the Local server's settings (the model, port, slots,
context and key the window saved), and `service status` and `service logs` say so."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import keyring
import pytest

from app.cli import main
from app.services.local_server import KEY_ACCOUNT
from app.services.paths import AppPaths
from app.services.secrets import SERVICE
from app.services.service_units import unit_environment, unit_exec_start
from tests.app.test_service_cli import home, unit_file, window_settings
from tests.engine.clients.bench_servers import free_port

__all__ = ["home"]  # the fixture, shared with the CLI's tests


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["service", *args])
    return code, capsys.readouterr().out


def get(url: str, key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"serve exited {proc.returncode}: {log.read_text()[-3000:]}"
        try:
            status, body = get(url + "/health")
        except (urllib.error.URLError, OSError):
            status, body = 0, {}
        if status == 200 and body.get("status") == "ok" and body.get("model"):
            return dict(body)
        time.sleep(0.2)
    raise AssertionError(f"serve did not become ready: {log.read_text()[-3000:]}")


def test_the_unit_s_command_serves_the_window_s_settings(
    home: Path, tmp_path: Path, smollm2_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = AppPaths.default().ensure()
    model = paths.models / "service-test.gguf"  # a library model of its own name
    try:
        os.link(smollm2_path, model)
    except OSError:
        shutil.copyfile(smollm2_path, model)
    port = free_port()
    window_settings(
        {
            "server/port": port,
            "server/parallel": 2,
            "server/ctx": 1024,
            "server/require_key": "true",
            "library/selected": "service-test",
        }
    )
    assert cli(capsys, "install")[0] == 0
    text = unit_file(home).read_text(encoding="utf-8")
    argv = unit_exec_start(text)
    # As the user manager starts it: the unit's environment and folder, nothing of ours.
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", **unit_environment(text)}
    out = tmp_path / "journal.txt"  # stands for the journal (the unit's stdout and stderr)
    with out.open("wb") as journal:
        proc = subprocess.Popen(argv, env=env, cwd=home, stdout=journal, stderr=journal)
    try:
        url = f"http://127.0.0.1:{port}"
        health = wait_ready(url, proc, out)
        assert health["model"] == "service-test"
        assert (health["slots_total"], health["settings"]["ctx_per_slot"]) == (2, 1024)
        key = keyring.get_keyring().get_password(SERVICE, KEY_ACCOUNT)
        assert get(url + "/v1/models")[0] == 401  # the window's key is required
        status, models = get(url + "/v1/models", key)
        assert status == 200 and "service-test" in [m["id"] for m in models["data"]]

        code, said = cli(capsys, "status")
        assert code == 0
        assert said.splitlines()[-1] == (
            f"server: ok at {url}; models: service-test (ready); slots 0 of 2 busy"
        )
        code, said = cli(capsys, "logs", "-n", "20")
        assert code == 0
        assert re.search(
            r"\d\d:\d\d:\d\d candlewick: serving service-test.gguf as 'service-test'", said
        )
    finally:
        proc.send_signal(signal.SIGTERM)  # as `systemctl --user stop` does
        # uvicorn stops gracefully, then ends by the signal: systemd counts that a clean stop.
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    assert "serving service-test.gguf" in out.read_text()  # the journal has it too
