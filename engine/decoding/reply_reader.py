"""The one reader of a reply: its thinking apart from its answer, tool calls out of the answer.

The desktop chat and every HTTP dialect read a model's text through `ReplyReader`, piece by
piece as it streams or in one push for a whole answer, so both split alike. The steps go in one
order: the thinking block comes off first (engine.decoding.reasoning), then the answer is read
for calls in the family's format (engine.decoding.tool_calls). A thinking block that is not
separated (the client asked for it in the content, or the template names no markers) stays in
the content as written, and the call reader starts after it: a call drafted while thinking is
never a call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.decoding.reasoning import PieceKind, ReasoningSplitter, ThinkMarkers, block_end
from engine.decoding.tool_calls import ToolCall, ToolCallStream, ToolFormat

Part = tuple[PieceKind, str]


class ThinkingFigures(Protocol):
    """Where a reply's thinking figures go (engine.host.stats.GenerationStats)."""

    gen_tokens: int
    thinking_tokens: int
    thinking_s: float


@dataclass
class ReplyResult:
    content: str
    reasoning: str
    calls: list[ToolCall] = field(default_factory=list)
    forced: bool = False  # the reply could only be calls: no text, even when empty

    @property
    def cut_call(self) -> bool:
        """The token limit (or a stop string) cut a call: the last one is incomplete."""
        return any(not c.complete for c in self.calls)


class ReplyReader:
    """Reads a reply: `push(text, n_tokens)` returns the parts ready to show, ("reasoning" |
    "content", text); `finish(stats)` returns what was held back and the whole reply, and
    fills `stats.thinking_tokens`/`thinking_s` (a block that never closed counts the whole
    reply). `closed` is (tokens generated, seconds since the first piece) from the moment the
    block closed.

    `markers`: the thinking is separated with these (None: it stays in the content).
    `think`: the markers of a block left in the content, where no call is read.
    `in_thinking`: the prompt opened the block. `calls`: the format of the tools offered
    (None: no calls are read); `forced`: the reply was decoded under the forced-call grammar,
    so it is calls only; `parallel`: False keeps the first call. `prefix`: the raw text of an
    answer being continued, already shown: it only sets where the reader stands."""

    def __init__(
        self,
        markers: ThinkMarkers | None,
        *,
        think: ThinkMarkers | None = None,
        in_thinking: bool = False,
        calls: ToolFormat | None = None,
        forced: bool = False,
        parallel: bool = True,
        prefix: str = "",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._split = ReasoningSplitter(markers, in_thinking=in_thinking)
        self._calls: ToolCallStream | None = None
        if calls is not None:
            self._calls = calls.stream(None if markers else _after_block(think, in_thinking))
        self._forced, self._parallel = forced, parallel
        self._clock = clock
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._t0: float | None = None
        self._thought = False  # the block opened in this reply
        self.closed: tuple[int, float] | None = None
        if prefix:  # its parts are on screen already
            self._route(self._split.push(prefix))
            self._content.clear()
            self._reasoning.clear()

    @property
    def thinking(self) -> bool:
        """Inside the thinking block now."""
        return self._split.thinking

    def push(self, text: str, n_tokens: int = 0) -> list[Part]:
        now = self._clock()
        if self._t0 is None:
            self._t0 = now
        was = self._split.thinking
        out = self._route(self._split.push(text))
        self._thought = self._thought or was or self._split.thinking
        if was and not self._split.thinking and self.closed is None:
            self.closed = (n_tokens, now - self._t0)
        return out

    def _route(self, parts: Sequence[Part]) -> list[Part]:
        out: list[Part] = []
        for kind, text in parts:
            if not text:
                continue
            if kind == "reasoning":
                self._reasoning.append(text)
                out.append(("reasoning", text))
                continue
            shown = self._calls.push(text) if self._calls is not None else text
            if shown:
                self._content.append(shown)
                out.append(("content", shown))
        return out

    def finish(self, stats: ThinkingFigures | None = None) -> tuple[list[Part], ReplyResult]:
        """The parts still held back, and the whole reply. A cancelled or cut-off reply still
        gives what it wrote: an unfinished call stays text (unless `forced`)."""
        tail = self._route(self._split.flush())
        calls: list[ToolCall] = []
        if self._calls is not None:
            rest, calls = self._calls.finish(forced=self._forced)
            if not self._parallel:
                calls = calls[:1]
            if rest:
                self._content.append(rest)
                tail.append(("content", rest))
        if stats is not None and self._thought:
            t0 = self._t0 if self._t0 is not None else self._clock()
            stats.thinking_tokens, stats.thinking_s = self.closed or (
                stats.gen_tokens,
                self._clock() - t0,
            )
        reply = ReplyResult("".join(self._content), "".join(self._reasoning), calls, self._forced)
        return tail, reply


def _after_block(think: ThinkMarkers | None, in_thinking: bool) -> Callable[[str], int]:
    markers = think or ThinkMarkers()
    return lambda text: block_end(text, markers, in_thinking=in_thinking)


__all__ = ["Part", "ReplyReader", "ReplyResult", "ThinkingFigures"]
