"""The greedy picker and the repeat window (engine.host.greedy_pick) against llama.cpp's own
chain: the same token for the same row and window, on made-up rows and on SmolLM2's logits,
greedy and sampled; and a greedy request with a repeat penalty drafts through it to plain
decoding's tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from engine.host.greedy_pick import GreedyPicker, RepeatWindow, chain_spec, penalised_here, usable
from engine.host.runtime import Model
from engine.native.backend import LlamaBackend
from engine.settings import SamplingParams
from tests.backend_batches import decode_at
from tests.engine.drafting import always_draft  # noqa: F401 (a fixture)
from tests.exactness import assert_same_greedy, exact_load

T = TypeVar("T")
CODE_EDIT = """def parse_config(path):
    with open(path) as f:
        data = json.load(f)
    if "name" not in data:
        raise ValueError("config needs a name")
    data.setdefault("port", 8080)
    data.setdefault("debug", False)
    return data

Rewrite this function with the default port changed to 9090. Show the whole function."""


def row(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_window_slides_and_penalises_both_signs() -> None:
    s = SamplingParams(temperature=0, repeat_penalty=2.0, repeat_last_n=2)
    p = GreedyPicker(s, [7, 7, 0])  # the window holds the prompt's last two: 7, 0
    assert p.pick(row(3.0, 2.0)) == 1  # 3 / 2 < 2
    # Window now 0, 1. A negative logit is multiplied: -1 * 2 < -1.5.
    assert p.pick(row(-2.0, -1.0, -1.5)) == 2
    # Window 1, 2: token 0 left it and is not penalised any more.
    assert p.pick(row(3.0, 2.0, 0.0)) == 0


def test_no_penalty_is_the_first_largest() -> None:
    for s in (
        SamplingParams(temperature=0, repeat_penalty=1.0),
        SamplingParams(temperature=0, repeat_penalty=1.5, repeat_last_n=0),
    ):
        p = GreedyPicker(s, [0, 1, 2])
        assert p.pick(row(1.0, 5.0, 5.0)) == 1


def test_what_it_stands_in_for() -> None:
    assert usable(SamplingParams(temperature=0))
    assert not usable(SamplingParams(temperature=0.7))
    assert not usable(SamplingParams(temperature=0, frequency_penalty=0.5))
    assert not usable(SamplingParams(temperature=0, presence_penalty=0.5))


def test_which_penalties_leave_the_chain() -> None:
    """A repeat penalty alone is applied by the loop: the chain is built without it. With a
    frequency or presence penalty the chain keeps all three; without one, nothing changes."""
    alone = SamplingParams(temperature=0.8, repeat_penalty=1.1)
    assert penalised_here(alone)
    assert chain_spec(alone) == SamplingParams(temperature=0.8, repeat_penalty=1.0)
    assert not chain_spec(alone).penalizes
    for kept in (
        SamplingParams(repeat_penalty=1.1, frequency_penalty=0.5),
        SamplingParams(repeat_penalty=1.1, presence_penalty=0.5),
        SamplingParams(repeat_penalty=1.0),
    ):
        assert not penalised_here(kept)
        assert chain_spec(kept) is kept


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Iterator[Model]:
    m = Model(smollm2_path, exact_load(n_ctx=512, n_threads=1, state_cache_mb=0))
    yield m
    m.close()


def on_decoded(m: Model, prompt: list[int], read: Callable[[LlamaBackend], T]) -> T:
    """`read(backend)` on the model's decode thread with `prompt` decoded in one batch, every
    row's logits kept; the context cleared before and after."""

    def run() -> T:
        be = m.backend
        assert be is not None
        be.clear()
        try:
            decode_at(be, prompt, 0, True, fixed_threads=False)
            return read(be)
        finally:
            be.clear()

    return m.loop.call_soon(run)


def chain_token(be: LlamaBackend, s: SamplingParams, history: list[int], r: int) -> int:
    """The token llama.cpp's chain for `s`, having accepted `history`, takes from row `r`."""
    chain = be.sampler(s)
    try:
        for t in history:
            be.sampler_accept(chain, t)
        return be.sample(chain, r)
    finally:
        be.sampler_free(chain)


def test_same_token_as_the_chain(smollm2: Model) -> None:
    """Rows of real logits, windows holding each row's best tokens (so the penalty decides),
    penalties above and below 1: the picker takes the chain's token every time."""
    prompt = smollm2.tokenize("The quick brown fox jumps over the lazy dog because")

    def check(be: LlamaBackend) -> int:
        checked = 0
        for r in range(len(prompt)):
            top = [int(t) for t in np.argsort(-be.logits(r))[:6]]
            for penalty, window in ((1.3, top[:3]), (0.7, top[2:5]), (1.1, top[::2])):
                s = SamplingParams(temperature=0, repeat_penalty=penalty, repeat_last_n=8)
                history = [*prompt[:3], *window]
                want = chain_token(be, s, history, r)  # before the picker writes into the row
                got = GreedyPicker(s, history).pick(be.logits(r).copy())
                assert got == want, (r, penalty, window)
                checked += 1
        return checked

    assert on_decoded(smollm2, prompt, check) == 3 * len(prompt)


def test_sampled_row_penalised_here_draws_the_chains_token(smollm2: Model) -> None:
    """A sampled request's repeat penalty applied to the row here, then the chain without
    the penalties sampler (top-k, top-p, min-p, temperature, the seeded draw): the token the
    whole chain draws, row after row, with windows of the row's likeliest tokens."""
    prompt = smollm2.tokenize("Once upon a time, in a small village by the sea, there lived")

    def check(be: LlamaBackend) -> tuple[int, int]:
        checked = decided = 0  # decided: rows where the penalty changed the draw
        for r in range(len(prompt)):
            top = [int(t) for t in np.argsort(-be.logits(r))[:6]]
            for penalty, window, seed in ((1.3, top[:3], 7), (0.7, top[1:5], 11)):
                s = SamplingParams(
                    temperature=1.5, repeat_penalty=penalty, repeat_last_n=8, seed=seed
                )
                history = [*prompt[:3], *window]
                want = chain_token(be, s, history, r)
                plain = chain_token(be, chain_spec(s), [], r)
                kept = be.logits(r).copy()
                RepeatWindow(s, history).penalise(be.logits(r))
                got = chain_token(be, chain_spec(s), [], r)
                be.logits(r)[:] = kept
                assert got == want, (r, penalty, window)
                decided += plain != want
                checked += 1
        return checked, decided

    checked, decided = on_decoded(smollm2, prompt, check)
    assert checked == 2 * len(prompt)
    assert decided > 0


@pytest.mark.usefixtures("always_draft")
def test_lookup_with_a_repeat_penalty_matches_plain(exact_smollm2_path: Path) -> None:
    """A quoting reply with the app's repeat penalty: lookup drafts (picked, not sampled by
    the chain) and hands out plain decoding's tokens."""
    s = SamplingParams(temperature=0, max_tokens=48)
    messages = [{"role": "user", "content": CODE_EDIT}]
    with Model(exact_smollm2_path, exact_load(n_ctx=1024, n_threads=1)) as m:
        ref = m.generate(messages, s, spec="off")
        ref.consume()
        m.reset_cache()
        got = m.generate(messages, s, spec="lookup")
        got.consume()
        assert got.stats.draft_tokens > 0
        assert_same_greedy(m.exactness, got.tokens, ref.tokens, positions=255, batch=63)
