"""What drafting costs and buys, measured by the loop (engine.host.draft_gain): the cost curve
prompt lookup sizes its drafts with, and the gain that decides whether drafts are made, on
made-up timings and through the real loop on the fake backend."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from engine.host import speculative
from engine.host.draft_gain import (
    EXPLORE_EVERY,
    MIN_STEPS,
    WINDOW,
    DraftGain,
    MeasuredCost,
)
from engine.host.requests import Finished
from engine.host.speculative import (
    COST_AMX_SMALL_BATCH,
    COST_CPU,
    PromptLookup,
    VerifyCost,
    spec_stats,
)
from engine.host.stats import GenerationStats
from engine.native.backend import TokenBatch
from engine.settings import LoadParams, SamplingParams, SpecMode
from tests.engine.test_greedy_pick import CODE_EDIT
from tests.fake_backend import FakeLoopModel, FakeVocab, NextToken, hash_next


def measured(times: dict[int, float], prior: VerifyCost = COST_CPU) -> MeasuredCost:
    curve = MeasuredCost(prior)
    for _ in range(MIN_STEPS):
        for n, t in times.items():
            curve.observe(n, t)
    return curve


def test_the_prior_stands_in_until_a_size_is_measured() -> None:
    curve = MeasuredCost(COST_CPU)
    for _ in range(MIN_STEPS - 1):
        curve.observe(1, 0.010)
        curve.observe(3, 0.025)
    assert curve(3) == COST_CPU(3)  # seen too few times
    curve.observe(1, 0.010)
    curve.observe(3, 0.025)
    assert curve(3) == pytest.approx(2.5)
    # A size never seen: the prior, shifted by what the one that was showed against it.
    at3 = 2.5 - COST_CPU(3)
    assert curve(4) == pytest.approx(COST_CPU(4) + at3)
    assert curve(2) == pytest.approx(COST_CPU(2) + at3)
    assert curve(1) == 1.0
    for _ in range(MIN_STEPS):
        curve.observe(5, 0.040)
    # Two sizes seen (2.5 at 3, 4.0 at 5): between them by the smaller shift (the cheaper
    # reading gets tried), past them by the last one's.
    at5 = 4.0 - COST_CPU(5)
    assert at3 < at5
    assert curve(4) == pytest.approx(COST_CPU(4) + at3)
    assert curve(9) == pytest.approx(4.0 + COST_CPU(9) - COST_CPU(5))


def test_a_bent_prior_keeps_its_bend_between_measured_sizes() -> None:
    """The column kernels' curve: four tokens cheap, five dear. Measured at 2, 5 and 6 tokens
    (what five-token drafts measure), four is read off the prior's bend, not off a line through
    those sizes, which read it as 1.7 decodes where it cost 1.5 (2-core EPYC) and made lookup
    draft five tokens where three paid more, so that four was never measured again."""
    prior = speculative.COST_COLUMNS
    curve = measured({1: 0.010, 2: 0.0124, 5: 0.0200, 6: 0.0209}, prior)
    assert curve(5) == pytest.approx(2.0) and curve(6) == pytest.approx(2.09)
    assert curve(4) == pytest.approx(prior(4) + 1.24 - prior(2))  # the smaller shift
    assert curve(3) < curve(4) < 1.6
    strong, usual = 20, 5  # agreeing tokens behind a match
    assert PromptLookup.draft_len(usual, curve, 7) == 3
    assert PromptLookup.draft_len(strong, curve, 7) == 7


def test_past_the_measured_sizes_a_token_costs_at_least_the_priors() -> None:
    """A few close sizes whose ratios are flat (noise) must not make a 17-token draft look
    as cheap as a 5-token one: past the largest measured size each token costs at least what
    the prior's does, and a weak match then drafts a few tokens, not sixteen."""
    prior = COST_AMX_SMALL_BATCH
    flat = measured({1: 0.010, 2: 0.0130, 3: 0.0170, 4: 0.0175, 5: 0.0172}, prior)
    assert flat(5) == pytest.approx(1.72)
    assert flat(17) == pytest.approx(1.72 + prior(17) - prior(5))
    assert flat(4) == pytest.approx(1.75)  # measured sizes stand
    weak = PromptLookup.draft_len(2, flat)
    assert 0 < weak <= 5
    # Dearer than the prior where measured: past that, as dear again.
    steep = measured({1: 0.010, 2: 0.015, 3: 0.020})
    assert steep(9) == pytest.approx(2.0 + COST_CPU(9) - COST_CPU(3))


def test_lookup_drafts_what_this_machine_pays_for() -> None:
    """The EPYC's curve (about 1.86 + 0.55 a token) makes a draft after a 2-token match a
    loss: lookup drafts nothing there, and still drafts long after a strong match."""
    epyc = measured({1: 0.010, **{n: 0.010 * (1.86 + 0.55 * (n - 2)) for n in range(2, 18)}})
    assert PromptLookup.draft_len(2, COST_CPU) > 0  # what the Xeon's curve made it do
    assert PromptLookup.draft_len(2, epyc) == 0
    assert PromptLookup.draft_len(20, epyc, 16) >= 8
    cheap = measured({1: 0.010, **{n: 0.010 * (1.2 + 0.1 * (n - 2)) for n in range(2, 18)}})
    assert PromptLookup.draft_len(2, cheap) > 0


def test_a_preempted_decode_or_a_busy_spell_leaves_the_curve() -> None:
    """Another program preempting one decode (1 s among 10 ms ones) moves no figure of the
    curve; a spell that slows every size alike leaves its ratios as they were."""
    curve = measured({1: 0.010, 4: 0.021})
    assert curve(4) == pytest.approx(2.1)
    curve.observe(4, 1.0)
    curve.observe(1, 1.0)
    curve.observe(4, 0.021)
    assert curve(4) == pytest.approx(2.1)
    for _ in range(2 * WINDOW):  # three times slower, every size
        curve.observe(1, 0.030)
        curve.observe(4, 0.063)
    assert curve(4) == pytest.approx(2.1)
    assert PromptLookup.draft_len(20, curve) > 0


def gain_after(plain: list[float], drafted: list[float], tokens: int = 3) -> DraftGain:
    """A level-1 gain fed plain steps of one token and drafted steps of `tokens` tokens."""
    g = DraftGain(COST_CPU)
    for t in plain:
        g.observe(1, 1, t, None)
    for t in drafted:
        g.observe(1, tokens, t, 0)
    return g


def test_a_kind_of_draft_is_tried_then_kept_only_while_it_wins() -> None:
    fresh = DraftGain(COST_CPU)
    assert all(fresh.allow(1, 0) for _ in range(10))  # nothing measured: try it
    assert fresh.gain(1) is None

    losing = gain_after([0.010] * MIN_STEPS, [0.040] * MIN_STEPS)  # 13 ms a token vs 10
    chances = [losing.allow(1, 0) for _ in range(4 * EXPLORE_EVERY)]
    assert chances.count(True) == 4  # only to explore: every EXPLORE_EVERY-th chance
    assert (losing.gain(1) or 1) < 1

    winning = gain_after([0.010] * MIN_STEPS, [0.020] * MIN_STEPS)  # 6.7 ms a token
    chances = [winning.allow(1, 0) for _ in range(4 * EXPLORE_EVERY)]
    assert chances.count(False) == 4  # plain steps still measured now and then
    assert (winning.gain(1) or 0) > 1
    assert winning.gains() == {1: round(winning.gain(1) or 0, 3)}
    # Levels and kinds are measured apart: a strong match is still tried where weak ones lose.
    assert losing.allow(1, 3) and losing.allow(4, 0)


def test_a_preempted_step_does_not_turn_the_gate() -> None:
    """One drafted step that took 100 times its usual time counts as OUTLIER times it: the
    winning kind goes on being drafted."""
    g = gain_after([0.010] * 8, [0.020] * 8)  # 6.7 ms a token against 10
    g.observe(1, 3, 2.0, 0)
    assert (g.gain(1) or 0) > 1
    assert [g.allow(1, 0) for _ in range(EXPLORE_EVERY - 1)].count(True) >= EXPLORE_EVERY - 2


def test_every_step_drafted_so_far_measures_plain_ones_too() -> None:
    g = DraftGain(COST_CPU)
    for _ in range(MIN_STEPS):
        g.observe(1, 3, 0.02, 0)
    assert [g.allow(1, 0) for _ in range(4)] == [False, True, False, True]


# -- through the real loop on the fake backend, timed by a fake clock ---------------------

VOCAB = FakeVocab()
PERIOD = 25
PROMPT = list(range(1, PERIOD + 1)) * 2


def repeating(history: Sequence[int]) -> int:
    """A model that goes on repeating the prompt's period: every lookup draft is right."""
    return history[-PERIOD]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_decode_time(
    monkeypatch: pytest.MonkeyPatch, m: FakeLoopModel, per_row: float | list[float]
) -> None:
    """The loop's clock is a fake one that a decode of n rows moves by 1 + per_row * (n - 1)
    seconds (a one-item list: what it holds at the time)."""
    clock = FakeClock()
    be = m.backend
    assert be is not None
    decode = be.decode
    rows = per_row if isinstance(per_row, list) else [per_row]

    def timed(b: TokenBatch, *, fixed_threads: bool = False) -> None:
        clock.now += 1.0 + rows[0] * (b.n_tokens - 1)
        decode(b, fixed_threads=fixed_threads)

    monkeypatch.setattr(be, "decode", timed)
    assert m.loop._builder is not None
    m.loop._builder.clock = clock


def run(
    monkeypatch: pytest.MonkeyPatch, next_token: NextToken, per_row: float, tokens: int
) -> GenerationStats:
    """One greedy lookup request alone; a decode of n rows takes 1 + per_row * (n - 1)
    seconds of the fake clock."""
    m = FakeLoopModel(n_slots=1, n_ctx_seq=1024, vocab=VOCAB, next_token=next_token)
    try:
        sched = m.loop
        fake_decode_time(monkeypatch, m, per_row)
        done = threading.Event()
        req = sched.submit(
            PROMPT,
            SamplingParams(temperature=0, max_tokens=tokens),
            lambda ev: done.set() if isinstance(ev, Finished) else None,
            spec="lookup",
        )
        assert done.wait(60)
        return req.stats
    finally:
        m.close()


def test_drafting_goes_on_where_it_measures_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    st = run(monkeypatch, repeating, per_row=0.1, tokens=200)
    assert st.draft_accepted >= 150  # most tokens came out of drafts
    assert st.draft_gain is not None and st.draft_gain > 2


def test_drafting_stops_where_it_measures_slower(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drafts of a model that never copies (2-token coincidences in its own text), verified
    where each row costs 0.6 of a decode: drafting is tried, then only explored; with the
    gate held open the same reply drafts several times as much (the request's own check,
    which would stop it as well, left out)."""
    monkeypatch.setattr(speculative, "REQUEST_MIN_VERIFIED", 10**9)
    model = hash_next(len(VOCAB))
    gated = run(monkeypatch, model, per_row=0.6, tokens=400)
    with monkeypatch.context() as mp:
        mp.setattr(DraftGain, "allow", lambda _self, _busy, _kind: True)
        open_gate = run(mp, model, per_row=0.6, tokens=400)
    assert open_gate.draft_tokens > 0
    assert gated.draft_tokens * 3 <= open_gate.draft_tokens
    assert gated.draft_gain is not None and gated.draft_gain > 0.9


def test_a_request_that_does_not_quote_stops_drafting_on_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop's gain held open (as after requests where lookup won): a reply that never
    copies (its drafts are 2-token coincidences) still stops drafting once its own verified
    drafts have given nothing (engine.host.speculative.DraftYield); a reply that copies
    keeps every draft."""
    monkeypatch.setattr(DraftGain, "allow", lambda _self, _busy, _kind: True)
    model = hash_next(len(VOCAB))
    checked = run(monkeypatch, model, per_row=0.1, tokens=400)
    copying = run(monkeypatch, repeating, per_row=0.1, tokens=200)
    with monkeypatch.context() as mp:
        mp.setattr(speculative, "REQUEST_MIN_VERIFIED", 10**9)
        unchecked = run(mp, model, per_row=0.1, tokens=400)
        copying_unchecked = run(mp, repeating, per_row=0.1, tokens=200)
    assert checked.draft_tokens > 0
    assert checked.draft_tokens * 3 <= unchecked.draft_tokens
    assert copying.draft_accepted == copying_unchecked.draft_accepted >= 150


def test_drafting_comes_back_after_a_busy_spell(monkeypatch: pytest.MonkeyPatch) -> None:
    """While batches cost 3 decodes a row (another program on the cores), the measured curve
    makes every draft a loss and lookup stops drafting; once they are cheap again, the
    busy spell's figures expire (after MAX_AGE one-token decodes), the kernel table's curve
    stands in, the sizes are measured again, and drafting comes back."""
    m = FakeLoopModel(n_slots=1, n_ctx_seq=2048, vocab=VOCAB, next_token=repeating)
    try:
        sched = m.loop
        per_row = [3.0]
        fake_decode_time(monkeypatch, m, per_row)
        builder = sched._builder
        assert builder is not None

        def reply(tokens: int) -> GenerationStats:
            req = sched.submit(
                PROMPT,
                SamplingParams(temperature=0, max_tokens=tokens),
                lambda _ev: None,
                spec="lookup",
            )
            assert req.done.wait(60)
            return req.stats

        reply(300)
        busy = reply(200)
        assert busy.draft_tokens <= 200 // 4  # the kernel table's curve, now and then
        assert PromptLookup.draft_len(30, builder.gain.curve) == 0
        per_row[0] = 0.1
        for _ in range(3):  # the figures expire, then the gate's rates catch up
            reply(200)
        quiet = reply(200)
        assert quiet.draft_accepted >= 150  # most tokens came out of drafts again
        assert PromptLookup.draft_len(30, builder.gain.curve) > 0
    finally:
        m.close()


def test_the_loop_measures_on_smollm2(smollm2_path: Path) -> None:
    """A quoting reply at the app's settings: the loop times its lone steps by size and
    reports a measured gain in the request's stats (its value is the machine's)."""
    from engine.host.runtime import Model

    s = SamplingParams(temperature=0, max_tokens=64)
    with Model(smollm2_path, LoadParams(n_ctx=1024, n_threads=1, state_cache_mb=0)) as m:
        gen = m.generate([{"role": "user", "content": CODE_EDIT}], s, spec="lookup")
        gen.consume()
        builder = m.loop._builder
        assert builder is not None
        g = builder.gain
        assert g.curve.measured(1) == 1.0
        if gen.stats.draft_tokens:
            assert gen.stats.draft_gain is not None and gen.stats.draft_gain > 0
            assert set(g.gains()) == {1}


def run_together(
    monkeypatch: pytest.MonkeyPatch,
    per_row: float,
    n: int,
    spec: SpecMode,
    next_token: NextToken = repeating,
    tokens: int = 120,
) -> tuple[list[GenerationStats], list[str], DraftGain]:
    """`n` greedy requests in flight together (each from its own offset in the period),
    timed by the fake clock as in `run`."""
    m = FakeLoopModel(n_slots=n, n_ctx_seq=1024, vocab=VOCAB, next_token=next_token)
    try:
        sched = m.loop
        fake_decode_time(monkeypatch, m, per_row)
        builder = sched._builder
        assert builder is not None
        reqs = []
        for i in range(n):
            reqs.append(
                sched.submit(
                    PROMPT[i:] + PROMPT[:i],
                    SamplingParams(temperature=0, max_tokens=tokens),
                    lambda _ev: None,
                    spec=spec,
                )
            )
        for r in reqs:
            assert r.done.wait(60)
        return [r.stats for r in reqs], [r.text for r in reqs], builder.gain
    finally:
        m.close()


def test_several_slots_draft_in_one_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four requests at once where verification is cheap: every one of them drafts, their
    drafts verified in the steps they share, and each hands out plain decoding's text; the
    gain is measured at four generating slots."""
    stats, texts, gain = run_together(monkeypatch, 0.05, 4, "lookup")
    _, plain_texts, _ = run_together(monkeypatch, 0.05, 4, "off")
    assert texts == plain_texts
    assert all(st.draft_accepted > 0 for st in stats)
    assert 4 in gain.gains() and gain.gains()[4] > 1


def test_several_slots_stop_drafting_where_it_measures_slower(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four requests of a model that never copies, where every row costs 0.6 of a decode:
    at four slots drafting is tried, measured slower, and then only explored (the requests'
    own check left out)."""
    monkeypatch.setattr(speculative, "REQUEST_MIN_VERIFIED", 10**9)
    model = hash_next(len(VOCAB))
    stats, _, gain = run_together(monkeypatch, 0.6, 4, "lookup", model, 500)
    drafted = sum(st.draft_tokens for st in stats)
    with monkeypatch.context() as mp:
        mp.setattr(DraftGain, "allow", lambda _self, _busy, _kind: True)
        mp.setattr(MeasuredCost, "measured", lambda _self, _n: None)
        open_stats, _, _ = run_together(mp, 0.6, 4, "lookup", model, 500)
    assert drafted * 3 <= sum(st.draft_tokens for st in open_stats)
    assert (gain.gains().get(4) or 0) < 1.05


def test_the_snapshot_and_the_stats_carry_the_gain(monkeypatch: pytest.MonkeyPatch) -> None:
    m = FakeLoopModel(n_slots=1, n_ctx_seq=1024, vocab=VOCAB, next_token=repeating)
    try:
        sched = m.loop
        assert sched.snapshot().draft_gain == {}
        fake_decode_time(monkeypatch, m, 0.1)
        req = sched.submit(
            PROMPT, SamplingParams(temperature=0, max_tokens=100), lambda _ev: None, spec="lookup"
        )
        assert req.done.wait(60)
        gains = sched.snapshot().draft_gain
        assert set(gains) == {1} and gains[1] > 1
        assert spec_stats(req.stats)["draft_gain"] == round(req.stats.draft_gain or 0, 3)
    finally:
        m.close()
