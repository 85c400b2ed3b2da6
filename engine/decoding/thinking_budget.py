"""A reasoning budget: the thinking block ended after at most N of its tokens, the answer after.

llama-server's `--reasoning-budget` and the dialects' per-request budgets (Anthropic's
`budget_tokens`, OpenAI's `reasoning_effort`) ask for it. As llama.cpp's reasoning-budget
sampler does, the block's tokens are counted from its open marker (or from the first token
when the prompt opened it); when the count reaches the budget, the next tokens are forced to
the close marker's, one per step, and the model then writes its answer as it would after
closing the block itself. A forced token never splits a character: forcing waits until the
text so far is whole UTF-8. Budget 0 forces the close at once.

`ThinkingBudget` is what a request asks (made by the caller's plan); `BudgetKeeper` is its
state on the decode thread, fed each token the reply gets and asked which token, if any, the
next step must take.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from engine.decoding.reasoning import ThinkMarkers

UNLIMITED = -1  # llama-server's value for no budget

# OpenAI's reasoning effort as a budget, for a template that does not read `reasoning_effort`
# itself (gpt-oss's does: it is then given to the template, as llama-server gives it):
# LiteLLM's budgets for Anthropic's budget_tokens; none and minimal ask for no thinking,
# xhigh sets no limit.
EFFORT_BUDGET: dict[str, int] = {
    "none": 0,
    "minimal": 0,
    "low": 1024,
    "medium": 2048,
    "high": 4096,
    "xhigh": UNLIMITED,
}


@dataclass(frozen=True)
class ThinkingBudget:
    """At most `tokens` tokens of thinking (0: the block closes at once). `in_thinking`: the
    prompt opened the block, so the reply starts inside it."""

    tokens: int
    markers: ThinkMarkers
    in_thinking: bool = False
    message: str = ""  # written before the close (llama-server's reasoning_budget_message)

    @property
    def forced_text(self) -> str:
        """What is forced when the budget runs out: the message, then the close marker on
        its own line and the blank line a template puts before the answer (Qwen3's
        `\\n</think>\\n\\n`)."""
        return f"{self.message}\n{self.markers.close}\n\n"


State = Literal["start", "think", "force", "done"]


class BudgetKeeper:
    """One reply's budget on the decode thread. `forced()`: the token the next step must
    take (None: sample freely); `accept(token, piece)`: a token the reply took, with the
    bytes of its text as the reply reads them."""

    def __init__(self, budget: ThinkingBudget, close_tokens: Sequence[int]) -> None:
        if not close_tokens:
            raise ValueError("the close marker has no tokens")
        self.budget = budget
        self._close = list(close_tokens)
        self._queue: list[int] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""  # the reply's text since the block opened (or before it opened)
        self.counted = 0  # tokens of thinking so far
        self.forced_count = 0  # tokens forced
        self._state: State = "start"
        if budget.in_thinking:
            self._open()

    @property
    def state(self) -> State:
        return self._state

    def forced(self) -> int | None:
        return self._queue[0] if self._state == "force" else None

    def accept(self, token: int, piece: bytes) -> None:
        text = self._decoder.decode(piece)
        if self._state == "force":
            self._queue.pop(0)
            self.forced_count += 1
            if not self._queue:
                self._state = "done"
            return
        if self._state == "start":
            self._text += text
            body = self._text.lstrip()
            opener = self.budget.markers.open
            if body.startswith(opener):
                self._text = body[len(opener) :]
                self._open()
            elif not opener.startswith(body):  # the reply did not start with a block
                self._state = "done"
            return
        if self._state == "think":
            self._text += text
            if self.budget.markers.close in self._text:
                self._state = "done"  # the model closed it within its budget
                return
            self.counted += 1
            # Keep only what could still hold the close marker's start.
            self._text = self._text[-len(self.budget.markers.close) :]
            self._maybe_force()

    def _open(self) -> None:
        self._state = "think"
        self._text = ""
        self._maybe_force()

    def _maybe_force(self) -> None:
        # A character cut in two would be forced apart: wait until the text is whole.
        if self.counted >= self.budget.tokens and not self._decoder.getstate()[0]:
            self._state = "force"
            self._queue = list(self._close)


__all__ = ["EFFORT_BUDGET", "UNLIMITED", "BudgetKeeper", "ThinkingBudget"]
