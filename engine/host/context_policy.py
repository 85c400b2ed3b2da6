"""What to do when a conversation outgrows the context: never truncate silently.

`fit_messages` returns the messages that will be sent and the indices of those it left out.
The policies:

- "drop_oldest": keep the system prompt and the latest turns.
- "truncate_middle": keep the system prompt, the first exchange (the first user message and
  the reply to it) and the latest turns; leave out the fewest turns between them. When the
  first exchange and the last message alone do not fit, it falls back to "drop_oldest".
- "summarise": leave out what "drop_oldest" leaves out; the caller puts a summary of those
  turns in their place (engine.host.context_summary), with room for it in `reserve`.
- "stop": refuse with a message that says how big the conversation is and how big the
  context is.

Whatever is kept after a gap starts at a user message (templates expect user/assistant
alternation), and the last message (the question) is always kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from engine.errors import EngineError

ContextPolicy = Literal["drop_oldest", "stop", "truncate_middle", "summarise"]
CONTEXT_POLICIES: tuple[ContextPolicy, ...] = get_args(ContextPolicy)
Messages = Sequence[Mapping[str, Any]]


class ContextFullError(EngineError):
    pass


@dataclass(frozen=True)
class FitResult:
    messages: list[Mapping[str, Any]]
    left_out: tuple[int, ...]  # indices into the conversation given, ascending
    prompt_tokens: int
    n_ctx: int

    @property
    def dropped(self) -> int:
        """How many messages were left out."""
        return len(self.left_out)

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
        return FitResult(msgs, (), n, n_ctx)
    if policy == "stop":
        raise ContextFullError(
            f"the conversation is {n} tokens and the context holds {n_ctx} "
            f"({reserve} kept for the answer); start a new chat, raise the context length "
            "or let Candlewick drop the oldest turns"
        )
    n_head = 1 if msgs[:1] and msgs[0].get("role") == "system" else 0
    head, body = msgs[:n_head], msgs[n_head:]
    if policy == "truncate_middle":
        kept = _truncate_middle(head, body, count_tokens, budget)
        if kept is not None:
            first, start, tokens = kept
            left = tuple(range(n_head + first, n_head + start))
            return FitResult(head + body[:first] + body[start:], left, tokens, n_ctx)
    start, tokens = _drop_oldest(head, body, count_tokens, budget, n_ctx, reserve)
    return FitResult(head + body[start:], tuple(range(n_head, n_head + start)), tokens, n_ctx)


def _drop_oldest(
    head: list[Mapping[str, Any]],
    body: list[Mapping[str, Any]],
    count_tokens: Callable[[Messages], int],
    budget: int,
    n_ctx: int,
    reserve: int,
) -> tuple[int, int]:
    """Where the kept part of `body` starts, and the prompt's tokens then."""
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
    return best


def _truncate_middle(
    head: list[Mapping[str, Any]],
    body: list[Mapping[str, Any]],
    count_tokens: Callable[[Messages], int],
    budget: int,
) -> tuple[int, int, int] | None:
    """(end of the first exchange, start of the latest turns, tokens) in `body`, or None
    when no gap leaves them both in."""
    users = [i for i, m in enumerate(body) if m.get("role") == "user"]
    if not users:
        return None
    # The first exchange runs to the next user message after the first one.
    first = next((i for i in users if i > users[0]), len(body))
    starts = sorted({i for i in users if i > first} | {len(body) - 1})
    starts = [s for s in starts if s > first]  # at least one message left out
    lo, hi = 0, len(starts) - 1
    best: tuple[int, int, int] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        tokens = count_tokens(head + body[:first] + body[starts[mid] :])
        if tokens <= budget:
            best = (first, starts[mid], tokens)
            hi = mid - 1
        else:
            lo = mid + 1
    return best


def _turn_start(body: list[Mapping[str, Any]], drop: int) -> int:
    """Index to start from after dropping `drop` messages, moved forward so the kept part
    starts with a user message (templates expect user/assistant alternation)."""
    i = min(drop, len(body) - 1)
    while i < len(body) - 1 and body[i].get("role") != "user":
        i += 1
    return i


__all__ = [
    "CONTEXT_POLICIES",
    "ContextFullError",
    "ContextPolicy",
    "FitResult",
    "fit_messages",
]
