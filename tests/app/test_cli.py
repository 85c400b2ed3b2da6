"""The CLI contract: `candlewick run` and `models list`, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.app.cli_inproc import run_cli


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


@pytest.mark.model
def test_run_json_has_sane_stats() -> None:
    r = cli(
        "run",
        "default",
        "Name three primary colors.",
        "--json",
        "--temperature",
        "0",
        "--max-tokens",
        "48",
        "--ctx",
        "1024",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {
        "text",
        "ttft_s",
        "prompt_tokens",
        "prompt_tps",
        "gen_tokens",
        "gen_tps",
        "stop_reason",
    }
    assert out["text"].strip()
    assert any(c in out["text"].lower() for c in ("red", "blue", "yellow"))
    assert out["prompt_tokens"] > 10
    assert 0 < out["gen_tokens"] <= 48
    assert out["stop_reason"] in ("stop", "length")
    assert 0 < out["ttft_s"] < out["total_s"]
    assert out["prompt_tps"] > 0 and out["gen_tps"] > 0
    # llama.cpp's counters and the wall clock agree on the order of magnitude.
    assert 0.5 * out["gen_tps"] <= out["gen_tps_wall"] <= 1.1 * out["gen_tps"]
    assert r.stderr == ""


@pytest.mark.model
def test_run_streams_plain_text() -> None:
    r = cli(
        "run",
        "default",
        "Say hello.",
        "--max-tokens",
        "8",
        "--seed",
        "7",
        "--ctx",
        "512",
        "--system",
        "You are terse.",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert r.stderr == ""


def test_models_list_json() -> None:
    r = cli("models", "list", "--json")
    assert r.returncode == 0, r.stderr
    models = json.loads(r.stdout)
    default = next(m for m in models if m["id"] == "default")
    assert default["architecture"] == "llama"
    assert default["quantization"] == "Q4_1"
    assert default["context_length"] == 8192
    assert 130_000_000 < default["parameters"] < 140_000_000
    assert default["size_bytes"] == Path(default["path"]).stat().st_size


def test_models_list_table() -> None:
    r = cli("models", "list")
    assert r.returncode == 0
    assert "default" in r.stdout and "Q4_1" in r.stdout


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "file is empty"),
        (b"<html><body>404</body></html>" + b" " * 40, "HTML page"),
        (b"GGUF" + b"\x09\x00\x00\x00" + b"\x00" * 40, "unsupported GGUF version 9"),
    ],
)
def test_bad_model_file_is_one_line_exit_2(tmp_path: Path, content: bytes, fragment: str) -> None:
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    r = cli("run", str(p), "hi")
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_model_id() -> None:
    r = cli("run", "no-such-model", "hi")
    assert r.returncode == 2
    assert "no model called 'no-such-model'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_bad_arguments_exit_2() -> None:
    r = cli("run", "default", "hi", "--gpu-layers", "lots")
    assert r.returncode == 2
    assert "--gpu-layers" in r.stderr


def test_model_too_big_for_memory_is_refused_before_loading() -> None:
    r = cli("run", "default", "hi", "--ctx", "100000000")
    assert r.returncode == 2
    [line] = r.stderr.strip().splitlines()
    assert "of RAM but only" in line and "--force" in line
