"""The speed and memory of the files a quality result names, for the quant choice
(`engine.bench.quant_choice`): generation speed measured on this machine when the app has a
record of it (chat replies, the Benchmark page's one-request level), else predicted from
the file's header and this machine's measured figures (`SpeedService`; the first prediction
on a machine measures its figures, a few seconds); memory from the estimate at a chat's
default load settings.

Slow calls (a prediction that measures, a dry-run estimate): run off the GUI thread.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.services.speed_records import SpeedService, file_key
from engine.bench.quality_result import QualityResult
from engine.bench.quant_choice import FileMemory, FileSpeed
from engine.bench.result import BenchResult
from engine.errors import EngineError
from engine.memory.estimate import estimate
from engine.memory.params import EstimateParams
from engine.memory.result import VERDICT_TEXT
from engine.model.gguf import GGUFError

log = logging.getLogger("candlewick.bench")


def file_speed(service: SpeedService, path: Path, *, predict: bool = True) -> FileSpeed:
    """Measured when a record exists, else predicted (measuring this machine's figures first
    when `predict` and they are missing), else unknown."""
    try:
        st = path.stat()
    except OSError:
        return FileSpeed(detail="file not found")
    entry = service.records.get(file_key(path.name, st.st_size))
    measured = entry.get("measured")
    if isinstance(measured, dict) and isinstance(measured.get("tokens_per_s"), int | float):
        n = len(measured.get("samples") or [])
        return FileSpeed(
            tokens_per_s=float(measured["tokens_per_s"]),
            source="measured",
            detail=f"decode speed measured on this machine: the median of {n} "
            f"(the latest by {measured.get('source') or 'chat'})",
        )
    try:
        if predict:
            p = service.predict_file(path)
            return FileSpeed(tokens_per_s=p.tokens_per_s, source="predicted", detail=p.basis())
        view = service.view_for_file(path)
    except (EngineError, GGUFError, OSError, RuntimeError) as e:
        log.info("no speed for %s: %s", path.name, e)
        return FileSpeed(detail=str(e))
    if view is None or view.predicted_tps is None:
        return FileSpeed()
    return FileSpeed(tokens_per_s=view.predicted_tps, source="predicted", detail=view.basis)


def bench_decode_speed(result: BenchResult) -> float | None:
    """A benchmark run's decode speed of one request alone: its one-request level's median
    (llama.cpp's own counter where the engine gave it); None without such a level."""
    for lv in result.levels:
        if lv.concurrency == 1 and lv.succeeded > 0:
            tps = lv.engine_gen_tps_p50 or lv.gen_tps_p50
            return tps if tps is not None and tps > 0 else None
    return None


def record_bench_speed(service: SpeedService, path: Path, result: BenchResult) -> bool:
    """Keep a benchmark run's one-request decode speed as measured on `path` (the quant
    choice then says "measured"); False when the run has no such figure."""
    tps = bench_decode_speed(result)
    if tps is None:
        return False
    service.records.measured(file_key(path.name, path.stat().st_size), tps, source="benchmark")
    return True


def file_memory(path: Path, params: EstimateParams | None = None) -> FileMemory:
    """The estimate at `params` (default: a chat's load settings), or unknown when the file
    cannot be estimated."""
    try:
        est = estimate(path, params or EstimateParams(), method="analytic")
    except (EngineError, GGUFError, OSError) as e:
        log.info("no memory estimate for %s: %s", path.name, e)
        return FileMemory()
    return FileMemory(
        total_bytes=est.total_bytes, fits=est.fits, verdict_text=VERDICT_TEXT[est.verdict]
    )


def facts_of(
    result: QualityResult, service: SpeedService, *, predict: bool = True
) -> tuple[dict[str, FileSpeed], dict[str, FileMemory]]:
    """Speed and memory of the reference and every candidate, keyed by path."""
    paths = [result.reference.path, *(c.path for c in result.candidates)]
    speeds = {p: file_speed(service, Path(p), predict=predict) for p in paths}
    memory = {p: file_memory(Path(p)) for p in paths}
    return speeds, memory


__all__ = ["bench_decode_speed", "facts_of", "file_memory", "file_speed", "record_bench_speed"]
