"""The typed benchmark result: the published JSON files read back and written again unchanged,
the one summary renderer, and the one parser of concurrency levels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.bench.levels import MAX_CONCURRENCY, parse_levels
from engine.bench.metrics import level_metrics
from engine.bench.report import format_table, summary_lines
from engine.bench.result import BenchError, BenchResult, RooflineReport, RunSettings

PUBLISHED = sorted((Path(__file__).resolve().parents[2] / "docs" / "bench").glob("*.json"))


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.name)
def test_a_result_file_reads_back_and_writes_the_same_json(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    result = BenchResult.from_dict(data)
    assert result.to_dict() == data
    assert json.loads(result.to_json()) == data
    # Typed: the levels, their traces by concurrency, the settings.
    assert [lv.concurrency for lv in result.levels] == result.config.concurrency
    assert set(result.traces) == set(result.config.concurrency)
    assert all(t.latency >= 0 for ts in result.traces.values() for t in ts)


def test_not_a_result() -> None:
    bad: list[object] = [
        {"hello": 1},
        [],
        {"schema": "other/1", "levels": []},
        {"schema": "candlewick-bench/1", "levels": [{"concurrency": 1}]},
    ]
    for data in bad:
        with pytest.raises(BenchError, match="not a Candlewick benchmark result"):
            BenchResult.from_dict(data)


def test_one_summary_for_the_terminal_and_the_window() -> None:
    result = BenchResult(
        config=RunSettings(slo_ttft_s=1.0),
        max_concurrency_meeting_slo=None,
        roofline=RooflineReport(
            bandwidth_gb_s=10.0,
            bytes_per_token=100 << 20,
            limit_tps=95.4,
            achieved_tps=47.7,
            achieved_pct=50.0,
        ),
        levels=[level_metrics(1, [])],
        target={"n_gpu_layers": 4},
    )
    window = summary_lines(result)
    assert window[0] == "Most concurrent requests with TTFT p95 ≤ 1 s: none of the levels"
    assert window[1].startswith("Decode roofline: memory read 10.0 GB/s ÷ 100.0 MiB")
    assert "achieved 47.7 tokens/s, 50 % of the limit" in window[1]
    assert "layers on a GPU" in window[1]
    plain = summary_lines(result, plain=True)
    assert plain == [line.replace("≤", "<=").replace("÷", "/") for line in window]
    assert all(line.isascii() for line in plain)
    assert format_table(result).endswith("\n".join(plain))


def test_one_parser_of_concurrency_levels() -> None:
    assert parse_levels("1,2,4") == [1, 2, 4]
    assert parse_levels(" 8; 2 ,2 ") == [2, 8]
    assert parse_levels(str(MAX_CONCURRENCY)) == [MAX_CONCURRENCY]
    for text, message in (
        ("a,b", "not a comma-separated list"),
        ("", "not a comma-separated"),
        ("-1", "not a comma-separated"),
        ("0,2", "at least 1"),
        ("2,9", "at most 8"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_levels(text, limit=8)
