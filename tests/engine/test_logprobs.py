"""Log probabilities from the decode loop (engine.host.logprobs, engine.host.finishing), on
the fake backend: the arithmetic against a float64 reference, which tokens a request is told
about (not the end token, nor what a stop string took), drafted tokens read from their own
verification rows, a grammar's mask counted, and nothing computed for a request that did
not ask."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
import pytest

from engine.errors import EngineError
from engine.host import finishing
from engine.host.logprobs import (
    MAX_TOP_LOGPROBS,
    TokenLogprob,
    log_softmax,
    token_text,
    top_tokens,
)
from engine.host.requests import Event, Finished, Piece
from engine.native.backend import TokenBatch
from engine.settings import SamplingParams
from tests.engine.drafting import always_draft  # noqa: F401 (a fixture)
from tests.fake_backend import EOG, FakeBatch, FakeLoopModel, FakeVocab

GREEDY = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=12)


def reference(row: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    x = row.astype(np.float64)
    return x - (np.max(x) + np.log(np.sum(np.exp(x - np.max(x)))))


def test_log_softmax_matches_a_float64_reference() -> None:
    rng = np.random.default_rng(7)
    row = (rng.standard_normal(49152) * 4).astype(np.float32)
    row[::97] = -np.inf  # masked tokens
    lp = log_softmax(row)
    assert lp.dtype == np.float32
    finite = np.isfinite(row)
    assert np.allclose(lp[finite], reference(row[finite]), atol=1e-5, rtol=0)
    assert np.all(np.isneginf(lp[~finite]))
    assert math.isclose(float(np.exp(lp[finite].astype(np.float64)).sum()), 1.0, rel_tol=1e-5)
    with pytest.raises(ValueError, match="no finite"):
        log_softmax(np.full(8, -np.inf, dtype=np.float32))


def test_top_tokens_most_likely_first_ties_by_id_never_impossible() -> None:
    lp = np.array([-1.0, -0.5, -2.0, -0.5, -np.inf, -3.0], dtype=np.float32)
    assert top_tokens(lp, 3) == [1, 3, 0]
    assert top_tokens(lp, 0) == []
    # More asked than can be drawn: the -inf token is left out.
    assert top_tokens(lp, 6) == [1, 3, 0, 2, 5]
    assert top_tokens(lp, 100) == [1, 3, 0, 2, 5]


def test_a_partial_character_is_written_as_escapes() -> None:
    assert token_text(" caf\u00e9".encode()) == " caf\u00e9"
    assert token_text(b"\xe2\x80") == "\\xe2\\x80"
    assert token_text(b"\x99 ok") == "\\x99 ok"


# -- the loop --------------------------------------------------------------------------------

REPLY = " the cat sat on a mat and then"


class Collect:
    def __init__(self) -> None:
        self.pieces: list[Piece] = []
        self.finished: Finished | None = None
        self.done = threading.Event()

    def __call__(self, ev: Event) -> None:
        if isinstance(ev, Piece):
            self.pieces.append(ev)
        elif isinstance(ev, Finished):
            self.finished = ev
            self.done.set()

    def result(self) -> Finished:
        assert self.done.wait(30)
        assert self.finished is not None
        return self.finished


def scripted(vocab: FakeVocab, prompt: list[int], reply: list[int]) -> object:
    """A model that answers `prompt` with `reply`, then the end; anything else: the end."""

    def next_token(history: Sequence[int]) -> int:
        n = len(prompt)
        k = len(history) - n
        if list(history[:n]) != prompt or k >= len(reply):
            return EOG
        return reply[k]

    return next_token


@pytest.fixture
def vocab() -> FakeVocab:
    return FakeVocab()


def model_for(vocab: FakeVocab, reply: str, **kw: object) -> tuple[FakeLoopModel, list[int]]:
    prompt = vocab.tokenize(" one big red dog")
    m = FakeLoopModel(
        vocab=vocab,
        next_token=scripted(vocab, prompt, vocab.tokenize(reply)),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )
    return m, prompt


def run(
    m: FakeLoopModel,
    prompt: list[int],
    sampling: SamplingParams = GREEDY,
    *,
    logprobs: int | None = 2,
    spec: str | None = None,
) -> tuple[Finished, list[Piece]]:
    col = Collect()
    m.loop.submit(prompt, sampling, col, logprobs=logprobs, spec=spec)  # type: ignore[arg-type]
    return col.result(), col.pieces


@pytest.fixture
def served(vocab: FakeVocab) -> Iterator[tuple[FakeLoopModel, list[int]]]:
    m, prompt = model_for(vocab, REPLY)
    yield m, prompt
    m.close()


def expected_chosen(m: FakeLoopModel, vocab: FakeVocab) -> float:
    """The fake's row: the chosen token's logit, 0 for every other piece, -inf past them."""
    c = m._chosen_logit
    return c - math.log(math.exp(c) + len(vocab) - 1)


def test_each_token_of_the_text_with_its_alternatives(
    served: tuple[FakeLoopModel, list[int]], vocab: FakeVocab
) -> None:
    m, prompt = served
    done, pieces = run(m, prompt, logprobs=3)
    assert done.text == REPLY
    lps = done.logprobs
    assert [t.token for t in lps] == vocab.tokenize(REPLY)  # not the end token
    assert b"".join(t.piece for t in lps).decode() == done.text
    for t in lps:
        assert t.logprob == pytest.approx(expected_chosen(m, vocab), abs=1e-5)
        assert t.top[0].token == t.token  # greedy: the most likely one
        assert len(t.top) == 3
        # The others tie at 0: the lowest ids, the end token first, shown by its name.
        assert [a.token for a in t.top[1:]] == [x for x in (0, 1, 2) if x != t.token][:2]
        assert t.top[1].piece == b"</s>"
    # Streamed: each piece carries the tokens its text completes; together, the same.
    assert [t for p in pieces for t in p.logprobs] == list(lps)
    for p in pieces:
        assert b"".join(t.piece for t in p.logprobs).decode() == p.text


def test_a_stop_string_takes_its_tokens_out(
    served: tuple[FakeLoopModel, list[int]], vocab: FakeVocab
) -> None:
    m, prompt = served
    stop = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=12, stop=(" on a",))
    done, pieces = run(m, prompt, stop, logprobs=0)
    assert done.text == " the cat sat"
    assert [token_text(t.piece) for t in done.logprobs] == [" the", " cat", " sat"]
    assert all(t.top == () for t in done.logprobs)
    assert [t for p in pieces for t in p.logprobs] == list(done.logprobs)


def test_nothing_is_computed_for_a_request_that_did_not_ask(
    served: tuple[FakeLoopModel, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    m, prompt = served

    def refuse(row: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        raise AssertionError("log probabilities computed for a request that did not ask")

    monkeypatch.setattr(finishing, "log_softmax", refuse)
    done, pieces = run(m, prompt, logprobs=None)
    assert done.text == REPLY and done.logprobs == ()
    assert all(p.logprobs == () for p in pieces)


def test_the_number_of_alternatives_is_bounded(served: tuple[FakeLoopModel, list[int]]) -> None:
    m, prompt = served
    with pytest.raises(EngineError, match="top_logprobs must be between 0 and 20"):
        m.loop.submit(prompt, GREEDY, lambda _ev: None, logprobs=MAX_TOP_LOGPROBS + 1)


class BanOdd:
    """A grammar's mask that forbids every odd id but the reply's own tokens."""

    complete = False
    error: str | None = None

    def __init__(self, allowed: set[int]) -> None:
        self.allowed = allowed

    def apply(self, logits: npt.NDArray[np.float32]) -> None:
        odd = np.arange(logits.size) % 2 == 1
        odd[list(self.allowed)] = False
        logits[odd] = -np.inf

    def consume(self, token: int) -> bool:
        return True


def test_a_grammar_mask_is_counted(vocab: FakeVocab) -> None:
    m, prompt = model_for(vocab, REPLY)
    reply = set(vocab.tokenize(REPLY))
    m.grammar_mask = lambda _g: BanOdd(reply)  # type: ignore[assignment,method-assign,return-value]
    try:
        masked = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=12, grammar="g")
        done, _ = run(m, prompt, masked, logprobs=5)
    finally:
        m.close()
    n = len(vocab)
    # Allowed: the even ids and the reply's odd ones; the chosen token among them.
    allowed = len([t for t in range(n) if t % 2 == 0 or t in reply])
    c = m._chosen_logit
    want = c - math.log(math.exp(c) + allowed - 1)
    for t in done.logprobs:
        assert t.logprob == pytest.approx(want, abs=1e-5)
        assert all(a.token % 2 == 0 or a.token in reply for a in t.top)


def _positional(m: FakeLoopModel) -> None:
    """Every logits row made to differ by its position (a second-best token that moves),
    so a token read from another row's logits would show."""
    be = m.backend
    assert be is not None
    decode = be.decode

    def decode_then_vary(b: TokenBatch, **kw: bool) -> None:
        decode(b, **kw)
        assert isinstance(b, FakeBatch)
        for j, i in enumerate(be._out_rows):
            row = b.rows[i]
            assert row is not None
            pos = row[1]
            be._out[j, 1 + pos % 7] += 0.25 * (1 + pos % 5)

    be.decode = decode_then_vary  # type: ignore[method-assign]


@pytest.mark.usefixtures("always_draft")
def test_drafted_tokens_take_their_verification_rows(vocab: FakeVocab) -> None:
    # The reply repeats the prompt, so prompt lookup drafts it.
    words = " the cat sat on a mat and then it ran to see one big red dog that was very"
    prompt = vocab.tokenize(words * 2)
    reply = words * 2

    def go(spec: str) -> tuple[Finished, list[TokenLogprob]]:
        m = FakeLoopModel(
            n_slots=1,
            n_ctx_seq=1024,
            vocab=vocab,
            next_token=scripted(vocab, prompt, vocab.tokenize(reply)),  # type: ignore[arg-type]
        )
        try:
            _positional(m)
            long = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=30)
            done, _ = run(m, prompt, long, logprobs=4, spec=spec)
            return done, list(done.logprobs)
        finally:
            m.close()

    drafted, with_drafts = go("lookup")
    plain, without = go("off")
    assert drafted.stats.draft_accepted > 10 and plain.stats.draft_tokens == 0
    assert drafted.text == plain.text
    assert with_drafts == without
    # The rows did differ: the second choice moves with the position.
    assert len({t.top[1].token for t in without}) > 1


class SplitCharacters(FakeVocab):
    """Pieces named `<hi:XX>` (the space before them dropped) are the lone byte 0xXX: a
    character split between tokens."""

    def piece(self, token: int, special: bool = False) -> bytes:
        raw = super().piece(token, special).lstrip()
        if raw.startswith(b"<hi:"):
            return bytes([int(raw[4:6], 16)])
        return super().piece(token, special)


def test_a_character_split_between_tokens_comes_with_its_last_token() -> None:
    vocab = SplitCharacters()
    m, prompt = model_for(vocab, " caf <hi:c3> <hi:a9> ok")
    try:
        done, pieces = run(m, prompt, logprobs=0)
    finally:
        m.close()
    assert done.text == " caf\u00e9 ok"
    assert [t.piece for t in done.logprobs] == [b" caf", b"\xc3", b"\xa9", b" ok"]
    # The first byte alone is no text yet: its token waits for the piece that completes it.
    assert [[t.piece for t in p.logprobs] for p in pieces] == [
        [b" caf"],
        [b"\xc3", b"\xa9"],
        [b" ok"],
    ]
    assert [p.text for p in pieces] == [" caf", "\u00e9", " ok"]
