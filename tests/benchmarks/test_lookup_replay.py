"""benchmarks/lookup_replay.py without a model: what an answer replayed through prompt lookup
predicts, and its two bounds, on made-up token sequences."""

from __future__ import annotations

import pytest

from benchmarks import lookup_replay as lr
from engine.host.speculative import VerifyCost
from engine.settings import DEFAULT_DRAFT_MAX

CURVE = VerifyCost(1.5, 0.1)
PROMPT = list(range(100, 140))


def test_an_answer_with_nothing_to_copy_is_plain_decoding() -> None:
    answer = list(range(500, 530))
    for mode in ("lookup", "lengths known", "any place"):
        assert lr.replay(PROMPT, answer, CURVE, mode) == (1.0, 0, 0)


def test_a_quote_is_drafted_and_the_bounds_hold() -> None:
    """An answer that quotes 30 prompt tokens after one of its own: the first token is decoded
    plainly (nothing before it to look up), then lookup drafts the quote. Any earlier place
    drafts the quote at once: 31 tokens in one plain step, steps of DEFAULT_DRAFT_MAX drafts
    (and the model's own token each) and one that drafts the rest (its own token past the
    end)."""
    answer = [7, *PROMPT[5:35]]
    lookup, drafted, accepted = lr.replay(PROMPT, answer, CURVE, "lookup")
    known, known_drafted, known_accepted = lr.replay(PROMPT, answer, CURVE, "lengths known")
    best, _, _ = lr.replay(PROMPT, answer, CURVE, "any place")
    assert 1 < lookup <= known <= best
    assert 0 < accepted <= drafted
    assert known_accepted == known_drafted  # every draft cut to its accepted part
    full, rest = divmod(30, DEFAULT_DRAFT_MAX + 1)
    steps = 1 + full * CURVE(DEFAULT_DRAFT_MAX + 1) + (CURVE(rest + 1) if rest else 0)
    assert best == pytest.approx(31 / steps)


def test_drafts_that_do_not_pay_are_not_counted_as_known() -> None:
    """Where one right draft costs more than the two tokens it gives, the bound drafts nothing."""
    dear = VerifyCost(2.5, 0.1)
    assert lr.pays(1, dear) == 0
    assert lr.pays(5, dear) == 5
    assert lr.accepted([1, 2, 3], [1, 2, 4, 5]) == 2
