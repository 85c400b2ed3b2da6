"""`candlewick serve` end to end: a real process, a free port, a key file, Ctrl+C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.app.cli_inproc import run_cli
from tests.engine.server.conftest import http


@pytest.mark.model  # the child process loads the bundled model
def test_serve_answers_and_stops_cleanly(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("file-key-0123456789\n")
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--port",
            "0",
            "--parallel",
            "2",
            "--ctx",
            "512",
            "--api-key-file",
            str(key_file),
            "--no-embeddings",
        ],
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        rest, line, health = _drive(proc)
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest
    # The defaults: f16 cache, flash attention 'auto' resolved for this build.
    assert "512 tokens per slot, KV cache f16" in line, line
    settings = health["settings"]
    assert settings["kv_type_k"] == settings["kv_type_v"] == "f16"
    assert settings["flash_attn_requested"] == "auto"
    assert settings["flash_attn"] in ("on", "off", "auto")


@pytest.mark.model  # the child process loads the bundled model
def test_serve_kv_type_and_flash_attention(tmp_path: Path) -> None:
    """--kv-type q8_0 --flash-attn on reach llama.cpp (the cache is about half the f16 size)
    and are reported in the startup line, /health and /v1/models."""
    key_file = tmp_path / "key"
    key_file.write_text("file-key-0123456789\n")
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--port",
            "0",
            "--parallel",
            "2",
            "--ctx",
            "512",
            "--api-key-file",
            str(key_file),
            "--no-embeddings",
            "--kv-type",
            "q8_0",
            "--flash-attn",
            "on",
        ],
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        rest, line, health = _drive(proc)
    assert proc.returncode == 0, rest
    assert "KV cache q8_0" in line and "flash attention on" in line, line
    settings = health["settings"]
    assert settings["kv_type_k"] == settings["kv_type_v"] == "q8_0"
    assert settings["flash_attn"] == "on"
    assert settings["slots"] == 2 and settings["ctx_per_slot"] == 512
    # SmolLM2: 30 layers x 192 K/V values x 1024 cells; f16 would be 22.5 MiB, q8_0 about half.
    assert 10 < settings["kv_cache_mib"] < 13, settings
    assert health["models_meta"] == settings


def test_serve_refuses_quantized_v_without_flash_attention() -> None:
    r = run_cli("serve", "--port", "0", "--kv-type", "q4_0", "--flash-attn", "off")
    assert r.returncode == 2
    assert "flash attention" in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def _drive(proc: subprocess.Popen[str]) -> tuple[str, str, dict[str, Any]]:
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed once the model is loaded
        m = re.search(r"on (http://127\.0\.0\.1:\d+) \(2 slots, API key required; ", line)
        assert m, line
        url = m.group(1)
        health: dict[str, Any] = http.get(url + "/health").json()
        assert health["status"] == "ok"
        models = http.get(
            url + "/v1/models", headers={"Authorization": "Bearer file-key-0123456789"}
        ).json()
        health["models_meta"] = models["data"][0]["meta"]
        assert http.get(url + "/v1/models").status_code == 401
        r = http.post(
            url + "/v1/chat/completions",
            headers={"Authorization": "Bearer file-key-0123456789"},
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        r = http.post(
            url + "/v1/embeddings",
            headers={"Authorization": "Bearer file-key-0123456789"},
            json={"input": "hello"},
        )
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
    return rest, line, health


def test_serve_refuses_a_reasoning_budget_below_minus_one() -> None:
    r = run_cli("serve", "--port", "0", "--reasoning-budget", "-2")
    assert r.returncode == 2
    assert "reasoning budget" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
