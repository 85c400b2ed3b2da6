"""`candlewick run` speculative and cache flags, end to end on the real SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from engine.native import huge_pages, llama_lib
from tests.engine.drafting import always_draft  # noqa: F401 (a fixture)

PROMPT = "Repeat exactly: The early bird catches the worm. The early bird catches the worm."


def _run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert (
        main(
            [
                "run",
                "default",
                PROMPT,
                "--temperature",
                "0",
                "--max-tokens",
                "24",
                "--ctx",
                "512",
                "--threads",
                "2",
                "--json",
                *args,
            ]
        )
        == 0
    )
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.usefixtures("always_draft")  # what drafts do, not whether they pay here
def test_lookup_flag_same_text_and_stats(
    capsys: pytest.CaptureFixture[str], smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pinned to the build where drafting is exact: no AMX weights (tests/engine/test_amx.py).
    monkeypatch.setattr(llama_lib, "amx_kernels_safe", lambda: False)
    plain = _run_json(capsys)
    spec = _run_json(capsys, "--lookup", "--draft-max", "4")
    assert spec["text"] == plain["text"]
    assert plain["speculative"] == "off" and plain["draft_tokens"] == 0
    assert plain["acceptance_rate"] is None
    assert spec["speculative"] == "lookup"
    assert 0 < spec["draft_accepted"] <= spec["draft_tokens"]
    assert spec["acceptance_rate"] == round(spec["draft_accepted"] / spec["draft_tokens"], 4)


def test_kv_type_shrinks_the_cache(capsys: pytest.CaptureFixture[str], smollm2_path: Path) -> None:
    f16 = _run_json(capsys, "--kv-type", "f16")
    q8 = _run_json(capsys, "--kv-type", "q8_0", "--flash-attn", "on")
    assert q8["kv_type"] == "q8_0" and q8["flash_attn"] == "on"
    assert f16["flash_attn"] in ("on", "off")  # what the load did with 'auto', not "auto"
    assert f16["huge_pages"] is huge_pages.in_use()  # this process's own setting
    # q8_0 stores 34 bytes per 32 values where f16 stores 64.
    assert q8["kv_mib"] == pytest.approx(f16["kv_mib"] * 34 / 64, rel=0.01)
    assert q8["text"]


def test_bad_combinations_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], gemma_path: Path
) -> None:
    assert main(["run", "default", "hi", "--kv-type", "q4_0", "--flash-attn", "off"]) == 2
    err = capsys.readouterr().err
    assert "quantized V cache needs flash attention" in err and "Traceback" not in err
    assert main(["run", "default", "hi", "--ctx", "256", "--draft", str(gemma_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot be a draft model" in err and err.count("\n") == 1
    with pytest.raises(SystemExit):
        main(["run", "default", "hi", "--lookup", "--draft", str(gemma_path)])
    assert "not allowed with" in capsys.readouterr().err
