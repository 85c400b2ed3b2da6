"""The scoring pass on a recording backend (no model): the batches it decodes are llama-
perplexity's (chunks side by side or a chunk over several decodes, BOS in each chunk's first
place, logits asked for from the middle, a cleared cache per chunk group), and its figures
equal a direct float64 computation over the same logits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from engine.bench import quality_pass
from engine.bench.quality_pass import TextScorer, plan
from engine.host.runtime import SpecialTokens

VOCAB = 13
BOS = 1


def reference_logits(tok: int, pos: int) -> npt.NDArray[np.float32]:
    rng = np.random.default_rng(tok * 1000 + pos)
    return (rng.standard_normal(VOCAB) * 3).astype(np.float32)


def candidate_logits(tok: int, pos: int) -> npt.NDArray[np.float32]:
    noise = np.random.default_rng(7 + tok * 1000 + pos).standard_normal(VOCAB)
    return (reference_logits(tok, pos) + 0.5 * noise).astype(np.float32)


@dataclass
class Row:
    token: int
    pos: int
    seq: int
    logits: bool


@dataclass
class RecordingBatch:
    capacity: int
    n_tokens: int = 0
    rows: list[Row] = field(default_factory=list)

    def put(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        assert i == len(self.rows) < self.capacity
        self.rows.append(Row(token, pos, seq, logits))

    def close(self) -> None:
        pass


class RecordingBackend:
    """What `open_scoring` gives, on a function of (token, position) for logits."""

    def __init__(self, logits_of: Callable[[int, int], npt.NDArray[np.float32]]) -> None:
        self.logits_of = logits_of
        self.events: list[Any] = []
        self._out = np.empty((0, VOCAB), np.float32)

    def clear(self) -> None:
        self.events.append("clear")

    def batch(self, capacity: int) -> RecordingBatch:
        return RecordingBatch(capacity)

    def decode(self, batch: RecordingBatch) -> None:
        rows = batch.rows[: batch.n_tokens]
        self.events.append(rows)
        kept = [self.logits_of(r.token, r.pos) for r in rows if r.logits]
        self._out = np.array(kept, np.float32).reshape(len(kept), VOCAB)

    def output_logits(self, n: int) -> npt.NDArray[np.float32]:
        assert n == self._out.shape[0]
        return self._out

    def close(self) -> None:
        self.events.append("close")


class FakeModel:
    path = Path("fake.gguf")
    n_vocab = VOCAB
    model_ptr = vocab_ptr = None
    load_info = SimpleNamespace(n_threads=2)

    def __init__(self) -> None:
        self.loop = SimpleNamespace(call_soon=lambda fn: fn())

    def special_tokens(self) -> SpecialTokens:
        return SpecialTokens(BOS, 2, -1, add_bos=True, add_eos=False, add_sep=False)


def scorer(
    monkeypatch: pytest.MonkeyPatch, backend: RecordingBackend, n_tokens: int, ctx: int, batch: int
) -> TextScorer:
    monkeypatch.setattr(quality_pass.LlamaBackend, "open_scoring", lambda *a, **k: backend)
    return TextScorer(FakeModel(), plan(n_tokens, ctx, batch))  # type: ignore[arg-type]


TOKENS = [int(t) for t in np.random.default_rng(5).integers(3, VOCAB, 100)]


def test_chunks_side_by_side_in_one_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = RecordingBackend(reference_logits)
    s = scorer(monkeypatch, backend, len(TOKENS), ctx=16, batch=64)  # 6 chunks, 4 a decode
    s.reference_pass(TOKENS)
    s.close()
    decodes = [e for e in backend.events if isinstance(e, list)]
    assert backend.events[0] == "clear" and backend.events[-1] == "close"
    assert [len(d) for d in decodes] == [64, 32]
    assert backend.events.count("clear") == 2
    for group, first_chunk in zip(decodes, (0, 4), strict=True):
        for i, r in enumerate(group):
            seq, pos = divmod(i, 16)
            assert (r.seq, r.pos) == (seq, pos)
            want = BOS if pos == 0 else TOKENS[(first_chunk + seq) * 16 + pos]
            assert r.token == want
            assert r.logits == (pos >= 8)


def test_a_chunk_longer_than_the_batch_goes_over_several_decodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = RecordingBackend(reference_logits)
    s = scorer(monkeypatch, backend, len(TOKENS), ctx=32, batch=8)  # 3 chunks, 4 decodes each
    ref = s.reference_pass(TOKENS)
    decodes = [e for e in backend.events if isinstance(e, list)]
    assert len(decodes) == 12 and backend.events.count("clear") == 3
    assert [r.pos for r in decodes[1]] == list(range(8, 16))
    assert all(r.seq == 0 for d in decodes for r in d)
    assert ref.rows == 3 * 15


def _direct(
    logits_of: Callable[[int, int], npt.NDArray[np.float32]], ctx: int, chunks: int
) -> list[tuple[npt.NDArray[np.float64], int]]:
    """Per scored position: float64 log-probabilities and the target."""
    out = []
    for c in range(chunks):
        for j in range(ctx // 2, ctx - 1):
            tok = BOS if j == 0 else TOKENS[c * ctx + j]
            lp = logits_of(tok, j).astype(np.float64)
            lp = lp - np.log(np.exp(lp - lp.max()).sum()) - lp.max()
            out.append((lp, TOKENS[c * ctx + j + 1]))
    return out


@pytest.mark.parametrize(("ctx", "batch"), [(16, 64), (32, 8)])
def test_the_figures_equal_a_direct_computation(
    monkeypatch: pytest.MonkeyPatch, ctx: int, batch: int
) -> None:
    ref = scorer(monkeypatch, RecordingBackend(reference_logits), len(TOKENS), ctx, batch)
    scores = ref.reference_pass(TOKENS)
    cand = scorer(monkeypatch, RecordingBackend(candidate_logits), len(TOKENS), ctx, batch)
    got = cand.candidate_pass(TOKENS, scores)
    chunks = len(TOKENS) // ctx
    base = _direct(reference_logits, ctx, chunks)
    mine = _direct(candidate_logits, ctx, chunks)
    assert len(base) == scores.rows == got.nll.size
    for k, ((lp_ref, target), (lp_cand, _)) in enumerate(zip(base, mine, strict=True)):
        assert scores.nll[k] == pytest.approx(-lp_ref[target], abs=1e-5)
        assert scores.top[k] == int(np.argmax(lp_ref))
        assert got.nll[k] == pytest.approx(-lp_cand[target], abs=1e-5)
        keep = lp_ref > -16
        kl = float(np.sum(np.exp(lp_ref[keep]) * (lp_ref[keep] - lp_cand[keep])))
        assert got.kld[k] == pytest.approx(kl, abs=1e-5)
        assert got.same_top[k] == (np.argmax(lp_ref) == np.argmax(lp_cand))
    assert 0 < got.same_top.mean() < 1  # the candidate's noise changes some top tokens
