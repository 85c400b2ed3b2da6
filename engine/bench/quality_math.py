"""The mathematics of a quant's quality, on blocks of logits rows: what llama.cpp's
`llama-perplexity` computes, with the same definitions and the same statistics.

A row is the model's logits at one scored position; its target is the token that follows.
For each row: the log normaliser `c = max + log sum exp(l - max)` (a log-probability is
`l - c`), the top token, and the negative log-likelihood of the target. For the reference,
the log-probabilities above `KLD_FLOOR` are kept (sparse: llama.cpp leaves the others out of
the KL sum too); a candidate's row is compared with them: KL(reference || candidate) over
those tokens, the same top token or not, and the change in the target's probability.

One difference from llama.cpp, on purpose: it keeps the reference's log-probabilities as
16-bit codes (about 2e-4 nats apart); these are kept as float32, computed by the very
operations a candidate's are, so a file scored against itself gives a KL divergence of
exactly 0 and agrees on every top token. Their quantisation moves llama.cpp's mean KLD by
far less than 1%.

Blocks are 2-D (rows x vocabulary); the work is a few passes of numpy over them, the same
passes llama.cpp makes in C (a max, an exp-sum; the KL sum only over the kept tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# llama.cpp leaves reference log-probabilities at or below this out of the KL sum
# (`p_log_base > -16.f` in tools/perplexity): their probability is under 1.2e-7.
KLD_FLOOR = -16.0

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Normalised:
    """Per row: the top token (the first of equal maxima, as llama.cpp takes it) and the
    log normaliser `c` (float32: a log-probability is `logit - c` in float32 arithmetic)."""

    top: I32
    c: F32


def normalise(logits: F32, scratch: F32 | None = None) -> Normalised:
    """The top token and log normaliser of each row of `logits` (rows x vocabulary).
    `scratch`: a float32 array of at least the block's shape, reused between blocks."""
    rows = logits.shape[0]
    top = np.argmax(logits, axis=1).astype(np.int32)
    m = logits[np.arange(rows), top]
    buf = scratch[:rows] if scratch is not None else np.empty_like(logits)
    np.subtract(logits, m[:, None], out=buf)
    np.exp(buf, out=buf)
    # float32 pairwise sums: an error near 1e-7 of the sum, as llama.cpp's float terms have.
    total = buf.sum(axis=1).astype(np.float64)
    c = (m.astype(np.float64) + np.log(total)).astype(np.float32)
    return Normalised(top, c)


def target_nll(logits: F32, norm: Normalised, targets: I32) -> F64:
    """Each row's negative log-likelihood of its target token."""
    picked = logits[np.arange(logits.shape[0]), targets].astype(np.float64)
    return norm.c.astype(np.float64) - picked


@dataclass(frozen=True)
class KeptLogProbs:
    """A block's reference log-probabilities above `KLD_FLOOR`, row by row: `rows[k]` and
    `cols[k]` say where `logp[k]` was (row-major order)."""

    rows: I32
    cols: I32
    logp: F32


# Logits this far below the floor (in nats) are candidates too; far more than float32's
# rounding of `c + KLD_FLOOR`, so the exact test after the comparison misses none.
_FLOOR_SLACK = np.float32(1 / 64)


def kept_log_probs(logits: F32, norm: Normalised) -> KeptLogProbs:
    """The log-probabilities of a reference block above `KLD_FLOOR`: `logit - c` (float32,
    the operation `kl_rows` repeats on a candidate) where it is above the floor.

    The logits are compared with `c + KLD_FLOOR` (less a slack) and only those above are
    subtracted and tested exactly: no whole block of differences, and one flat search
    instead of a 2-D one (SmolLM2: 0.7 ms a row before, a quarter of a reference pass)."""
    vocab = logits.shape[1]
    c = norm.c.astype(np.float32)
    loose = c + (np.float32(KLD_FLOOR) - _FLOOR_SLACK)
    flat = np.flatnonzero(logits > loose[:, None])
    rows = flat // vocab
    logp = logits.reshape(-1).take(flat) - c[rows]
    keep = logp > KLD_FLOOR
    if not keep.all():
        flat, rows, logp = flat[keep], rows[keep], logp[keep]
    cols = flat - rows * vocab
    return KeptLogProbs(rows.astype(np.int32), cols.astype(np.int32), logp)


def kl_rows(logits: F32, norm: Normalised, kept: KeptLogProbs, p_ref: F64 | None = None) -> F64:
    """KL(reference || candidate) of each row, summed over the reference's kept tokens:
    sum p_ref * (log p_ref - log p_cand). `p_ref`: `exp(kept.logp)`, when already known."""
    n, vocab = logits.shape
    flat = kept.rows.astype(np.int64) * vocab + kept.cols
    # The candidate's log-probabilities there, by the same float32 operation as the
    # reference's own (`kept_log_probs`): identical logits give identical values.
    cand = logits.reshape(-1)[flat] - norm.c[kept.rows]
    ref = kept.logp
    p = np.exp(ref.astype(np.float64)) if p_ref is None else p_ref
    terms = p * (ref.astype(np.float64) - cand.astype(np.float64))
    return np.bincount(kept.rows, weights=terms, minlength=n).astype(np.float64)


# -- statistics, as llama-perplexity prints them -----------------------------------------------


def mean_and_error(values: F64, *, min_count: int = 10) -> tuple[float, float]:
    """The mean and its standard error, as llama.cpp's `mean_and_uncertainty`: the error is
    0 for `min_count` values or fewer (llama.cpp's KLD report; its plain perplexity run
    gives one from 2 values on: `min_count=1`)."""
    count = values.size
    if count < 1:
        return 0.0, 0.0
    mean = float(values.sum() / count)
    var = float(np.square(values).sum() / count) - mean * mean
    err = math.sqrt(var / (count - 1)) if var > 0 and count > min_count else 0.0
    return mean, err


def covariance(a: F64, b: F64) -> float:
    """llama.cpp's covariance of two means (0 under 10 values)."""
    count = a.size
    if count < 10:
        return 0.0
    return float(((a * b).sum() / count - (a.sum() / count) * (b.sum() / count)) / (count - 1))


def percentile(sorted_values: F64, fraction: float) -> float:
    """llama.cpp's percentile of sorted values: linear between the two nearest ranks."""
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    pos = fraction * (sorted_values.size - 1)
    i = int(pos)
    frac = pos - i
    j = min(i + 1, sorted_values.size - 1)
    return float((1 - frac) * sorted_values[i] + frac * sorted_values[j])


def median(sorted_values: F64) -> float:
    n = sorted_values.size
    if n % 2 == 0:
        return float(0.5 * (sorted_values[n // 2] + sorted_values[n // 2 - 1]))
    return float(sorted_values[n // 2])


def perplexity(nll: F64, *, min_count: int = 10) -> tuple[float, float]:
    """exp(mean NLL) and its ± (the error of the mean, carried through exp)."""
    mean, err = mean_and_error(nll, min_count=min_count)
    ppl = math.exp(mean)
    return ppl, ppl * err


# Which percentiles are reported (llama.cpp's lists), keyed as the result stores them.
KLD_PERCENTILES = {
    "p99_9": 0.999,
    "p99": 0.99,
    "p95": 0.95,
    "p90": 0.90,
    "p10": 0.10,
    "p5": 0.05,
    "p1": 0.01,
    "p0_1": 0.001,
}
DP_PERCENTILES = {
    "p99_9": 0.999,
    "p99": 0.99,
    "p95": 0.95,
    "p90": 0.90,
    "p75": 0.75,
    "p25": 0.25,
    "p10": 0.10,
    "p5": 0.05,
    "p1": 0.01,
    "p0_1": 0.001,
}


@dataclass(frozen=True)
class Comparison:
    """A candidate against the reference over every scored token: llama.cpp's
    `--kl-divergence` report. Probabilities and agreements are fractions (0..1)."""

    count: int
    ppl: float
    ppl_err: float
    ppl_base: float
    ppl_base_err: float
    ppl_correlation: float
    ln_ppl_ratio: float
    ln_ppl_ratio_err: float
    ppl_ratio: float
    ppl_ratio_err: float
    ppl_diff: float
    ppl_diff_err: float
    kld_mean: float
    kld_err: float
    kld_median: float
    kld_max: float
    kld_min: float
    kld_percentiles: dict[str, float]
    top1_agreement: float
    top1_err: float
    dp_mean: float
    dp_err: float
    dp_median: float
    dp_max: float
    dp_min: float
    dp_percentiles: dict[str, float]
    dp_rms: float
    dp_rms_err: float


def compare_tokens(nll: F64, nll_base: F64, kld: F64, same_top: Bools) -> Comparison:
    """The report over all scored tokens: a candidate's NLLs, the reference's, each token's
    KL divergence and whether the top tokens agree."""
    count = int(nll.size)
    if count == 0 or not (nll_base.size == kld.size == same_top.size == count):
        raise ValueError("a comparison needs the same tokens scored on both sides")
    ln_q, ln_q_err = mean_and_error(nll)
    ln_b, ln_b_err = mean_and_error(nll_base)
    ppl, ppl_b = math.exp(ln_q), math.exp(ln_b)
    cov = covariance(nll, nll_base)
    denom = ln_q_err * ln_b_err
    ratio_ln = ln_q - ln_b
    ratio_ln_err = math.sqrt(max(0.0, ln_q_err**2 + ln_b_err**2 - 2.0 * cov))
    ppl_err, ppl_b_err = ppl * ln_q_err, ppl_b * ln_b_err
    diff_err = math.sqrt(max(0.0, ppl_err**2 + ppl_b_err**2 - 2.0 * ppl * ppl_b * cov))
    kld_mean, kld_err = mean_and_error(kld)
    ks = np.sort(kld)
    # llama.cpp works these out in float; the same rounding keeps tiny Δp identical.
    p = np.exp(-nll.astype(np.float32))
    p_base = np.exp(-nll_base.astype(np.float32))
    dp = (p - p_base).astype(np.float64)
    dp_mean, dp_err = mean_and_error(dp)
    ds = np.sort(dp)
    mse, mse_err = mean_and_error(np.square(dp))
    rms = math.sqrt(mse)
    same = float(np.count_nonzero(same_top)) / count
    return Comparison(
        count=count,
        ppl=ppl,
        ppl_err=ppl_err,
        ppl_base=ppl_b,
        ppl_base_err=ppl_b_err,
        ppl_correlation=cov / denom if denom > 0 else 0.0,
        ln_ppl_ratio=ratio_ln,
        ln_ppl_ratio_err=ratio_ln_err,
        ppl_ratio=math.exp(ratio_ln),
        ppl_ratio_err=math.exp(ratio_ln) * ratio_ln_err,
        ppl_diff=ppl - ppl_b,
        ppl_diff_err=diff_err,
        kld_mean=kld_mean,
        kld_err=kld_err,
        kld_median=median(ks),
        kld_max=float(ks[-1]),
        kld_min=float(ks[0]),
        kld_percentiles={k: percentile(ks, f) for k, f in KLD_PERCENTILES.items()},
        top1_agreement=same,
        top1_err=math.sqrt(same * (1 - same) / (count - 1)) if count > 1 else 0.0,
        dp_mean=dp_mean,
        dp_err=dp_err,
        dp_median=median(ds),
        dp_max=float(ds[-1]),
        dp_min=float(ds[0]),
        dp_percentiles={k: percentile(ds, f) for k, f in DP_PERCENTILES.items()},
        dp_rms=rms,
        dp_rms_err=0.5 / rms * mse_err if rms > 0 else 0.0,
    )


__all__ = [
    "DP_PERCENTILES",
    "KLD_FLOOR",
    "KLD_PERCENTILES",
    "Comparison",
    "KeptLogProbs",
    "Normalised",
    "compare_tokens",
    "covariance",
    "kept_log_probs",
    "kl_rows",
    "mean_and_error",
    "median",
    "normalise",
    "percentile",
    "perplexity",
    "target_nll",
]
