"""`candlewick connections ...` in a subprocess, against a real `candlewick serve` that needs
an API key. The keyring is a file outside the app's folders (tests.app.services.file_keyring)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app.cli_inproc import run_cli
from tests.app.services.file_keyring import BACKEND
from tests.engine.clients.bench_servers import REPO, candlewick_serve, free_port

KEY = "cli-test-key-98765"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[str]:
    """`candlewick serve` of the default model (`smollm2_path`: its tests are marked `model`)."""
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with candlewick_serve(log, parallel=1, ctx=512, api_key=KEY) as (url, _pid):
        yield url


@pytest.fixture
def keyring_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "keyring.json"
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", BACKEND)
    monkeypatch.setenv("CANDLEWICK_TEST_KEYRING", str(path))
    return path


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "connections", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_add_test_models_remove(server: str, keyring_file: Path, candlewick_home: Path) -> None:
    r = cli("add", "local", server, "--api-key-stdin", stdin=KEY + "\n")
    assert r.returncode == 0, r.stderr
    assert (
        r.stdout.strip() == "saved connection 'local'; API key saved in the system keyring "
        "(FileKeyring)"
    )
    listed = json.loads(cli("list", "--json").stdout)
    assert listed == [
        {
            "name": "local",
            "base_url": server,
            "api": "openai",
            "model": "",
            "verify_tls": True,
            "ca_file": None,
            "connect_timeout_s": 10.0,
            "timeout_s": 120.0,
            "key_env": None,
            "api_key": "keyring",
        }
    ]
    r = cli("test", "local")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("local: ok, 1 model, answered in ")
    assert cli("models", "local").stdout.split() == ["default"]
    # The key is in the keyring file only, never in the app's own folders.
    assert KEY in keyring_file.read_text()
    assert not [
        p for p in candlewick_home.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()
    ]
    # The Ollama dialect of the same server, same key.
    r = cli("add", "local-ollama", server, "--api", "ollama", "--api-key", KEY)
    assert r.returncode == 0, r.stderr
    assert cli("models", "local-ollama", "--json").stdout.count('"default"') == 1
    assert cli("remove", "local").returncode == 0
    assert cli("remove", "local-ollama").returncode == 0
    assert json.loads(keyring_file.read_text()) == {}
    assert cli("list").stdout.startswith("no connections yet")


def test_wrong_key_and_dead_server_are_one_line_errors(server: str, keyring_file: Path) -> None:
    assert cli("add", "bad-key", server, "--api-key", "not-the-key-000").returncode == 0
    r = cli("test", "bad-key")
    assert r.returncode == 2
    assert r.stderr == "candlewick: error: bad-key: wrong or missing API key (HTTP 401)\n"
    r = cli("test", "bad-key", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error_kind"] == "auth"
    dead = f"http://127.0.0.1:{free_port()}"
    assert cli("add", "dead", dead).returncode == 0
    r = cli("models", "dead")
    assert r.returncode == 2
    assert r.stderr == (
        f"candlewick: error: cannot connect to dead ({dead}): connection "
        "refused (is the server running?)\n"
    )


def test_bad_input_is_one_line(keyring_file: Path) -> None:
    for args, message in [
        (("add", "x", "not-a-url"), "x: not an http(s) URL: 'not-a-url'"),
        (
            ("add", "x", "http://h", "--timeout", "0"),
            "x: timeout must be between 0 and 86400 seconds",
        ),
        (("test", "nope"), "no connection named 'nope' (known: none saved yet)"),
        (("add", "x", "http://h", "--api-key-stdin"), "no API key on standard input"),
    ]:
        r = run_cli("connections", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr == f"candlewick: error: {message}\n", args
    assert run_cli("connections", "add", "x", "http://h").returncode == 0
    r = run_cli("connections", "add", "X", "http://h")
    assert r.returncode == 2 and "'x' exists already" in r.stderr


def test_without_a_keyring_keys_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, server: str
) -> None:
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    r = cli("add", "k", server, "--api-key", KEY)
    assert r.returncode == 2 and "--api-key-env" in r.stderr
    assert cli("list").stdout.startswith("no connections yet")  # nothing half-saved
    r = cli("add", "k", server, "--api-key-env", "LAB_API_KEY")
    assert r.returncode == 0 and "read from $LAB_API_KEY" in r.stdout
    assert "key: $LAB_API_KEY (not set)" in cli("list").stdout
    assert cli("test", "k").returncode == 2
    monkeypatch.setenv("LAB_API_KEY", KEY)
    r = cli("test", "k")
    assert r.returncode == 0, r.stderr


def test_run_with_a_connection(server: str, keyring_file: Path) -> None:
    assert cli("add", "local", server, "--api-key", KEY).returncode == 0
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "run",
            "default",
            "Name three colours.",
            "--connection",
            "local",
            "--temperature",
            "0",
            "--max-tokens",
            "8",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["text"] and out["connection"] == "local" and out["model"] == "default"
    assert out["measured_on"] == "client" and out["server_usage"] == ["prompt_tokens", "gen_tokens"]
    assert out["gen_tokens"] == 8 and out["stop_reason"] == "length"
    assert 0 < out["ttft_s"] <= out["total_s"] and out["prompt_tokens"] > 0
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "run", "default", "hi", "--connection", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 2 and "no connection named 'nope'" in r.stderr
