"""The fake llama.cpp context refuses what llama.cpp refuses and keeps KV cells as it does,
so the scheduler tests on it (tests/engine/test_scheduler_policy.py) mean something."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import EngineError
from engine.native.backend import DecodeFailed
from engine.settings import SamplingParams
from tests.fake_backend import EOG, FakeBackend, FakeVocab


def fill(be: FakeBackend, rows: list[tuple[int, int, int, bool]]) -> None:
    b = be.batch(len(rows))
    for i, (tok, pos, seq, logits) in enumerate(rows):
        b.put(i, tok, pos, seq, logits)
    b.n_tokens = len(rows)
    be.decode(b)


def test_positions_must_continue_each_sequence() -> None:
    be = FakeBackend(n_seq_max=2, n_ctx_seq=8)
    fill(be, [(5, 0, 0, False), (6, 1, 0, True), (7, 0, 1, True)])
    assert be.tokens(0) == [5, 6] and be.tokens(1) == [7]
    with pytest.raises(DecodeFailed) as gap:
        fill(be, [(8, 3, 0, True)])  # position 2 skipped
    assert gap.value.rc == -1
    with pytest.raises(DecodeFailed):
        fill(be, [(8, 0, 2, True)])  # no sequence 2
    assert be.tokens(0) == [5, 6]  # a refused batch writes nothing


def test_a_full_sequence_refuses_the_batch_with_llama_cpps_code() -> None:
    be = FakeBackend(n_seq_max=1, n_ctx_seq=3)
    fill(be, [(1, 0, 0, False), (2, 1, 0, False), (3, 2, 0, True)])
    with pytest.raises(DecodeFailed) as full:
        fill(be, [(4, 3, 0, True)])
    assert full.value.rc == 1 and "the context is full" in str(full.value)


def test_only_rows_that_asked_have_logits_and_the_model_reads_the_cells() -> None:
    be = FakeBackend(n_seq_max=2, n_ctx_seq=8, next_token=lambda h: len(h))
    fill(be, [(5, 0, 0, False), (6, 1, 0, True), (9, 0, 1, True)])
    assert int(np.argmax(be.logits(1))) == 2  # two cells through row 1's position
    assert int(np.argmax(be.logits(-1))) == 1  # the last output row: sequence 1's
    with pytest.raises(EngineError, match="no logits"):
        be.logits(0)


def test_kv_operations_and_state_round_trip() -> None:
    be = FakeBackend(n_seq_max=3, n_ctx_seq=8)
    fill(be, [(t, p, 0, False) for p, t in enumerate([4, 5, 6, 7])])
    be.seq_cp(0, 1, 0, 2)
    assert be.tokens(1) == [4, 5] and be.copies == 1
    be.seq_rm(0, 2, -1)
    assert be.tokens(0) == [4, 5] and be.pos_max(0) == 1
    state = be.state_get(0, 1 << 20)
    assert state is not None and be.state_get(2, 1 << 20) is None  # empty: nothing to save
    assert be.state_get(0, 8) is None  # larger than allowed
    assert be.state_set(2, state) and be.tokens(2) == [4, 5]
    assert not be.state_set(2, b"not a state")
    be.seq_keep(2)
    assert be.tokens(0) == [] and be.tokens(1) == [] and be.tokens(2) == [4, 5]
    be.seq_shift(2, 1, -1, 3)
    assert be.cells[2] == {0: 4, 4: 5}
    be.clear()
    assert all(be.pos_max(s) == -1 for s in range(3))


def test_samplers_greedy_seeded_and_freed_once() -> None:
    vocab = FakeVocab()
    be = FakeBackend(n_seq_max=1, vocab=vocab, next_token=lambda h: 3)
    fill(be, [(1, 0, 0, True)])
    greedy = be.greedy_sampler()
    assert be.sample(greedy, 0) == 3
    draws = []
    for _ in range(2):
        s = be.sampler(SamplingParams(temperature=1.0, seed=9))
        draws.append([be.sample(s, 0) for _ in range(20)])
        be.sampler_free(s)
        with pytest.raises(EngineError, match="freed"):
            be.sampler_free(s)
    assert draws[0] == draws[1]
    assert all(0 <= t < len(vocab) for t in draws[0])  # never an id without a piece
    assert be.is_eog(EOG) and be.token_to_piece(EOG, False) == b""


def test_a_negative_seed_wraps_as_llama_cpps_uint32_does() -> None:
    """The server passes a client's seed through; -1 must not kill the fake's loop thread."""
    be = FakeBackend(n_seq_max=1, vocab=FakeVocab(), next_token=lambda h: 3)
    fill(be, [(1, 0, 0, True)])
    wrapped = be.sampler(SamplingParams(temperature=1.0, seed=-1))
    same = be.sampler(SamplingParams(temperature=1.0, seed=0xFFFFFFFF))
    assert [be.sample(wrapped, 0) for _ in range(10)] == [be.sample(same, 0) for _ in range(10)]
