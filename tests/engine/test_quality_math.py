"""The quality figures on small hand-made logits, against values worked out by hand: the log
normaliser, NLL and perplexity with its ±, KL divergence (and llama.cpp's floor), top-1
agreement, Δp and llama.cpp's percentiles; the chunk plan; the reference store; the result
file and `bench compare` of two results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from engine.bench import quality_math as qm
from engine.bench import quality_store as store
from engine.bench.quality_pass import plan
from engine.bench.quality_report import compare_quality, format_quality_table
from engine.bench.quality_result import CandidateRow, QualityResult, ReferenceRow, TextInfo
from engine.bench.result import BenchError
from engine.errors import EngineError

LN = math.log
# Probabilities 0.1, 0.2, 0.3, 0.4: logits ln 1 .. ln 4 (their sum is 10).
ROW = np.log(np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)).astype(np.float32)


def test_normaliser_top_token_and_nll() -> None:
    norm = qm.normalise(ROW)
    assert norm.top.tolist() == [3]
    assert norm.c[0] == pytest.approx(LN(10), abs=1e-6)
    nll = qm.target_nll(ROW, norm, np.array([1], np.int32))
    assert nll[0] == pytest.approx(LN(5), abs=1e-6)  # -ln 0.2


def test_the_first_of_equal_maxima_is_the_top_token() -> None:
    logits = np.array([[1.0, 3.0, 3.0, 0.0]], np.float32)
    assert qm.normalise(logits).top.tolist() == [1]


def test_kl_divergence_of_a_hand_worked_pair() -> None:
    # KL(p || uniform) for p = (0.1, 0.2, 0.3, 0.4): sum p ln(4p) = 0.1064401...
    ref_norm = qm.normalise(ROW)
    kept = qm.kept_log_probs(ROW, ref_norm)
    assert kept.rows.tolist() == [0, 0, 0, 0]
    assert np.exp(kept.logp).tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4], abs=1e-6)
    cand = np.zeros((1, 4), np.float32)
    kld = qm.kl_rows(cand, qm.normalise(cand), kept)
    assert kld[0] == pytest.approx(0.10644013528622318, abs=1e-6)


def test_tokens_under_the_floor_are_left_out_as_llama_cpp_leaves_them() -> None:
    ref = np.array([[0.0, -30.0], [0.0, 0.0]], np.float32)
    kept = qm.kept_log_probs(ref, qm.normalise(ref))
    assert list(zip(kept.rows.tolist(), kept.cols.tolist(), strict=True)) == [
        (0, 0),
        (1, 0),
        (1, 1),
    ]
    cand = np.zeros((2, 2), np.float32)
    kld = qm.kl_rows(cand, qm.normalise(cand), kept)
    # Row 0: p(first) = 1 - 9e-14 against 0.5: ln 2; row 1: identical distributions.
    assert kld.tolist() == pytest.approx([LN(2), 0.0], abs=1e-6)


def test_the_kept_tokens_are_exactly_those_above_the_floor() -> None:
    # Logits on both sides of c - 16, some within float32's rounding of it: the kept set is
    # `logit - c > KLD_FLOOR` computed in float32, whatever shortcut finds it.
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((5, 4000)) * 6).astype(np.float32)
    norm = qm.normalise(logits)
    for r in range(5):  # a few values a few ulps from the floor itself
        edge = norm.c[r] + np.float32(qm.KLD_FLOOR)
        logits[r, :8] = np.nextafter(edge, np.float32(np.inf) if r % 2 else -np.inf)
        logits[r, 8:16] = edge
    norm = qm.normalise(logits)
    diff = logits - norm.c[:, None]
    rows, cols = np.nonzero(diff > qm.KLD_FLOOR)
    kept = qm.kept_log_probs(logits, norm)
    assert kept.rows.tolist() == rows.tolist() and kept.cols.tolist() == cols.tolist()
    assert kept.logp.dtype == np.float32 and np.array_equal(kept.logp, diff[rows, cols])
    assert 0 < kept.logp.size < logits.size  # both sides of the floor were there
    # float32's c + KLD_FLOOR can round above a logit whose own difference is over it.
    c = np.float32(-18.417063)
    edge = c + np.float32(qm.KLD_FLOOR)
    assert edge - c > qm.KLD_FLOOR  # the case: kept, though not above the rounded edge
    row = np.array([[edge, c + 10, edge - 1]], np.float32)
    kept = qm.kept_log_probs(row, qm.Normalised(np.array([1], np.int32), np.array([c])))
    assert kept.cols.tolist() == [0, 1]


def test_identical_logits_give_exactly_zero_and_the_same_top_token() -> None:
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((6, 500)) * 4).astype(np.float32)
    norm = qm.normalise(logits)
    kept = qm.kept_log_probs(logits, norm)
    again = qm.normalise(logits.copy())
    assert np.all(qm.kl_rows(logits.copy(), again, kept) == 0.0)
    assert np.array_equal(again.top, norm.top)


def test_perplexity_and_its_error() -> None:
    nll = np.array([LN(2), LN(4)])
    ppl, err = qm.perplexity(nll, min_count=1)
    assert ppl == pytest.approx(2**1.5)  # exp(mean(ln 2, ln 4))
    # The error of the mean NLL is ln 2 / 2 (two values ln 2 apart), carried through exp.
    assert err == pytest.approx(2**1.5 * LN(2) / 2)
    # llama.cpp's KLD report gives no error for 10 values or fewer.
    assert qm.perplexity(nll)[1] == 0.0


def test_comparison_of_four_tokens_by_hand() -> None:
    c = qm.compare_tokens(
        nll=np.array([LN(2), LN(2), LN(4), LN(4)]),
        nll_base=np.array([LN(2)] * 4),
        kld=np.array([0.1, 0.2, 0.3, 0.4]),
        same_top=np.array([True, True, True, False]),
    )
    assert c.count == 4
    assert c.ppl == pytest.approx(2**1.5)
    assert c.ppl_base == pytest.approx(2.0)
    assert c.ppl_ratio == pytest.approx(2**0.5)
    assert c.ln_ppl_ratio == pytest.approx(LN(2) / 2)
    assert c.ppl_diff == pytest.approx(2**1.5 - 2)
    assert c.kld_mean == pytest.approx(0.25)
    assert c.kld_err == 0.0  # llama.cpp: no error under 11 values
    assert c.kld_median == pytest.approx(0.25)
    # llama.cpp's percentile: rank 0.99 * 3 = 2.97, between 0.3 and 0.4.
    assert c.kld_percentiles["p99"] == pytest.approx(0.03 * 0.3 + 0.97 * 0.4)
    assert c.kld_max == pytest.approx(0.4) and c.kld_min == pytest.approx(0.1)
    assert c.top1_agreement == 0.75
    assert c.top1_err == pytest.approx(math.sqrt(0.75 * 0.25 / 3))
    # Δp = p - p_base = (0, 0, -0.25, -0.25)
    assert c.dp_mean == pytest.approx(-0.125)
    assert c.dp_rms == pytest.approx(math.sqrt(0.125 / 4))
    assert c.dp_median == pytest.approx(-0.125)
    assert c.dp_percentiles["p75"] == pytest.approx(0.0)
    assert c.dp_percentiles["p25"] == pytest.approx(-0.25)
    assert c.dp_min == pytest.approx(-0.25) and c.dp_max == pytest.approx(0.0)


def test_errors_of_many_tokens_follow_llama_cpp() -> None:
    rng = np.random.default_rng(3)
    nll = rng.uniform(1, 3, 200)
    base = nll - rng.uniform(0, 0.2, 200)
    kld = rng.uniform(0, 0.1, 200)
    c = qm.compare_tokens(nll, base, kld, np.ones(200, np.bool_))
    n = 200
    assert c.kld_err == pytest.approx(np.std(kld) / math.sqrt(n - 1))
    assert c.ppl_err == pytest.approx(c.ppl * np.std(nll) / math.sqrt(n - 1))
    cov = (np.mean(nll * base) - np.mean(nll) * np.mean(base)) / (n - 1)
    assert c.ppl_correlation == pytest.approx(
        cov / ((np.std(nll) / math.sqrt(n - 1)) * (np.std(base) / math.sqrt(n - 1)))
    )
    assert c.top1_agreement == 1.0 and c.top1_err == 0.0


def test_percentiles_are_linear_between_ranks() -> None:
    values = np.sort(np.random.default_rng(1).uniform(size=37))
    for f in (0.001, 0.1, 0.5, 0.9, 0.99):
        assert qm.percentile(values, f) == pytest.approx(float(np.percentile(values, 100 * f)))
    assert qm.median(values) == pytest.approx(float(np.median(values)))


# -- chunks ---------------------------------------------------------------------------------


def test_chunks_as_llama_perplexity_cuts_them() -> None:
    p = plan(5000, ctx=512, n_batch=2048)
    assert (p.chunks, p.n_seq, p.n_batch, p.first, p.scored_per_chunk) == (9, 4, 2048, 256, 255)
    assert p.scored == 9 * 255
    # A context that does not divide the batch: as many whole chunks as fit, the batch capped.
    p = plan(5000, ctx=384, n_batch=2048)
    assert (p.n_seq, p.n_batch) == (5, 1920)
    # A chunk longer than the batch: one chunk at a time, over several decodes.
    p = plan(9000, ctx=4096, n_batch=2048)
    assert (p.chunks, p.n_seq, p.n_batch) == (2, 1, 2048)
    assert plan(5000, ctx=512, max_chunks=3).chunks == 3


def test_a_text_shorter_than_two_chunks_is_refused() -> None:
    with pytest.raises(EngineError, match="needs at least 1024"):
        plan(1000, ctx=512)


# -- the reference's kept scores -------------------------------------------------------------


def _scores() -> store.ReferenceScores:
    return store.ReferenceScores(
        tokens=np.arange(8, dtype=np.int32),
        top=np.array([1, 2], np.int32),
        nll=np.array([0.5, 1.5]),
        indptr=np.array([0, 2, 3], np.int64),
        cols=np.array([1, 3, 2], np.int32),
        logp=np.array([-0.1, -2.0, -0.3], np.float32),
        n_vocab=4,
        pass_s=1.25,
    )


def test_reference_scores_round_trip_under_their_key(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    key = store.ReferenceKey.of(model, "ab" * 32, 512, 2048, 2)
    path = store.cache_path(tmp_path / "cache", key)
    store.save(path, _scores(), key)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
    back = store.load(path, key)
    assert back is not None
    assert back.cols.tolist() == [1, 3, 2] and back.pass_s == 1.25 and back.n_vocab == 4
    rows, span = back.block(1, 2)
    assert rows.tolist() == [0] and back.cols[span].tolist() == [2]
    other = store.ReferenceKey.of(model, "cd" * 32, 512, 2048, 2)
    assert store.load(path, other) is None  # another text: not these scores
    assert store.cache_path(tmp_path, other) != path
    path.write_bytes(b"not an archive")
    assert store.load(path, key) is None  # unreadable: scored again


# -- the result file --------------------------------------------------------------------------


def _row(name: str, kld: float) -> CandidateRow:
    return CandidateRow(
        path=f"/m/{name}",
        name=name,
        size_bytes=1000,
        quantization="Q4_0",
        ppl=10.0,
        ppl_err=0.1,
        ppl_ratio=1.01,
        ppl_ratio_err=0.001,
        ln_ppl_ratio=0.00995,
        ln_ppl_ratio_err=0.001,
        ppl_diff=0.1,
        ppl_diff_err=0.01,
        ppl_correlation=0.99,
        kld_mean=kld,
        kld_err=0.001,
        kld_median=kld / 2,
        kld_p99=kld * 10,
        kld_max=kld * 20,
        kld_percentiles={"p99": kld * 10},
        top1_agreement=0.9,
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


def _result(kld: float) -> QualityResult:
    return QualityResult(
        created="2026-01-01T00:00:00+00:00",
        reference=ReferenceRow(
            path="/m/ref.gguf",
            name="ref.gguf",
            size_bytes=2000,
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
        candidates=[_row("a-Q4_0.gguf", kld)],
    )


def test_a_result_saves_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "q.json"
    r = _result(0.05)
    r.save(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["schema"] == "candlewick-quality/1"
    assert {"path", "size_bytes", "ppl", "kld_mean", "kld_median", "kld_p99"} <= set(
        data["candidates"][0]
    )
    assert QualityResult.load(path) == r
    assert "a-Q4_0.gguf" in format_quality_table(r)


def test_a_speed_result_is_not_a_quality_result() -> None:
    with pytest.raises(BenchError, match="not a Candlewick quality result"):
        QualityResult.from_dict({"schema": "candlewick-bench/1", "levels": []})
    broken = _result(0.05).to_dict()
    del broken["reference"]["ppl"]
    with pytest.raises(BenchError, match=r"reference\.ppl"):
        QualityResult.from_dict(broken)


def test_compare_two_quality_results() -> None:
    rows = compare_quality(_result(0.05), _result(0.1))
    kld = next(r for r in rows if r["file"] == "a-Q4_0.gguf" and r["metric"] == "kld_mean")
    assert kld["ratio"] == pytest.approx(2.0) and kld["lower_is_better"]
    top = next(r for r in rows if r["metric"] == "top1_agreement")
    assert not top["lower_is_better"]
    other_text = _result(0.1).model_copy(update={"ctx": 256})
    with pytest.raises(BenchError, match="other texts or contexts"):
        compare_quality(_result(0.05), other_text)
