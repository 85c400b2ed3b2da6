"""A benchmark result in words: the terminal table, the summary under it (the objective's
answer, the decode roofline) that the Benchmark window shows too, and two results compared.
A workload with images adds their columns and a line on them; a text workload's text is as
it always was."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.bench.metrics import LevelMetrics
from engine.bench.result import BenchError, BenchResult

MiB = 1 << 20


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _mib(v: int | None) -> str:
    return "-" if v is None else f"{v / MiB:.0f}"


def summary_lines(result: BenchResult, *, plain: bool = False) -> list[str]:
    """The largest concurrency meeting the TTFT objective and the decode roofline, a line
    each. `plain`: ASCII only, for a terminal or a file in any encoding."""
    at_most, divided = ("<=", "/") if plain else ("≤", "÷")
    out = []
    slo = result.config.slo_ttft_s
    if slo is not None:
        best = result.max_concurrency_meeting_slo
        out.append(
            f"Most concurrent requests with TTFT p95 {at_most} {slo:g} s: "
            f"{best if best is not None else 'none of the levels'}"
        )
    rf = result.roofline
    if rf is not None:
        achieved = (
            f"achieved {rf.achieved_tps:.1f} tokens/s, {rf.achieved_pct:.0f} % of the limit"
            if rf.achieved_tps is not None and rf.achieved_pct is not None
            else "no single-stream level to compare"
        )
        text = (
            f"Decode roofline: memory read {rf.bandwidth_gb_s:.1f} GB/s {divided} "
            f"{rf.bytes_per_token / MiB:.1f} MiB of weights per token = "
            f"{rf.limit_tps:.0f} tokens/s; {achieved}"
        )
        if result.target.get("n_gpu_layers"):
            text += " (layers on a GPU: its bandwidth sets the limit, not system RAM's)"
        out.append(text)
    if result.has_media:
        out.append(_media_line(result))
    rt = result.retrieval
    if rt is not None:
        s = "s" if rt.questions != 1 else ""
        out.append(
            f"Retrieval (before each prompt, not in TTFT): p50 {rt.ms_p50:.0f} ms, "
            f"p95 {rt.ms_p95:.0f} ms over {rt.questions} question{s} of '{rt.collection}'; "
            f"adds {rt.mean_tokens:.0f} tokens ({rt.mean_passages:.1f} passages) a prompt"
        )
    return out


def _media_line(result: BenchResult) -> str:
    per = f"{result.workload.images} images in {result.workload.prompts} prompts"
    if all(lv.media_tokens is None for lv in result.levels):
        return (
            f"Images: {per}; the server does not report what its projector did "
            "(encode time and media tokens are the embedded engine's figures)"
        )
    return (
        f"Images: {per}; enc ms = the projector's encode time per request (in TTFT), "
        "media t/s = media tokens / encode time, media tok = all requests' media tokens"
    )


TABLE_COLUMNS = (
    "conc",
    "ok/n",
    "fail%",
    "TTFT p50",
    "TTFT p95",
    "pp t/s",
    "gen t/s",
    "lat p50",
    "lat p95",
    "total t/s",
    "RAM MiB",
    "VRAM MiB",
)


MEDIA_COLUMNS = ("images", "media tok", "enc ms p50", "enc ms p95", "media t/s")


def format_table(result: BenchResult) -> str:
    """The terminal table (also valid Markdown), the summary and a sample of each failure."""
    media = result.has_media
    rows = [list(TABLE_COLUMNS) + (list(MEDIA_COLUMNS) if media else [])]
    for lv in result.levels:
        rows.append(
            [
                str(lv.concurrency),
                f"{lv.succeeded}/{lv.requests}",
                f"{100 * lv.failure_rate:.0f}",
                _fmt(lv.ttft_p50, 3),
                _fmt(lv.ttft_p95, 3),
                _fmt(lv.prompt_tps_p50, 1),
                _fmt(lv.gen_tps_p50, 1),
                _fmt(lv.latency_p50),
                _fmt(lv.latency_p95),
                _fmt(lv.total_throughput_tps, 1),
                _mib(lv.peak_ram_bytes),
                _mib(lv.peak_vram_bytes),
            ]
            + (_media_cells(lv) if media else [])
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    out = "\n".join(lines)
    extra = summary_lines(result, plain=True)
    for lv in result.levels:
        for msg in lv.error_samples:
            extra.append(f"concurrency {lv.concurrency} failure: {msg}")
    return out + ("\n\n" + "\n".join(extra) if extra else "")


def _media_cells(lv: LevelMetrics) -> list[str]:
    return [
        str(lv.images),
        _fmt(lv.media_tokens),
        _fmt(lv.media_encode_ms_p50, 1),
        _fmt(lv.media_encode_ms_p95, 1),
        _fmt(lv.media_tps_p50, 0),
    ]


# Higher is better unless listed in LOWER_IS_BETTER.
COMPARE_METRICS = (
    "ttft_p50",
    "ttft_p95",
    "prompt_tps_p50",
    "gen_tps_p50",
    "latency_p50",
    "latency_p95",
    "total_throughput_tps",
    "failure_rate",
    "peak_ram_bytes",
)
# Compared too when both levels sent images.
MEDIA_COMPARE_METRICS = ("media_encode_ms_p50", "media_encode_ms_p95", "media_tps_p50")
LOWER_IS_BETTER = frozenset(
    {
        "ttft_p50",
        "ttft_p95",
        "latency_p50",
        "latency_p95",
        "failure_rate",
        "peak_ram_bytes",
        "media_encode_ms_p50",
        "media_encode_ms_p95",
    }
)


def compare(a: BenchResult, b: BenchResult) -> list[dict[str, Any]]:
    """Per shared concurrency level and metric: A, B and the ratio B/A (JSON-ready rows)."""
    a_levels: dict[int, LevelMetrics] = {lv.concurrency: lv for lv in a.levels}
    rows: list[dict[str, Any]] = []
    for lv_b in b.levels:
        lv_a = a_levels.get(lv_b.concurrency)
        if lv_a is None:
            continue
        both_media = bool(lv_a.images and lv_b.images)
        for m in COMPARE_METRICS + (MEDIA_COMPARE_METRICS if both_media else ()):
            va, vb = getattr(lv_a, m), getattr(lv_b, m)
            ratio = (
                vb / va
                if isinstance(va, int | float) and isinstance(vb, int | float) and va
                else None
            )
            rows.append(
                {
                    "concurrency": lv_b.concurrency,
                    "metric": m,
                    "a": va,
                    "b": vb,
                    "ratio": ratio,
                    "lower_is_better": m in LOWER_IS_BETTER,
                }
            )
    if not rows:
        raise BenchError("the two results share no concurrency level")
    return rows


def format_compare(rows: Sequence[Mapping[str, Any]], a_name: str, b_name: str) -> str:
    lines = [
        f"B/A ratios (A = {a_name}, B = {b_name}); '(lower is better)' marks latencies",
        f"{'conc':>4}  {'metric':<38} {'A':>12} {'B':>12} {'B/A':>8}",
    ]
    for r in rows:
        label = r["metric"] + (" (lower is better)" if r["lower_is_better"] else "")
        lines.append(
            f"{r['concurrency']:>4}  {label:<38} {_fmt(r['a'], 3):>12} "
            f"{_fmt(r['b'], 3):>12} {_fmt(r['ratio'], 2):>8}"
        )
    return "\n".join(lines)


__all__ = [
    "COMPARE_METRICS",
    "LOWER_IS_BETTER",
    "MEDIA_COLUMNS",
    "MEDIA_COMPARE_METRICS",
    "TABLE_COLUMNS",
    "compare",
    "format_compare",
    "format_table",
    "summary_lines",
]
