"""Hand-made quality results for the quant choice's tests (engine and window): a reference
and candidates with the sizes and KL divergences a test asks for; every other figure plain."""

from __future__ import annotations

from engine.bench.quality_result import CandidateRow, QualityResult, ReferenceRow, TextInfo


def candidate(name: str, size: int, kld: float, quant: str = "Q4_0") -> CandidateRow:
    return CandidateRow(
        path=f"/m/{name}",
        name=name,
        size_bytes=size,
        quantization=quant,
        ppl=10.0 + 10 * kld,
        ppl_err=0.1,
        ppl_ratio=1.0 + kld,
        ppl_ratio_err=0.001,
        ln_ppl_ratio=kld,
        ln_ppl_ratio_err=0.001,
        ppl_diff=10 * kld,
        ppl_diff_err=0.01,
        ppl_correlation=0.99,
        kld_mean=kld,
        kld_err=kld / 50,
        kld_median=kld / 2,
        kld_p99=kld * 10,
        kld_max=kld * 20,
        kld_percentiles={"p99": kld * 10},
        top1_agreement=1.0 - kld,
        top1_err=0.01,
        dp_mean=-0.01,
        dp_err=0.001,
        dp_median=0.0,
        dp_rms=0.05,
        dp_rms_err=0.001,
        dp_max=0.3,
        dp_min=-0.4,
        dp_percentiles={"p99": 0.1},
        tokens_per_s=300.0,
        pass_s=4.0,
    )


def quality_result(*rows: tuple[str, int, float, str]) -> QualityResult:
    """A reference `ref-Q8_0.gguf` of 145 MB and the candidates (name, size, KLD, type)."""
    return QualityResult(
        created="2026-01-01T00:00:00+00:00",
        reference=ReferenceRow(
            path="/m/ref-Q8_0.gguf",
            name="ref-Q8_0.gguf",
            size_bytes=145_000_000,
            quantization="Q8_0",
            ppl=9.9,
            ppl_err=0.1,
            tokens_per_s=310.0,
            pass_s=4.0,
            cached=False,
        ),
        text=TextInfo(source="built-in corpus", sha256="ab" * 32, tokens=5000),
        ctx=512,
        n_batch=2048,
        chunks=9,
        scored_tokens=2295,
        candidates=[candidate(n, s, k, q) for n, s, k, q in rows],
    )


# A typical set: the smaller the file, the larger the loss.
ROWS = (
    ("m-Q4_1.gguf", 98_000_000, 0.012, "Q4_1"),
    ("m-Q4_0.gguf", 90_000_000, 0.030, "Q4_0"),
    ("m-Q2_K.gguf", 70_000_000, 0.400, "Q2_K"),
)
