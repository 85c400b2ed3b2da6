"""Prompt lookup in the scheduler (`candlewick serve --lookup`), on the real SmolLM2: a lone
request drafts and gives plain decoding's tokens, concurrent ones decode plainly, and drafts
the model rejects or never reaches leave no KV cells behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.runtime import LoadParams, Model, SamplingParams
from engine.scheduler import Scheduler
from engine.speculative import SpeculativeSettings
from tests.engine.test_scheduler import assert_no_leak, submit, wait

QUOTE = ("The quick brown fox jumps over the lazy dog. The early bird catches the worm. "
         "Repeat both sentences exactly, then repeat them again.")
GREEDY = SamplingParams(temperature=0, max_tokens=40)


def params(lookup: bool) -> LoadParams:
    # No AMX weights and flash attention on: where one token and a batch get the same logits,
    # so drafted output must equal plain output (docs/speculative.md).
    return LoadParams(n_ctx=1024 * 2, n_seq_max=2, n_threads=2, extra_buffers=False,
                      flash_attn="on", state_cache_mb=0,
                      speculative=SpeculativeSettings("lookup") if lookup else None)


@pytest.fixture(scope="module")
def lookup_model(smollm2_path: Path) -> Iterator[Model]:
    m = Model(smollm2_path, params(lookup=True))
    yield m
    m.close()


@pytest.fixture(scope="module")
def plain_text(smollm2_path: Path) -> str:
    with Model(smollm2_path, params(lookup=False)) as m, Scheduler(m) as sched:
        req, col = submit(sched, m, QUOTE, GREEDY)
        wait(req)
        assert col.finished is not None and req.stats.draft_tokens == 0
        return col.finished.text


def test_lone_request_drafts_and_matches_plain(lookup_model: Model, plain_text: str) -> None:
    with Scheduler(lookup_model) as sched:
        req, col = submit(sched, lookup_model, QUOTE, GREEDY)
        wait(req)
        assert col.finished is not None
        assert col.finished.text == plain_text
        st = req.stats
        assert 0 < st.draft_accepted <= st.draft_tokens
        assert st.finish_reason == "stop" and st.completion_tokens > 16
        snap = sched.snapshot()
        assert (snap.draft_tokens, snap.draft_accepted) == (st.draft_tokens, st.draft_accepted)
        # Fewer decode steps than tokens: accepted drafts came several to a step.
        assert snap.steps < st.completion_tokens
        assert_no_leak(sched)


@pytest.mark.parametrize("max_tokens", [3, 9, 17])
def test_stopping_inside_accepted_drafts_leaves_no_cells(lookup_model: Model,
                                                         plain_text: str,
                                                         max_tokens: int) -> None:
    with Scheduler(lookup_model) as sched:
        req, col = submit(sched, lookup_model, QUOTE,
                          SamplingParams(temperature=0, max_tokens=max_tokens))
        wait(req)
        assert col.finished is not None and plain_text.startswith(col.finished.text)
        assert req.stats.completion_tokens == max_tokens
        assert_no_leak(sched)
        # The slot's cached prefix is usable by the next turn: the same request again.
        again, col2 = submit(sched, lookup_model, QUOTE,
                             SamplingParams(temperature=0, max_tokens=max_tokens))
        wait(again)
        assert col2.finished is not None and col2.finished.text == col.finished.text
        assert again.stats.cached_tokens > 0
        assert_no_leak(sched)


def test_concurrent_requests_decode_plainly(lookup_model: Model, plain_text: str) -> None:
    """Two requests at once: no drafting while both are in flight (the batch is shared)."""
    with Scheduler(lookup_model) as sched:
        a, col_a = submit(sched, lookup_model, QUOTE, GREEDY)
        b, col_b = submit(sched, lookup_model, "Name three colors.",
                          SamplingParams(temperature=0, max_tokens=40))
        wait(a)
        wait(b)
        assert col_a.finished is not None and col_b.finished is not None
        # Whichever finished first left the other alone for a while: it may draft then, but
        # never while both were generating, and the quoting one's text is plain's.
        assert col_a.finished.text == plain_text
        assert_no_leak(sched)


def test_lookup_off_without_the_setting(smollm2_path: Path) -> None:
    with Model(smollm2_path, params(lookup=False)) as m, Scheduler(m) as sched:
        req, _ = submit(sched, m, QUOTE, GREEDY)
        wait(req)
        assert req.stats.draft_tokens == 0 and sched.snapshot().draft_tokens == 0
