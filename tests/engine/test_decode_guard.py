"""Batches that break a context's limits are refused with one line before llama.cpp sees
them: a context that fills, a batch larger than the context's batch, a sequence id out of
range, a token id outside the vocabulary. `llama_decode` is counted to show it never ran
with the refused batch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.errors import EngineError
from engine.host import batch_builder, scheduler
from engine.host.decode_guard import DecodeRefused
from engine.host.runtime import Model
from engine.host.slots import Slot
from engine.native import llama_lib
from engine.settings import LoadParams, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


@pytest.fixture(scope="module")
def small(smollm2_path: Path) -> Iterator[Model]:
    m = Model(
        smollm2_path, LoadParams(n_ctx=512, n_batch=16, n_seq_max=2, n_threads=2, state_cache_mb=0)
    )
    yield m
    m.close()


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    C = llama_lib.lib()
    real = C.llama_decode
    calls: list[int] = []

    def counting(ctx: Any, batch: Any) -> int:
        calls.append(int(batch.n_tokens))
        return int(real(ctx, batch))

    monkeypatch.setattr(C, "llama_decode", counting)
    return calls


def test_a_prompt_past_the_context_is_refused(small: Model, decodes: list[int]) -> None:
    small.reset_cache()
    with pytest.raises(EngineError) as exc:
        small.submit(list(range(100, 400)), GREEDY)
    # Two sequences share the 512 cells: each slot holds 256.
    assert str(exc.value) == (
        "the prompt is 300 tokens, the context holds 256; shorten the "
        "conversation or load the model with a larger context"
    )
    assert decodes == []


def test_a_token_outside_the_vocabulary_is_refused(small: Model, decodes: list[int]) -> None:
    small.reset_cache()
    with pytest.raises(DecodeRefused) as exc:
        small.submit([1, 2, small.n_vocab + 5], GREEDY)
    assert (
        str(exc.value) == f"token id {small.n_vocab + 5} is outside the vocabulary "
        f"(0 to {small.n_vocab - 1})"
    )
    assert decodes == []


class _GreedyDrafter:
    """A drafter that ignores the length it is asked for: more than the batch can hold."""

    sets_length = True

    def begin(self, tokens: list[int]) -> None: ...

    def accept(self, token: int) -> None: ...

    def propose(self, n: int) -> list[int]:
        return [100] * 40

    def end(self) -> None: ...

    def rebind(self, seq: int) -> None: ...


def test_a_draft_larger_than_the_batch_is_refused(
    small: Model, decodes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    small.reset_cache()
    monkeypatch.setattr(batch_builder, "propose_drafts", lambda drafter, m, n: drafter.propose(n))
    monkeypatch.setattr(scheduler, "PromptLookup", lambda cost: _GreedyDrafter())
    gen = small.complete("Hello", GREEDY, spec="lookup")
    with pytest.raises(EngineError) as exc:
        gen.consume()
    assert str(exc.value) == "a batch of 41 tokens is larger than the context's batch size of 16"
    assert gen.stats.stop_reason == "error"
    assert 41 not in decodes
    assert small.loop.kv_positions() == [0, 0]  # the failed request's cells are gone


def test_the_scheduler_checks_each_slot_before_writing_the_batch(small: Model) -> None:
    # Slots are made with ids below n_seq_max, so the checks are driven directly: a slot id
    # the context does not have, and tokens past the end of the batch buffer.
    sched = small.loop
    refusal = sched._builder.refusal
    assert refusal(Slot(2), 0, 1) == (
        "sequence id 2 is out of range: the context has 2 sequences (ids 0 to 1)"
    )
    assert refusal(sched._slots[0], sched.n_batch - 1, 2) == (
        "a batch of 17 tokens is larger than the context's batch size of 16"
    )
    full = Slot(1)
    full.tokens = [1] * (sched.n_ctx_seq - 1)
    assert refusal(full, 0, 2) == (
        "the context is full: 2 tokens at position 255 need 257 positions, the context "
        "holds 256; start a new chat or load the model with a larger context"
    )
    assert refusal(sched._slots[1], 0, 16) is None
