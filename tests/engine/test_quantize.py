"""Quants made locally from the real SmolLM2 (Q4_1): the file llama.cpp's quantizer made, the
progress read from it, a load of the result, and a cancelled run that leaves nothing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.model.gguf import read_gguf
from engine.model.quant_types import (
    QuantizeError,
    RequantizeRefused,
    estimate_size,
    parse_quant_type,
)
from engine.model.quantize import QuantizeResult, quantize_file
from engine.native.load_probe import probe
from engine.native.native_load import NativeLoad
from engine.native.quantize_process import QuantizeCancelled
from tests.quant_checks import check_smollm2_quant


@pytest.fixture(scope="module")
def made_q4_0(
    smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[QuantizeResult, list[tuple[int, int]]]:
    steps: list[tuple[int, int]] = []
    target = tmp_path_factory.mktemp("quants") / "SmolLM2-135M-Instruct-Q4_0.gguf"
    result = quantize_file(
        smollm2_path,
        target,
        "Q4_0",
        allow_requantize=True,
        progress=lambda done, total: steps.append((done, total)),
    )
    return result, steps


def test_q4_0_is_llama_cpp_s_file(
    made_q4_0: tuple[QuantizeResult, list[tuple[int, int]]], smollm2_path: Path
) -> None:
    result, _ = made_q4_0
    assert result.output.name == "SmolLM2-135M-Instruct-Q4_0.gguf"
    assert result.qtype == "Q4_0"
    types = check_smollm2_quant(result.output, smollm2_path, "Q4_0")
    assert result.size_bytes == result.output.stat().st_size
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t.name] = counts.get(t.name, 0) + 1
    assert result.tensor_types == counts == {"Q4_0": 210, "F32": 61, "Q8_0": 1}
    assert result.size_bytes < smollm2_path.stat().st_size  # 4.5 bits a weight, from 5
    assert 4.5 < result.bits_per_weight < 5.5  # the 8-bit embedding holds a third of it
    assert result.seconds > 0
    # a single-type target is sized exactly before it is made
    assert estimate_size(read_gguf(smollm2_path), parse_quant_type("Q4_0")) == result.size_bytes
    assert sorted(p.name for p in result.output.parent.iterdir()) == [result.output.name]


def test_progress_counts_every_tensor_once(
    made_q4_0: tuple[QuantizeResult, list[tuple[int, int]]],
) -> None:
    _, steps = made_q4_0
    assert steps == [(i, 272) for i in range(1, 273)]


def test_the_quant_loads_in_llama_cpp(
    made_q4_0: tuple[QuantizeResult, list[tuple[int, int]]],
) -> None:
    probe(NativeLoad(str(made_q4_0[0].output), n_ctx=256))  # raises with llama.cpp's reason


def test_requantizing_waits_to_be_allowed(smollm2_path: Path, tmp_path: Path) -> None:
    with pytest.raises(RequantizeRefused, match="already quantized"):
        quantize_file(smollm2_path, tmp_path / "q.gguf", "Q2_K")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_is_never_replaced(
    made_q4_0: tuple[QuantizeResult, list[tuple[int, int]]], smollm2_path: Path
) -> None:
    out = made_q4_0[0].output
    before = out.stat().st_mtime_ns
    with pytest.raises(QuantizeError, match="already exists; choose another output"):
        quantize_file(smollm2_path, out, "Q4_0", allow_requantize=True)
    assert out.stat().st_mtime_ns == before


def test_a_cancelled_run_leaves_nothing(smollm2_path: Path, tmp_path: Path) -> None:
    cancel = threading.Event()
    seen: list[int] = []

    def progress(done: int, total: int) -> None:
        seen.append(done)
        cancel.set()  # after the first tensor: the child is working on the file

    with pytest.raises(
        QuantizeCancelled, match=r"^quantizing SmolLM2-135M-Instruct\.Q4_1\.gguf was cancelled$"
    ):
        quantize_file(
            smollm2_path,
            tmp_path / "q.gguf",
            "Q2_K",
            allow_requantize=True,
            progress=progress,
            cancel=cancel,
        )
    assert seen[0] == 1
    assert list(tmp_path.iterdir()) == []  # neither the output nor its hidden partial file
