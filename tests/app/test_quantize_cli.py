"""`candlewick models quantize` through a real process, on the bundled SmolLM2 (Q4_1)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from app.services.paths import AppPaths
from tests.app.cli_inproc import run_cli
from tests.quant_checks import check_smollm2_quant


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("models", *args)


def error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    return line


def test_list_the_types_with_their_sizes(smollm2_path: Path) -> None:
    r = cli("quantize", "default", "--list", "--json")
    assert r.returncode == 0, r.stderr
    listed = {c["type"]: c for c in json.loads(r.stdout)}
    assert "Q4_1" not in listed  # the model's own type
    assert listed["Q4_0"]["exact"] and listed["Q4_0"]["refusal"].startswith(
        "SmolLM2-135M-Instruct.Q4_1.gguf is already quantized (Q4_1"
    )
    assert listed["Q8_0"]["refusal"].startswith("Q8_0 (8.50 bits per weight) is not smaller")
    table = cli("quantize", "default", "--list")
    assert table.stdout.splitlines()[0].split() == ["TYPE", "BITS/WEIGHT", "SIZE", "NOTE"]
    q4_0 = next(ln for ln in table.stdout.splitlines() if ln.startswith("Q4_0 "))
    assert q4_0.split()[1:3] == ["4.50", "92"]  # MB, exact: no "~"


def test_quantize_the_bundled_model_into_the_library(smollm2_path: Path) -> None:
    refused = cli("quantize", "default", "--type", "q2_k")
    assert error_line(refused) == (
        "candlewick: error: SmolLM2-135M-Instruct.Q4_1.gguf is already quantized (Q4_1, 5.00 "
        "bits per weight): quantizing it again to Q2_K loses more quality than quantizing its "
        "16-bit original; add --allow-requantize to make it anyway"
    )
    assert error_line(cli("quantize", "default", "--type", "Q7")).startswith(
        "candlewick: error: unknown quantization type 'Q7'; choose one of F16, BF16, Q8_0"
    )

    r = cli("quantize", "default", "--type", "Q2_K", "--allow-requantize", "--json")
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)
    models = AppPaths.default().models
    # the bundled model's folder is its package's: the quant goes to the library folder
    out = models / "SmolLM2-135M-Instruct-Q2_K.gguf"
    assert Path(made["output"]) == out
    assert made["type"] == "Q2_K" and made["size_bytes"] == out.stat().st_size
    types = check_smollm2_quant(out, smollm2_path, "Q2_K")
    assert made["tensor_types"] == {
        name: sum(1 for t in types.values() if t.name == name)
        for name in ("Q4_0", "F32", "Q3_K", "Q8_0")
    }
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("quantizing default: ")]
    assert progress[-1] == "quantizing default: 272/272 tensors (100%)"
    assert sorted(p.name for p in models.iterdir() if p.suffix == ".gguf") == [out.name]

    listed = json.loads(cli("list", "--json").stdout)
    entry = next(e for e in listed if e["id"] == made["id"])
    assert entry["path"] == str(out)
    assert entry["quantization"] == "Q2_K"
    assert entry["name"] == "SmolLM2 135M Instruct · Q2_K"

    again = cli("quantize", "default", "--type", "Q2_K", "--allow-requantize")
    assert error_line(again) == (f"candlewick: error: {out} already exists; choose another output")
