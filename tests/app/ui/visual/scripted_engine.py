"""A chat engine that streams a fixed long answer, piece by piece, at a steady pace: the
window gets it through the real engine thread (the worker's loop, its coalescing, its
signals), exactly as a model's answer, without the test depending on how fast, or how long,
a small model writes on a busy machine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from engine.decoding.reply_reader import Part
from engine.decoding.tool_calls import ToolCall
from engine.host.chat_engine import ChatRequest, EngineKind
from engine.host.stats import GenerationStats

PIECE_S = 0.002  # ~500 pieces a second: several pieces per coalesced GUI update


def story(paragraphs: int = 14) -> str:
    """A long Markdown answer: a title line, paragraphs, and a last line to look for."""
    body = (
        "The keeper climbed the hundred steps at dusk, trimmed the wick, wound the "
        "clockwork and watched the beam sweep over the rocks and the dark water. "
    ) * 3
    parts = [f"Paragraph {i + 1}. {body}" for i in range(paragraphs)]
    return "\n\n".join(["**The Lighthouse Keeper**", *parts, "The end."])


class ScriptedReply:
    """A `ReplyStream` whose text is all answer: no thinking, no tool calls."""

    thought: tuple[int, float] | None = None

    def __init__(self, text: str, cancel: threading.Event | None) -> None:
        self.tool_calls: list[ToolCall] = []
        # Words with their following space, as a tokenizer would cut them.
        self._pieces = [w + " " for w in text.split(" ")]
        self._pieces[-1] = self._pieces[-1].rstrip(" ")
        self._cancel = cancel
        self._text: list[str] = []
        self._stats = GenerationStats(measured_on="client")

    @property
    def prompt_tokens(self) -> int | None:
        return None

    @property
    def generated_tokens(self) -> int:
        return len(self._text)

    @property
    def dropped_messages(self) -> int:
        return 0

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def stats(self) -> GenerationStats:
        return self._stats

    def parts(self) -> Iterator[list[Part]]:
        for piece in self:
            yield [("content", piece)]

    def __iter__(self) -> Iterator[str]:
        t0 = time.perf_counter()
        for piece in self._pieces:
            if self._cancel is not None and self._cancel.is_set():
                self._stats.stop_reason = "cancelled"
                break
            time.sleep(PIECE_S)
            if not self._text:
                self._stats.ttft_s = time.perf_counter() - t0
            self._text.append(piece)
            yield piece
        elapsed = time.perf_counter() - t0
        self._stats.gen_tokens = len(self._text)
        self._stats.total_s = elapsed
        self._stats.gen_tps = self._stats.gen_tps_wall = len(self._text) / elapsed


class ScriptedEngine:
    def __init__(self, text: str) -> None:
        self._text = text

    @property
    def name(self) -> str:
        return "scripted story"

    @property
    def kind(self) -> EngineKind:
        return "remote"

    @property
    def n_ctx(self) -> int | None:
        return None

    @property
    def can_continue(self) -> bool:
        return False

    def reply(self, request: ChatRequest, cancel: threading.Event | None = None) -> ScriptedReply:
        return ScriptedReply(self._text, cancel)

    def close(self) -> None:
        pass
