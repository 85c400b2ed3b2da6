"""A quality result as text: the table `candlewick bench quality` prints, and `bench compare`
of two quality results (per file both scored: B/A of each figure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.bench.quality_result import CandidateRow, QualityResult
from engine.bench.result import BenchError

# Compared between two results, per file; all but the agreement and speed: lower is better.
COMPARE_METRICS = (
    "ppl",
    "kld_mean",
    "kld_median",
    "kld_p99",
    "top1_agreement",
    "dp_rms",
    "tokens_per_s",
)
HIGHER_IS_BETTER = frozenset({"top1_agreement", "tokens_per_s"})


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def format_quality_table(r: QualityResult) -> str:
    ref = r.reference
    lines = [
        f"text: {r.text.source} ({r.text.tokens} tokens, sha256 {r.text.sha256[:12]}); "
        f"ctx {r.ctx}, {r.chunks} chunks, {r.scored_tokens} tokens scored",
        f"reference: {ref.name} ({ref.quantization or '?'}, {_mb(ref.size_bytes)})  "
        f"PPL {ref.ppl:.4f} ± {ref.ppl_err:.4f}"
        + ("  (scores from the cache)" if ref.cached else f"  {ref.tokens_per_s:.0f} tokens/s"),
        "",
        f"{'file':<34} {'type':<7} {'size':>9} {'PPL':>17} {'ΔPPL':>7} "
        f"{'KLD mean':>18} {'median':>8} {'p99':>8} {'top-1':>7} {'RMS Δp':>7} {'t/s':>6}",
    ]
    lines.extend(_row(c) for c in r.candidates)
    return "\n".join(lines)


def _row(c: CandidateRow) -> str:
    name = c.name if len(c.name) <= 34 else "…" + c.name[-33:]
    return (
        f"{name:<34} {c.quantization or '?':<7} {_mb(c.size_bytes):>9} "
        f"{f'{c.ppl:.3f} ± {c.ppl_err:.3f}':>17} {100 * (c.ppl_ratio - 1):>+6.2f}% "
        f"{f'{c.kld_mean:.5f} ± {c.kld_err:.5f}':>18} {c.kld_median:>8.5f} {c.kld_p99:>8.4f} "
        f"{100 * c.top1_agreement:>6.2f}% {100 * c.dp_rms:>6.2f}% {c.tokens_per_s:>6.0f}"
    )


def compare_quality(a: QualityResult, b: QualityResult) -> list[dict[str, Any]]:
    """Per file scored in both (by name; the reference as 'reference') and figure: A, B and
    B/A (JSON-ready rows). BenchError when they share no file or were scored on other
    texts or contexts (their figures would not compare)."""
    if (a.text.sha256, a.ctx) != (b.text.sha256, b.ctx):
        raise BenchError("the two results scored other texts or contexts")
    rows: list[dict[str, Any]] = []
    for metric in ("ppl", "tokens_per_s"):
        rows.append(
            _ratio("reference", metric, getattr(a.reference, metric), getattr(b.reference, metric))
        )
    by_name = {c.name: c for c in a.candidates}
    shared = [(by_name[c.name], c) for c in b.candidates if c.name in by_name]
    for ca, cb in shared:
        for metric in COMPARE_METRICS:
            rows.append(_ratio(cb.name, metric, getattr(ca, metric), getattr(cb, metric)))
    if not shared:
        raise BenchError("the two results share no candidate file")
    return rows


def _ratio(file: str, metric: str, va: float, vb: float) -> dict[str, Any]:
    return {
        "file": file,
        "metric": metric,
        "a": va,
        "b": vb,
        "ratio": vb / va if va else None,
        "lower_is_better": metric not in HIGHER_IS_BETTER,
    }


def format_quality_compare(rows: Sequence[Mapping[str, Any]], a_name: str, b_name: str) -> str:
    lines = [
        f"B/A ratios (A = {a_name}, B = {b_name}); '(lower is better)' marks losses of quality",
        f"{'file':<34} {'metric':<32} {'A':>12} {'B':>12} {'B/A':>8}",
    ]
    for r in rows:
        label = r["metric"] + (" (lower is better)" if r["lower_is_better"] else "")
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        name = str(r["file"])
        name = name if len(name) <= 34 else "…" + name[-33:]
        lines.append(f"{name:<34} {label:<32} {r['a']:>12.5g} {r['b']:>12.5g} {ratio:>8}")
    return "\n".join(lines)


__all__ = [
    "COMPARE_METRICS",
    "HIGHER_IS_BETTER",
    "compare_quality",
    "format_quality_compare",
    "format_quality_table",
]
