"""Benchmark arithmetic from hand-made timestamp traces, checked against independent sums."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from engine.bench.harness import bytes_per_token
from engine.bench.metrics import (
    RequestTrace,
    Roofline,
    level_metrics,
    max_concurrency_meeting_slo,
    percentile,
)
from engine.bench.report import compare, format_compare, format_table
from engine.bench.result import SCHEMA, BenchError, BenchResult


def trace(
    i: int,
    start: float,
    first: float | None,
    end: float,
    prompt: int = 100,
    completion: int = 51,
    **kw: object,
) -> RequestTrace:
    return RequestTrace(
        index=i,
        t_start=start,
        t_first=first,
        t_end=end,
        prompt_tokens=prompt,
        completion_tokens=completion,
        **kw,
    )  # type: ignore[arg-type]


@pytest.mark.parametrize("q", [0, 5, 25, 50, 90, 95, 99, 100])
@pytest.mark.parametrize(
    "values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0], [0.1 * i * i for i in range(17)]]
)
def test_percentile_matches_numpy_linear(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_of_nothing_and_bad_rank() -> None:
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_request_metrics_from_timestamps() -> None:
    t = trace(0, start=10.0, first=10.5, end=12.5, prompt=200, completion=41)
    assert t.ttft == pytest.approx(0.5)
    assert t.latency == pytest.approx(2.5)
    assert t.prompt_tps == pytest.approx(200 / 0.5)
    # 41 tokens: the first closes the prompt phase, 40 more in the 2 s after it.
    assert t.gen_tps == pytest.approx(40 / 2.0)
    # Degenerate requests give no rate instead of a division by zero or infinity.
    assert trace(1, 0.0, None, 1.0).ttft is None
    assert trace(1, 0.0, None, 1.0).gen_tps is None
    assert trace(2, 0.0, 0.2, 0.2, completion=1).gen_tps is None
    assert trace(3, 0.0, 0.2, 1.0, prompt=0).prompt_tps is None


def test_level_metrics_over_a_recorded_trace() -> None:
    # Concurrency 2: two requests in flight at a time, one error and one timeout among 6.
    traces = [
        trace(0, 0.0, 0.4, 3.0, prompt=120, completion=53),
        trace(1, 0.0, 0.6, 3.5, prompt=90, completion=30),
        trace(2, 3.0, 3.3, 5.0, prompt=60, completion=18),
        trace(3, 3.5, None, 3.6, completion=0, error="HTTP 500: boom"),
        trace(4, 3.6, 4.0, 7.0, prompt=150, completion=61),
        trace(5, 5.0, None, 8.0, completion=0, timed_out=True),
    ]
    lv = level_metrics(2, traces, slo_ttft_s=0.5)
    ok = [traces[i] for i in (0, 1, 2, 4)]
    ttfts = [t.t_first - t.t_start for t in ok]  # type: ignore[operator]
    lats = [t.t_end - t.t_start for t in ok]
    assert (lv.requests, lv.succeeded, lv.errors, lv.timeouts) == (6, 4, 1, 1)
    assert lv.failure_rate == pytest.approx(2 / 6)
    assert lv.ttft_p50 == pytest.approx(np.percentile(ttfts, 50))
    assert lv.ttft_p95 == pytest.approx(np.percentile(ttfts, 95))
    assert lv.latency_p50 == pytest.approx(np.percentile(lats, 50))
    assert lv.latency_p95 == pytest.approx(np.percentile(lats, 95))
    pps = [t.prompt_tokens / ttft for t, ttft in zip(ok, ttfts, strict=True)]
    assert lv.prompt_tps_p50 == pytest.approx(np.median(pps))
    gens = [(t.completion_tokens - 1) / (t.t_end - t.t_first) for t in ok]  # type: ignore[operator]
    assert lv.gen_tps_p50 == pytest.approx(np.median(gens))
    assert lv.gen_tps_mean == pytest.approx(np.mean(gens))
    # Wall time: first request sent (0.0) to last finished (8.0), failures included.
    assert lv.wall_s == pytest.approx(8.0)
    assert lv.completion_tokens == 53 + 30 + 18 + 61
    assert lv.total_throughput_tps == pytest.approx(162 / 8.0)
    assert lv.requests_per_s == pytest.approx(4 / 8.0)
    assert lv.meets_slo is False  # failures alone break the objective
    assert set(lv.error_samples) == {"HTTP 500: boom", "timed out"}


def test_slo_and_max_concurrency() -> None:
    fast = [trace(i, float(i), i + 0.2, i + 1.0) for i in range(4)]
    slow = [trace(i, float(i), i + 1.5, i + 3.0) for i in range(4)]
    levels = [
        level_metrics(1, fast, slo_ttft_s=1.0),
        level_metrics(2, fast, slo_ttft_s=1.0),
        level_metrics(4, slow, slo_ttft_s=1.0),
    ]
    assert [lv.meets_slo for lv in levels] == [True, True, False]
    assert max_concurrency_meeting_slo(levels) == 2
    assert max_concurrency_meeting_slo([level_metrics(1, slow, slo_ttft_s=1.0)]) is None
    no_slo = level_metrics(1, fast)
    assert no_slo.meets_slo is None
    assert max_concurrency_meeting_slo([no_slo]) is None


def test_all_failed_level_has_no_rates() -> None:
    lv = level_metrics(
        4,
        [
            trace(
                0,
                0.0,
                None,
                0.01,
                completion=0,
                error="connection refused (is the server running?)",
            )
        ],
    )
    assert lv.failure_rate == 1.0
    assert lv.ttft_p50 is None and lv.gen_tps_p50 is None and lv.latency_p95 is None
    assert lv.total_throughput_tps == 0.0
    assert lv.error_samples == ["connection refused (is the server running?)"]
    assert level_metrics(1, []).failure_rate == 0.0


def test_roofline() -> None:
    r = Roofline(bandwidth_bytes_per_s=20e9, bytes_per_token=100_000_000, achieved_tps=150.0)
    assert r.limit_tps == pytest.approx(200.0)
    assert r.achieved_pct == pytest.approx(75.0)
    d = r.to_dict()
    assert d["bandwidth_gb_s"] == pytest.approx(20.0)
    assert Roofline(20e9, 100, None).achieved_pct is None


def test_bytes_per_token_of_real_models(smollm2_path: object, gemma_path: object) -> None:
    from engine.model.gguf import read_gguf

    for path in (smollm2_path, gemma_path):
        gf = read_gguf(path)  # type: ignore[arg-type]
        weights = sum(t.n_bytes for t in gf.tensors)
        embd = gf.tensor("token_embd.weight")
        assert embd is not None
        if gf.tensor("output.weight") is None:  # tied: the embedding is the output matrix
            assert bytes_per_token(gf) == weights
        else:
            assert bytes_per_token(gf) == weights - embd.n_bytes
        # Within the file, below its size: the header and padding are not read per token.
        assert 0 < bytes_per_token(gf) <= gf.file_size


def _result(levels: list[dict[str, object]]) -> BenchResult:
    return BenchResult.from_dict(
        {
            "schema": SCHEMA,
            "levels": levels,
            "config": {"slo_ttft_s": 1.0},
            "max_concurrency_meeting_slo": 1,
            "target": {"kind": "url"},
        }
    )


def test_compare_ratios_and_table() -> None:
    a_lv = level_metrics(1, [trace(0, 0.0, 0.5, 2.0), trace(1, 2.0, 2.5, 4.0)], slo_ttft_s=1.0)
    b_lv = level_metrics(1, [trace(0, 0.0, 0.25, 1.0), trace(1, 1.0, 1.25, 2.0)], slo_ttft_s=1.0)
    a = _result([a_lv.to_dict()])
    b = _result([b_lv.to_dict(), level_metrics(8, []).to_dict()])
    rows = compare(a, b)
    by = {r["metric"]: r for r in rows}
    assert {r["concurrency"] for r in rows} == {1}  # level 8 only exists in B
    assert by["ttft_p50"]["ratio"] == pytest.approx(0.5)
    assert by["total_throughput_tps"]["ratio"] == pytest.approx(2.0)
    assert by["ttft_p50"]["lower_is_better"] and not by["gen_tps_p50"]["lower_is_better"]
    assert by["failure_rate"]["ratio"] is None  # 0/0 is not a ratio
    text = format_compare(rows, "a.json", "b.json")
    assert "ttft_p50" in text and "0.50" in text and "2.00" in text
    json.dumps(rows)  # JSON-ready
    with pytest.raises(BenchError, match="not a Candlewick benchmark result"):
        compare(BenchResult.from_dict({"levels": []}), b)
    with pytest.raises(BenchError, match="share no concurrency"):
        compare(a, _result([level_metrics(2, []).to_dict()]))

    table = format_table(b)
    lines = table.splitlines()
    assert lines[0].startswith("| conc |")
    assert lines[2].split("|")[1].strip() == "1"
    assert "TTFT p95 <= 1 s: 1" in table
    assert not math.isnan(a_lv.ttft_p50 or math.nan)
