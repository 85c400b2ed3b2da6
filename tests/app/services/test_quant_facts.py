"""A file's speed and memory for the quant choice: a benchmark run's one-request decode speed
kept as measured and read back as such (before it, unknown without this machine's figures);
the memory estimate of the bundled model (its header only: nothing loads); a file that is
gone is unknown, not an error."""

from __future__ import annotations

from pathlib import Path

from app.services.quant_facts import (
    bench_decode_speed,
    file_memory,
    file_speed,
    record_bench_speed,
)
from app.services.speed_records import SpeedService
from engine.bench.metrics import LevelMetrics
from engine.bench.result import SCHEMA, BenchResult


def _result(levels: list[tuple[int, int, float | None, float | None]]) -> BenchResult:
    """Levels of (concurrency, succeeded, gen_tps_p50, engine_gen_tps_p50)."""
    rows = []
    for conc, ok, tps, engine in levels:
        rows.append(
            {
                **dict.fromkeys(LevelMetrics.__dataclass_fields__, 0),
                "concurrency": conc,
                "requests": max(ok, 1),
                "succeeded": ok,
                "gen_tps_p50": tps,
                "engine_gen_tps_p50": engine,
            }
        )
    return BenchResult.from_dict({"schema": SCHEMA, "levels": rows, "target": {"kind": "x"}})


def test_the_one_request_level_is_the_decode_speed() -> None:
    assert bench_decode_speed(_result([(1, 4, 80.0, 95.0), (4, 4, 40.0, 45.0)])) == 95.0
    assert bench_decode_speed(_result([(1, 4, 80.0, None)])) == 80.0
    assert bench_decode_speed(_result([(2, 4, 80.0, 95.0)])) is None  # no level of one
    assert bench_decode_speed(_result([(1, 0, None, None)])) is None  # every request failed


def test_a_benchmark_speed_is_read_back_as_measured(tmp_path: Path, smollm2_path: Path) -> None:
    service = SpeedService(tmp_path / "data")
    assert file_speed(service, smollm2_path, predict=False).source == "unknown"
    assert not record_bench_speed(service, smollm2_path, _result([(4, 4, 40.0, 45.0)]))
    assert record_bench_speed(service, smollm2_path, _result([(1, 4, 80.0, 95.0)]))
    s = file_speed(service, smollm2_path, predict=False)
    assert (s.tokens_per_s, s.source) == (95.0, "measured")
    assert "the latest by benchmark" in s.detail
    gone = file_speed(service, tmp_path / "gone.gguf")
    assert gone.tokens_per_s is None and gone.source == "unknown"


def test_memory_from_the_estimate(tmp_path: Path, smollm2_path: Path) -> None:
    m = file_memory(smollm2_path)
    weights = smollm2_path.stat().st_size
    assert m.fits is True and m.verdict_text
    assert m.total_bytes is not None and m.total_bytes > weights * 0.9
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 12)
    assert file_memory(broken).fits is None
