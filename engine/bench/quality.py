"""Which quant should I run? A reference file and candidate files of the same model scored on
one text: perplexity, and each candidate's KL divergence from the reference, top-token
agreement and change of the next token's probability (llama.cpp's `llama-perplexity
--kl-divergence` report), computed through the one decode loop (engine.bench.quality_pass).

The reference is scored once per (file, text, context, batch, chunks) and kept on disk
(engine.bench.quality_store), so a later candidate costs its own pass only. Models are
loaded one at a time by the caller's `load` (the CLI's, with its settings) and closed after
their pass.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine.bench import quality_store as store
from engine.bench.hw import machine_context
from engine.bench.quality_math import compare_tokens, perplexity
from engine.bench.quality_pass import (
    DEFAULT_BATCH,
    DEFAULT_CTX,
    CandidateScores,
    Chunking,
    TextScorer,
    plan,
)
from engine.bench.quality_result import (
    CandidateRow,
    QualityResult,
    ReferenceRow,
    TextInfo,
)
from engine.bench.quality_text import QualityText
from engine.errors import EngineError
from engine.host.runtime import Model
from engine.model.facts import model_facts
from engine.settings import LoadParams

# What the caller hears: a phase ("reference", "candidate NAME", "cached reference") with
# chunks done and in all.
QualityProgress = Callable[[str, int, int], None]


@dataclass
class QualitySetup:
    ctx: int = DEFAULT_CTX
    n_batch: int = DEFAULT_BATCH
    max_chunks: int | None = None
    cache_dir: Path | None = None  # None: the reference is scored every time
    # candidate path -> the type it was quantized to from the reference (shown in the result)
    made: dict[Path, str] = field(default_factory=dict)


def scoring_load_params(n_threads: int | None = None) -> LoadParams:
    """How a file is loaded to be scored: its main context kept small (the scoring context
    is its own, engine.native.backend.open_scoring), no prompt cache, fixed threads."""
    return LoadParams(
        n_ctx=64,
        n_batch=32,
        n_ubatch=32,
        n_threads=n_threads,
        state_cache_mb=0,
        adapt_threads=False,
    )


def _file_info(model: Model) -> dict[str, Any]:
    path = model.path
    return {
        "path": str(path),
        "name": path.name,
        "size_bytes": path.stat().st_size,
        "quantization": model_facts(model.gguf).quantization,
    }


def run_quality(
    reference: Path,
    candidates: Sequence[Path],
    text: QualityText,
    setup: QualitySetup,
    *,
    load: Callable[[Path], Model],
    progress: QualityProgress | None = None,
    cancel: threading.Event | None = None,
    command: list[str] | None = None,
) -> QualityResult:
    """Score the reference (or take its kept scores) and every candidate on `text`."""
    if not candidates:
        raise EngineError("name at least one candidate file to compare with the reference")

    def tell(phase: str) -> Callable[[int, int], None] | None:
        return None if progress is None else (lambda done, total: progress(phase, done, total))

    created = datetime.now(UTC).isoformat(timespec="seconds")
    ref_model = load(reference)
    try:
        scorer_tokens = ref_model.tokenize(text.text, add_special=True, parse_special=False)
        chunking = plan(len(scorer_tokens), setup.ctx, setup.n_batch, setup.max_chunks)
        key = store.ReferenceKey.of(
            reference, text.sha256, setup.ctx, chunking.n_batch, chunking.chunks
        )
        path = store.cache_path(setup.cache_dir, key) if setup.cache_dir is not None else None
        ref = store.load(path, key) if path is not None else None
        cached = ref is not None
        if ref is None:
            scorer = TextScorer(ref_model, chunking)
            try:
                ref = scorer.reference_pass(
                    scorer_tokens, cancel=cancel, progress=tell("reference")
                )
            finally:
                scorer.close()
            if path is not None:
                store.save(path, ref, key)
        ref_info = _file_info(ref_model)
    finally:
        ref_model.close()
    ppl, ppl_err = perplexity(ref.nll, min_count=1)
    ref_row = ReferenceRow(
        **ref_info,
        ppl=ppl,
        ppl_err=ppl_err,
        tokens_per_s=_tps(chunking, ref.pass_s),
        pass_s=ref.pass_s,
        cached=cached,
    )
    rows = [
        _candidate(
            p,
            text.text,
            ref,
            scorer_tokens,
            chunking,
            setup,
            load,
            tell(f"candidate {p.name}"),
            cancel,
        )
        for p in candidates
    ]
    return QualityResult(
        created=created,
        command=command,
        machine=machine_context(),
        reference=ref_row,
        text=TextInfo(source=text.source, sha256=text.sha256, tokens=len(scorer_tokens)),
        ctx=chunking.ctx,
        n_batch=chunking.n_batch,
        chunks=chunking.chunks,
        scored_tokens=chunking.scored,
        candidates=rows,
    )


def _tps(chunking: Chunking, seconds: float) -> float:
    return chunking.chunks * chunking.ctx / seconds if seconds > 0 else 0.0


def _candidate(
    path: Path,
    text: str,
    ref: store.ReferenceScores,
    tokens: list[int],
    chunking: Chunking,
    setup: QualitySetup,
    load: Callable[[Path], Model],
    progress: Callable[[int, int], None] | None,
    cancel: threading.Event | None,
) -> CandidateRow:
    model = load(path)
    try:
        if model.n_vocab != ref.n_vocab:
            raise EngineError(
                f"{path.name} has a vocabulary of {model.n_vocab} tokens, the reference "
                f"{ref.n_vocab}: not the same model"
            )
        if model.tokenize(text, add_special=True, parse_special=False) != tokens:
            raise EngineError(
                f"{path.name} reads the text as other tokens than the reference: not the same model"
            )
        scorer = TextScorer(model, chunking)
        try:
            scores: CandidateScores = scorer.candidate_pass(
                tokens, ref, cancel=cancel, progress=progress
            )
        finally:
            scorer.close()
        info = _file_info(model)
    finally:
        model.close()
    c = compare_tokens(scores.nll, ref.nll, scores.kld, scores.same_top)
    return CandidateRow(
        **info,
        made_from=setup.made.get(path),
        ppl=c.ppl,
        ppl_err=c.ppl_err,
        ppl_ratio=c.ppl_ratio,
        ppl_ratio_err=c.ppl_ratio_err,
        ln_ppl_ratio=c.ln_ppl_ratio,
        ln_ppl_ratio_err=c.ln_ppl_ratio_err,
        ppl_diff=c.ppl_diff,
        ppl_diff_err=c.ppl_diff_err,
        ppl_correlation=c.ppl_correlation,
        kld_mean=c.kld_mean,
        kld_err=c.kld_err,
        kld_median=c.kld_median,
        kld_p99=c.kld_percentiles["p99"],
        kld_max=c.kld_max,
        kld_percentiles=c.kld_percentiles,
        top1_agreement=c.top1_agreement,
        top1_err=c.top1_err,
        dp_mean=c.dp_mean,
        dp_err=c.dp_err,
        dp_median=c.dp_median,
        dp_rms=c.dp_rms,
        dp_rms_err=c.dp_rms_err,
        dp_max=c.dp_max,
        dp_min=c.dp_min,
        dp_percentiles=c.dp_percentiles,
        tokens_per_s=_tps(chunking, scores.pass_s),
        pass_s=scores.pass_s,
    )


__all__ = [
    "QualityProgress",
    "QualitySetup",
    "QualityText",
    "run_quality",
    "scoring_load_params",
]
