"""Images and audio in the decode loop, on the fake backend: a media chunk's rows are
decoded alone through the typed backend's embeddings batch, encoded once, reused from the
cache by their placeholders, cut back to a chunk's start, and refused when they cannot fit.
The real projector and model: tests/engine/test_media_model.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import cast

import numpy as np
import numpy.typing as npt
import pytest

from engine.errors import EngineError
from engine.host.requests import Event, Failed, Finished, Request
from engine.host.scheduler import Scheduler
from engine.media.prompt import MediaPrompt, placeholders
from engine.native.backend import TokenBatch
from engine.native.projector import Chunks, MediaChunk, Projector, TextChunk
from engine.settings import SamplingParams
from tests.fake_backend import FakeBackend, FakeBatch, FakeLoopModel, FakeVocab, hash_next

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
VOCAB = FakeVocab()
N_EMBD = 8


class FakeProjector:
    """What `MediaPrompt` asks of a projector: rows for a chunk, from its key."""

    def __init__(self) -> None:
        self.encodes = 0

    def encode(self, chunk: MediaChunk) -> npt.NDArray[np.float32]:
        self.encodes += 1
        seed = int.from_bytes(chunk.key.encode()[:8].ljust(8, b"\0"), "little")
        rng = np.random.default_rng(seed)
        return rng.standard_normal((chunk.n_tokens, N_EMBD)).astype(np.float32)


def media_prompt(
    projector: FakeProjector,
    before: list[int],
    key: str,
    rows: int,
    after: list[int],
    *,
    non_causal: bool = False,
) -> MediaPrompt:
    chunk = MediaChunk("image", rows, rows, key, non_causal, handle=0)
    parts: list[TextChunk | MediaChunk] = [TextChunk(before), chunk, TextChunk(after)]
    return MediaPrompt(cast(Projector, projector), Chunks(None, parts))


class Batches:
    """Every decoded batch's rows, by sequence, and whether they were embeddings."""

    def __init__(self, be: FakeBackend) -> None:
        self.seen: list[tuple[bool, set[int], int]] = []
        original = be.decode

        def decode(batch: TokenBatch, *, fixed_threads: bool = False, causal: bool = True) -> None:
            assert isinstance(batch, FakeBatch)
            rows = [r for r in batch.rows[: batch.n_tokens] if r is not None]
            self.seen.append((batch.n_embd > 0, {r[2] for r in rows}, len(rows)))
            original(batch, fixed_threads=fixed_threads, causal=causal)

        be.decode = decode  # type: ignore[method-assign]


@pytest.fixture
def model() -> Iterator[FakeLoopModel]:
    m = FakeLoopModel(n_slots=2, n_ctx_seq=512, vocab=VOCAB, next_token=hash_next(len(VOCAB)))
    assert m.backend is not None
    m.backend.n_embd = N_EMBD
    yield m
    m.close()


def run(sched: Scheduler, mp: MediaPrompt, sampling: SamplingParams = GREEDY) -> Request:
    events: list[Event] = []
    req = sched.submit(mp.tokens, sampling, events.append, media=mp)
    assert req.done.wait(30), "request did not finish"
    assert isinstance(events[-1], Finished) and not isinstance(events[-1], Failed), events[-1]
    return req


def test_placeholders_are_negative_int32_distinct_and_named_by_the_media() -> None:
    a = placeholders("img-a", 0, 500)
    assert len(set(a)) == 500 and all(-(2**31) <= t < 0 for t in a)
    assert a == placeholders("img-a", 0, 500)
    assert not set(a) & set(placeholders("img-b", 0, 500))
    assert not set(a) & set(placeholders("img-a", 1, 500))  # the same image again, later


def test_a_chunk_is_decoded_alone_as_embeddings_and_encoded_once(model: FakeLoopModel) -> None:
    assert model.backend is not None
    batches = Batches(model.backend)
    proj = FakeProjector()
    first = run(model.loop, media_prompt(proj, [1, 2, 3], "img-cat", 40, [4, 5, 6]))
    assert proj.encodes == 1 and first.stats.media_encoded == 1
    assert first.stats.prompt_tokens == 46 and first.stats.cached_tokens == 0
    embedding_steps = [b for b in batches.seen if b[0]]
    assert [n for _, _, n in embedding_steps] == [40]  # every row, in one step
    # The same picture in the same place: its cells are reused, nothing is encoded again.
    again = run(model.loop, media_prompt(proj, [1, 2, 3], "img-cat", 40, [4, 5, 6]))
    assert proj.encodes == 1 and again.stats.media_encoded == 0
    assert again.stats.cached_tokens == 45
    assert again.tokens == first.tokens
    # Another picture: read and encoded again from its start.
    other = run(model.loop, media_prompt(proj, [1, 2, 3], "img-dog", 40, [4, 5, 6]))
    assert proj.encodes == 2 and other.stats.media_encoded == 1
    assert other.stats.cached_tokens == 3
    assert other.tokens != first.tokens  # the rows are what the model read


def test_media_rows_never_share_a_step_with_another_request(model: FakeLoopModel) -> None:
    assert model.backend is not None
    batches = Batches(model.backend)
    proj = FakeProjector()
    endless = SamplingParams(temperature=0.0, max_tokens=100_000)
    other: list[Event] = []
    busy = model.loop.submit([9, 8, 7], endless, other.append)
    try:
        req = run(model.loop, media_prompt(proj, [1, 2], "img-x", 100, [3]))
    finally:
        busy.cancel()
        assert busy.done.wait(30)
    steps = [(emb, seqs) for emb, seqs, _ in batches.seen]
    assert any(emb for emb, _ in steps)
    assert all(len(seqs) == 1 for emb, seqs in steps if emb)
    # 100 rows over a 64-row batch: two steps of the one chunk.
    assert [n for emb, _, n in batches.seen if emb] == [64, 36]
    assert req.stats.media_tokens == 100 and req.stats.media_encoded == 1


def test_a_non_causal_chunk_is_read_in_one_step_with_attention_both_ways(
    model: FakeLoopModel,
) -> None:
    assert model.backend is not None
    proj = FakeProjector()
    run(model.loop, media_prompt(proj, [1], "img-g", 30, [2], non_causal=True))
    assert model.backend.non_causal_steps == 1
    too_big = media_prompt(proj, [1], "img-h", 100, [2], non_causal=True)
    with pytest.raises(EngineError, match="loaded with micro-batches of 64; load it with --ubatch"):
        model.loop.submit(too_big.tokens, GREEDY, lambda ev: None, media=too_big)


def test_a_reused_prefix_ending_inside_a_chunk_restarts_at_its_start() -> None:
    proj = FakeProjector()
    mp = media_prompt(proj, [1, 2, 3], "img-a", 10, [4])
    assert [mp.boundary(n) for n in (0, 3, 4, 12, 13, 14)] == [0, 3, 3, 3, 13, 14]
    assert mp.next_start(0) == 3 and mp.next_start(4) is None
    span = mp.span_at(7)
    assert span is not None and (span.start, span.end) == (3, 13)
    assert mp.span_at(13) is None


def test_a_failing_media_decode_fails_the_request_in_one_line(model: FakeLoopModel) -> None:
    assert model.backend is not None
    proj = FakeProjector()
    mp = media_prompt(proj, [1, 2], "img-z", 20, [3])
    events: list[Event] = []
    done = threading.Event()

    def on_event(ev: Event) -> None:
        events.append(ev)
        if isinstance(ev, Finished):
            done.set()

    model.backend.fail_next = 1  # the first decode: the text before the image
    model.loop.submit(mp.tokens, GREEDY, on_event, media=mp)
    assert done.wait(30)
    assert isinstance(events[-1], Failed) and "\n" not in events[-1].message


def test_a_prompt_that_is_not_its_media_prompt_is_refused(model: FakeLoopModel) -> None:
    mp = media_prompt(FakeProjector(), [1], "img-a", 4, [2])
    with pytest.raises(EngineError, match="not its media prompt"):
        model.loop.submit([1, 2, 3], GREEDY, lambda ev: None, media=mp)


def test_cancelling_between_chunks_stops_before_the_next_encode(model: FakeLoopModel) -> None:
    started, go = threading.Event(), threading.Event()

    class SlowProjector(FakeProjector):
        def encode(self, chunk: MediaChunk) -> npt.NDArray[np.float32]:
            started.set()
            assert go.wait(30)
            return super().encode(chunk)

    proj = SlowProjector()
    one = MediaChunk("image", 10, 10, "img-1", False, handle=0)
    two = MediaChunk("image", 10, 10, "img-2", False, handle=0)
    parts: list[TextChunk | MediaChunk] = [TextChunk([1]), one, TextChunk([2]), two]
    mp = MediaPrompt(cast(Projector, proj), Chunks(None, parts))
    events: list[Event] = []
    req = model.loop.submit(mp.tokens, GREEDY, events.append, media=mp)
    assert started.wait(30)  # the loop is encoding the first picture
    req.cancel()
    go.set()
    assert req.done.wait(30)
    last = events[-1]
    assert isinstance(last, Finished) and last.stats.stop_reason == "cancelled"
    assert proj.encodes == 1  # the second picture was never encoded
    assert model.loop.slot_tokens() == [[], []]  # a cancelled request's cells are freed
