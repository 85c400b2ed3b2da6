"""benchmarks/flash_attn_default.py without a model: the paired ratios (above 1 when flash
attention is better, for speeds and for times alike), which setting wins at every length, and
the table written between its markers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import flash_attn_default as fa
from benchmarks.doc_tables import replace_between


def row(prefill: float, decode: float, ttft_ms: float, greedy_ms: float) -> dict[str, Any]:
    return {
        "history_tokens": 1990,
        "prefill_tps": prefill,
        "decode_tokens": 128,
        "decode_tps": decode,
        "follow_up_ttft_ms": ttft_ms,
        "follow_up_tokens_read": 17,
        "follow_up_greedy_ttft_ms": greedy_ms,
        "follow_up_greedy_tokens_read": 150,
        "follow_up_depth": 2100,
    }


def runs() -> fa.Runs:
    """Two lengths, two pairs: 'on' reads prompts faster everywhere, decodes faster only at the
    short length, and answers follow-ups in half the time at both."""
    return {
        100: {
            "on": [row(200, 110, 50, 60), row(220, 100, 60, 80)],
            "off": [row(100, 100, 100, 120), row(100, 100, 120, 160)],
        },
        2000: {
            "on": [row(300, 40, 50, 60), row(300, 50, 50, 60)],
            "off": [row(150, 80, 100, 120), row(150, 100, 100, 120)],
        },
    }


def test_ratios_are_paired_and_above_one_when_flash_attention_is_better() -> None:
    s = fa.summarise(runs())
    short, long = s["histories"]["100"], s["histories"]["2000"]
    assert short["prefill_tps"]["ratio"] == {"median": 2.1, "min": 2.0, "max": 2.2}
    assert short["decode_tps"]["ratio"]["median"] == 1.05
    assert long["decode_tps"]["ratio"] == {"median": 0.5, "min": 0.5, "max": 0.5}
    # A time: off over on, so half the time is a ratio of 2.
    assert short["follow_up_ttft_ms"]["ratio"]["median"] == 2.0
    assert long["follow_up_greedy_ttft_ms"]["on"]["median"] == 60
    assert s["faster_at_every_length"] == {
        "prefill_tps": "on",
        "decode_tps": "mixed",
        "follow_up_ttft_ms": "on",
        "follow_up_greedy_ttft_ms": "on",
    }


def test_table_replaces_its_section(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\n{fa.START}\nold\n{fa.END}\n\nafter\n", "utf-8")
    args = argparse.Namespace(
        pairs=2, run_pairs=2, threads=2, histories="100,2000", tokens=128, ctx=8192, merge=None
    )
    text = fa.table(fa.summarise(runs()), args, "SmolLM2-135M-Instruct.Q4_1.gguf")
    replace_between(doc, fa.START, fa.END, text)
    page = doc.read_text("utf-8")
    assert "old" not in page and page.endswith("\n\nafter\n")
    assert "--pairs 2 --threads 2 --histories 100,2000 --tokens 128" in page
    assert "| 1,990 | 210 / 100 | **2.10** (2.00\u20132.20) |" in page
    assert "prefill: on, decode: mixed, follow-up: on, greedy follow-up: on." in page
    assert "| 60 / 120 (150 / 150) | **2.00** (2.00\u20132.00) |" in page
    assert "Measured on:" in page


def test_runs_pool_their_pairs(tmp_path: Path) -> None:
    files = []
    for i in (1, 2):
        out = {"model": "m.gguf", "threads": 2, "n_ctx": 8192, "pairs": 2, "machine": "x"}
        out["runs"] = {str(n): v for n, v in runs().items()}
        files.append(tmp_path / f"run{i}.json")
        files[-1].write_text(json.dumps(out), "utf-8")
    pooled, meta = fa.pooled(files)
    assert list(pooled) == [100, 2000] and meta["pairs"] == 2
    assert [len(pooled[n][m]) for n in pooled for m in fa.MODES] == [4, 4, 4, 4]
    args = argparse.Namespace(
        pairs=4, run_pairs=2, threads=2, histories="100,2000", tokens=128, ctx=8192, merge=files
    )
    text = fa.table(fa.summarise(pooled), args, "m.gguf")
    assert "--tokens 128 > run1.json\n" in text
    assert "--merge run1.json run2.json --write docs/benchmarks.md\n```" in text
    assert "4 pairs alternating pooled from 2 runs" in text
    other = json.loads(files[1].read_text("utf-8")) | {"threads": 1}
    files[1].write_text(json.dumps(other), "utf-8")
    with pytest.raises(SystemExit, match="threads"):
        fa.pooled(files)
