"""What to do when a conversation outgrows the context: never truncate silently.

`fit_messages` returns the messages that will be sent, and says how many old turns it
dropped. Policy "drop_oldest" keeps the system prompt and the latest turns; policy "stop"
refuses with a message that says how big the conversation is and how big the context is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from engine.errors import EngineError

ContextPolicy = Literal["drop_oldest", "stop"]
Messages = Sequence[Mapping[str, Any]]


class ContextFullError(EngineError):
    pass


@dataclass(frozen=True)
class FitResult:
    messages: list[Mapping[str, Any]]
    dropped: int  # messages left out from the start of the conversation
    prompt_tokens: int
    n_ctx: int

    @property
    def used_fraction(self) -> float:
        return self.prompt_tokens / self.n_ctx if self.n_ctx else 0.0


def fit_messages(
    messages: Messages,
    count_tokens: Callable[[Messages], int],
    n_ctx: int,
    *,
    reserve: int,
    policy: ContextPolicy = "drop_oldest",
) -> FitResult:
    """Fit `messages` plus `reserve` tokens for the answer into `n_ctx` tokens."""
    budget = n_ctx - reserve
    if budget <= 0:
        raise ContextFullError(
            f"the answer budget ({reserve} tokens) leaves no room in a {n_ctx}-token context"
        )
    msgs = list(messages)
    n = count_tokens(msgs)
    if n <= budget:
        return FitResult(msgs, 0, n, n_ctx)
    if policy == "stop":
        raise ContextFullError(
            f"the conversation is {n} tokens and the context holds {n_ctx} "
            f"({reserve} kept for the answer); start a new chat, raise the context length "
            "or let Candlewick drop the oldest turns"
        )
    head = [m for m in msgs[:1] if m.get("role") == "system"]
    body = msgs[len(head) :]
    # Dropping more turns never makes the prompt longer: binary-search the fewest to drop,
    # always keeping the last message (the question being asked).
    lo, hi = 1, len(body) - 1
    best: tuple[int, int] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        start = _turn_start(body, mid)
        tokens = count_tokens(head + body[start:])
        if tokens <= budget:
            best = (start, tokens)
            hi = mid - 1
        else:
            lo = mid + 1
    if best is None:
        last = count_tokens(head + body[-1:])
        raise ContextFullError(
            f"even the last message alone needs {last} tokens with the system prompt, and the "
            f"context holds {n_ctx} ({reserve} kept for the answer)"
        )
    start, tokens = best
    return FitResult(head + body[start:], start, tokens, n_ctx)


def _turn_start(body: list[Mapping[str, Any]], drop: int) -> int:
    """Index to start from after dropping `drop` messages, moved forward so the kept part
    starts with a user message (templates expect user/assistant alternation)."""
    i = min(drop, len(body) - 1)
    while i < len(body) - 1 and body[i].get("role") != "user":
        i += 1
    return i
