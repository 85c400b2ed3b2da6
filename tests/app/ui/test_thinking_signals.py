"""The engine thread's signals for a reasoning model's reply, exactly: the thinking as
`reasoning`, the answer as `tokens`, both coalesced, and `thought` between the last words of
the thinking and the first of the answer; the block's figures in the final stats. The reply is
a scripted `EmbeddedReply` (known pieces, a fake clock-free generation), so the sequence does
not depend on a model; test_thinking_and_structured.py does the same on the real SmolLM2."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from PySide6.QtCore import QObject, Slot

from app.ui.worker import EngineWorker
from engine.decoding.reasoning import ThinkMarkers
from engine.decoding.reply_reader import ReplyReader
from engine.host.chat_engine import ChatRequest, EmbeddedReply, continued_text
from engine.host.stats import GenerationStats
from engine.settings import SamplingParams


class ScriptedGeneration:
    """What `EmbeddedReply` reads of a `Generation`: pieces, one token each."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces
        self.prompt = [1, 2, 3]
        self.tokens: list[int] = []
        self.text = ""
        self.stats = GenerationStats(prompt_tokens=3)

    def __iter__(self) -> Iterator[str]:
        for p in self.pieces:
            self.tokens.append(len(self.tokens))
            self.text += p
            yield p
        self.stats.gen_tokens = len(self.tokens)


class ScriptedThinker:
    """A chat engine whose reply is an embedded one with think markers."""

    name = "scripted thinker"
    kind = "remote"
    n_ctx = None
    can_continue = False

    def __init__(self, pieces: list[str], in_thinking: bool = False) -> None:
        self.pieces = pieces
        self.in_thinking = in_thinking

    def reply(self, *_args: Any, **_kw: Any) -> EmbeddedReply:
        gen: Any = ScriptedGeneration(self.pieces)
        return EmbeddedReply(gen, ReplyReader(ThinkMarkers(), in_thinking=self.in_thinking))

    def close(self) -> None:
        pass


class Recorder(QObject):
    def __init__(self, worker: EngineWorker) -> None:
        super().__init__()
        self.events: list[tuple[Any, ...]] = []
        worker.started.connect(self.on_started)
        worker.reasoning.connect(self.on_reasoning)
        worker.thought.connect(self.on_thought)
        worker.tokens.connect(self.on_tokens)
        worker.finished.connect(self.on_finished)
        worker.failed.connect(self.on_failed)

    @Slot(int, int)
    def on_started(self, rid: int, n: int) -> None:
        self.events.append(("started", n))

    @Slot(int, str, int)
    def on_reasoning(self, rid: int, text: str, n: int) -> None:
        self.events.append(("reasoning", text, n))

    @Slot(int, int, float)
    def on_thought(self, rid: int, n: int, s: float) -> None:
        self.events.append(("thought", n))

    @Slot(int, str, int)
    def on_tokens(self, rid: int, text: str, n: int) -> None:
        self.events.append(("tokens", text, n))

    @Slot(int, object)
    def on_finished(self, rid: int, stats: GenerationStats) -> None:
        self.events.append(("finished", stats.gen_tokens, stats.thinking_tokens))
        self.stats = stats

    @Slot(int, str)
    def on_failed(self, rid: int, message: str) -> None:
        self.events.append(("failed", message))


PIECES = ["<think>", "\n", "Let", " me", " see", ".", "\n", "</", "think", ">", "\n\n", "Hi", "!"]


def run(pieces: list[str], interval: float, in_thinking: bool = False) -> Recorder:
    worker = EngineWorker(token_interval_s=interval)
    worker.engine = ScriptedThinker(pieces, in_thinking)  # type: ignore[assignment]
    rec = Recorder(worker)
    # Called on this thread: the signals reach the recorder directly, in emission order.
    worker.generate(
        ChatRequest([{"role": "user", "content": "hi"}], SamplingParams()), threading.Event(), 1
    )
    worker.engine = None
    return rec


def test_every_piece_at_once_thinking_then_the_close_then_the_answer() -> None:
    rec = run(PIECES, interval=0.0)
    assert rec.events == [
        ("started", 3),
        ("reasoning", "Let", 3),
        ("reasoning", " me", 4),
        ("reasoning", " see", 5),
        ("reasoning", ".", 6),
        ("thought", 10),  # after "</think>": 10 tokens generated
        ("tokens", "Hi", 12),
        ("tokens", "!", 13),
        ("finished", 13, 10),
    ]
    assert rec.stats.thinking_s >= 0


def test_coalesced_the_close_still_comes_between_thinking_and_answer() -> None:
    """With a long interval only the first text goes out at once; the rest of the thinking is
    sent when the block closes, before `thought`, and the answer at the end."""
    rec = run(PIECES, interval=3600.0)
    assert rec.events == [
        ("started", 3),
        ("reasoning", "Let", 3),
        ("reasoning", " me see.", 10),
        ("thought", 10),
        ("tokens", "Hi!", 13),
        ("finished", 13, 10),
    ]


def test_a_block_opened_by_the_prompt_that_never_closes_is_all_thinking() -> None:
    rec = run(["Hmm", ",", " Paris", "?"], interval=0.0, in_thinking=True)
    names = [e[0] for e in rec.events]
    assert "thought" not in names and "tokens" not in names
    assert "".join(e[1] for e in rec.events if e[0] == "reasoning") == "Hmm, Paris?"
    assert rec.events[-1] == ("finished", 4, 4)  # the whole reply counts as thinking


def test_no_markers_no_split() -> None:
    """An answer that does not start with the block is all answer, `<think>` in it or not."""
    rec = run(["Sure", ": <think>", " is a tag."], interval=0.0)
    assert [e for e in rec.events if e[0] in ("reasoning", "thought")] == []
    assert "".join(e[1] for e in rec.events if e[0] == "tokens") == "Sure: <think> is a tag."
    assert rec.events[-1] == ("finished", 3, 0)


@pytest.mark.parametrize(
    ("in_thinking", "thinking", "answer", "raw"),
    [
        (True, "It is large.", "", "It is large."),
        (True, "It is large.", "Paris", "It is large.\n</think>\n\nParis"),
        (False, "It is large.", "", "<think>\nIt is large."),
        (True, "", "Paris", "\n</think>\n\nParis"),
    ],
)
def test_a_continued_answer_is_given_back_as_the_model_wrote_it(
    in_thinking: bool, thinking: str, answer: str, raw: str
) -> None:
    assert continued_text(ThinkMarkers(), in_thinking, thinking, answer) == raw
    # Read from there, the reader stands where the text stopped: inside the block or after.
    reader = ReplyReader(ThinkMarkers(), in_thinking=in_thinking, prefix=raw)
    assert reader.thinking == (not answer)
    more = reader.push(" More.", 1) + reader.finish()[0]
    assert more == [("reasoning" if not answer else "content", " More.")]
