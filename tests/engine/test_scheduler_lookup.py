"""Prompt lookup in the scheduler (`candlewick serve --lookup`), on the real SmolLM2: a lone
request drafts and gives plain decoding's tokens, concurrent ones decode plainly, and drafts
the model rejects or never reaches leave no KV cells behind."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from engine.host.requests import Event, Finished
from engine.host.runtime import Model
from engine.settings import LoadParams, SamplingParams, SpeculativeSettings
from tests.engine.drafting import always_draft  # noqa: F401 (a fixture)
from tests.engine.test_scheduler import assert_no_leak, submit, wait
from tests.exactness import assert_same_greedy, exact_load

# What drafts do, not whether this machine finds them worth it (tests/engine/drafting.py).
pytestmark = pytest.mark.usefixtures("always_draft")

QUOTE = (
    "The quick brown fox jumps over the lazy dog. The early bird catches the worm. "
    "Repeat both sentences exactly, then repeat them again."
)
# Drafts copy text the repeat penalty would discourage: these tests measure drafting alone.
GREEDY = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=40)


def params(lookup: bool) -> LoadParams:
    # Where the engine can guarantee that one token and a batch get the same logits, drafted
    # output must equal plain output (tests/exactness.py, docs/speculative.md).
    return exact_load(
        n_ctx=1024 * 2,
        n_seq_max=2,
        n_threads=2,
        state_cache_mb=0,
        speculative=SpeculativeSettings("lookup") if lookup else None,
    )


def same_as_plain(m: Model, got: str, want: str) -> None:
    assert_same_greedy(
        m.exactness,
        got,
        want,
        positions=len(m.chat_tokens([{"role": "user", "content": QUOTE}])) + GREEDY.max_tokens,
        batch=GREEDY.max_tokens,
    )


@pytest.fixture(scope="module")
def lookup_model(exact_smollm2_path: Path) -> Iterator[Model]:
    m = Model(exact_smollm2_path, params(lookup=True))
    yield m
    m.close()


@pytest.fixture(scope="module")
def plain_text(exact_smollm2_path: Path) -> str:
    with Model(exact_smollm2_path, params(lookup=False)) as m:
        sched = m.loop
        req, col = submit(sched, m, QUOTE, GREEDY)
        wait(req)
        assert col.finished is not None and req.stats.draft_tokens == 0
        return col.finished.text


def test_lone_request_drafts_and_matches_plain(lookup_model: Model, plain_text: str) -> None:
    sched = lookup_model.loop
    # The loop's counters since this request (the module's model served others before it
    # when the tests run in another order).
    before = sched.snapshot()
    req, col = submit(sched, lookup_model, QUOTE, GREEDY)
    wait(req)
    assert col.finished is not None
    same_as_plain(lookup_model, col.finished.text, plain_text)
    st = req.stats
    assert 0 < st.draft_accepted <= st.draft_tokens
    assert st.stop_reason == "stop" and st.gen_tokens > 8
    snap = sched.snapshot()
    drafted = snap.draft_tokens - before.draft_tokens
    accepted = snap.draft_accepted - before.draft_accepted
    assert (drafted, accepted) == (st.draft_tokens, st.draft_accepted)
    # Fewer decode steps than tokens: accepted drafts came several to a step.
    assert snap.steps - before.steps < st.gen_tokens
    assert_no_leak(sched)


@pytest.mark.parametrize("max_tokens", [3, 9, 17])
def test_stopping_inside_accepted_drafts_leaves_no_cells(
    lookup_model: Model, plain_text: str, max_tokens: int
) -> None:
    sched = lookup_model.loop
    req, col = submit(
        sched,
        lookup_model,
        QUOTE,
        SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=max_tokens),
    )
    wait(req)
    assert col.finished is not None
    same_as_plain(lookup_model, col.finished.text, plain_text[: len(col.finished.text)])
    # The answer may end before the limit (how long it is depends on the CPU's kernels).
    assert req.stats.gen_tokens == max_tokens or req.stats.stop_reason == "stop"
    assert_no_leak(sched)
    # The slot's cached prefix is usable by the next turn: the same request again.
    again, col2 = submit(
        sched,
        lookup_model,
        QUOTE,
        SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=max_tokens),
    )
    wait(again)
    assert col2.finished is not None
    same_as_plain(lookup_model, col2.finished.text, col.finished.text)
    assert again.stats.cached_tokens > 0
    assert_no_leak(sched)


def test_concurrent_requests_both_draft(lookup_model: Model, plain_text: str) -> None:
    """Two quoting requests at once: each drafts, its drafts verified in the step it shares
    with the other, and each hands out plain decoding's text; the cells are the slots'."""
    sched = lookup_model.loop
    a, col_a = submit(sched, lookup_model, QUOTE, GREEDY)
    b, col_b = submit(sched, lookup_model, QUOTE, GREEDY)
    wait(a)
    wait(b)
    assert col_a.finished is not None and col_b.finished is not None
    for req, col in ((a, col_a), (b, col_b)):
        assert col.finished is not None
        same_as_plain(lookup_model, col.finished.text, plain_text)
        assert 0 < req.stats.draft_accepted <= req.stats.draft_tokens
    # Steps with both generating carried drafts (the loop measured them at that level).
    assert sched._builder is not None and sched._builder.gain.level(2).drafted
    assert_no_leak(sched)


def test_lookup_off_without_the_setting(smollm2_path: Path) -> None:
    with Model(smollm2_path, params(lookup=False)) as m:
        sched = m.loop
        req, _ = submit(sched, m, QUOTE, GREEDY)
        wait(req)
        assert req.stats.draft_tokens == 0 and sched.snapshot().draft_tokens == 0


LIST = "Copy this list exactly: apple, banana, cherry, date, elderberry, fig, grape."


def test_cells_match_the_slot_when_the_request_is_reported_done(smollm2_path: Path) -> None:
    """A request that ends inside a run of accepted drafts has dead drafts after its last
    token. They are dropped before the request is reported finished: when a client sees
    `Finished` (and the slot free), the slot and llama.cpp hold at most the prompt and the
    answer, and agree. Before, the drafts were dropped just after, so a client reading the
    state then saw them, or half of the trim (kv_positions [66, 0] vs 67 cached tokens)."""
    one_slot = replace(params(lookup=True), n_ctx=1024, n_seq_max=1)
    with Model(smollm2_path, one_slot) as m:
        sched = m.loop
        seen: list[tuple[int, int, int]] = []  # llama.cpp's cells, the slot's, prompt + answer
        inside_drafts = 0
        prompt_len = [0]

        def on_event(ev: Event) -> None:
            if isinstance(ev, Finished):  # on the scheduler's thread, as the request ends
                seen.append(
                    (
                        sched.kv_positions()[0],
                        sched.snapshot().slots[0]["cached_tokens"],
                        prompt_len[0] + ev.stats.gen_tokens,
                    )
                )

        for max_tokens in range(3, 26, 3):
            sampling = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=max_tokens)
            for text in (QUOTE, LIST):
                prompt = m.chat_tokens([{"role": "user", "content": text}])
                prompt_len[0] = len(prompt)
                req = sched.submit(prompt, sampling, on_event)
                wait(req)
                st = req.stats
                inside_drafts += st.stop_reason == "length" and st.draft_accepted > 0
        assert inside_drafts > 0  # the case happened (drafts accepted, then the length limit)
        wrong = [x for x in seen if not x[0] == x[1] <= x[2]]
        assert not wrong, wrong
        assert_no_leak(sched)
