"""Policy "summarise": the turns a conversation cannot keep, replaced by a summary of them.

Pure functions, no model: `summary_request` builds the chat that asks the model for the
summary of the left-out turns (they go in as a transcript inside one user message, so the
request renders with any template, whatever roles and tool calls the turns hold);
`with_summary` builds the conversation to send with the summary in their place.

The summary goes where every template takes it: folded into the first system message when
the conversation has one (some templates refuse a second system message), otherwise as a
user message and a short assistant reply before the kept turns, which start at a user
message, so the roles still alternate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Messages = Sequence[Mapping[str, Any]]

# Tokens kept for the summary when choosing what to leave out, and its length limit.
SUMMARY_TOKENS = 256
NOTE_TOKENS = 48  # the note around it, or the user/assistant pair that carries it
SUMMARY_ORIGIN = -1  # `Summarised.origin` of a message that holds the summary only

INSTRUCTION = (
    "Summarise the conversation below in a few sentences: the facts, names, numbers and "
    "decisions someone would need to continue it, and any question left open. Write only "
    "the summary, in the conversation's language."
)
NOTE = "Summary of the earlier part of this conversation (those turns are not shown):"
ACK = "Understood."
MEDIA_TEXT = "[attachment]"


@dataclass(frozen=True)
class Summary:
    """A summary of the turns `covers` (indices into the conversation) stands for."""

    text: str
    covers: tuple[int, ...]


@dataclass(frozen=True)
class Summarised:
    """A conversation with a summary in place of some turns. `origin[i]`: the index in the
    original conversation of message `i`, or SUMMARY_ORIGIN for the summary's own messages;
    `folded`: the summary was appended to the system message (origin 0)."""

    messages: list[dict[str, Any]]
    origin: tuple[int, ...]
    folded: bool


def summary_room(n_ctx: int) -> int:
    """The longest summary asked for in an `n_ctx`-token context."""
    return max(1, min(SUMMARY_TOKENS, n_ctx // 4))


def transcript(messages: Messages, indices: Collection[int], *, marker: str = "") -> str:
    """The turns at `indices` as plain text, one "Role: text" paragraph each (`marker`: the
    media marker, written as a neutral placeholder)."""
    out: list[str] = []
    for i in sorted(indices):
        m = messages[i]
        role = str(m.get("role", "user"))
        text = _text(m.get("content"))
        if marker:
            text = text.replace(marker, MEDIA_TEXT)
        if role == "tool":
            out.append(f"Tool result: {text}")
            continue
        for call in m.get("tool_calls") or ():
            fn = call.get("function", {}) if isinstance(call, Mapping) else {}
            args = fn.get("arguments", "")
            args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            out.append(f"{role.capitalize()} called {fn.get('name', '?')}({args})")
        if text:
            out.append(f"{role.capitalize()}: {text}")
    return "\n\n".join(out)


def summary_request(
    messages: Messages, left_out: Collection[int], *, marker: str = ""
) -> list[dict[str, Any]]:
    """The chat that asks for a summary of the turns `left_out` of `messages`."""
    text = transcript(messages, left_out, marker=marker)
    return [{"role": "user", "content": f"{INSTRUCTION}\n\n---\n{text}\n---"}]


def fitted_summary_request(
    messages: Messages,
    left_out: Collection[int],
    count_tokens: Callable[[Messages], int],
    budget: int,
    *,
    marker: str = "",
) -> tuple[list[dict[str, Any]], tuple[int, ...]]:
    """The summary request for the latest of the turns `left_out` whose transcript fits in
    `budget` tokens, and those turns (none: not even the last one fits). Fewer turns never
    make it longer: binary-search the most that fit."""
    turns = sorted(left_out)
    lo, hi = 0, len(turns) - 1
    best: tuple[list[dict[str, Any]], tuple[int, ...]] = ([], ())
    while lo <= hi:
        mid = (lo + hi) // 2
        req = summary_request(messages, turns[mid:], marker=marker)
        if count_tokens(req) <= budget:
            best = (req, tuple(turns[mid:]))
            hi = mid - 1
        else:
            lo = mid + 1
    return best


def with_summary(messages: Messages, summary: Summary) -> Summarised:
    """`messages` with the turns `summary.covers` replaced by the summary."""
    covered = set(summary.covers)
    kept = [(i, dict(m)) for i, m in enumerate(messages) if i not in covered]
    note = f"{NOTE}\n{summary.text.strip()}"
    if kept and kept[0][1].get("role") == "system" and isinstance(kept[0][1].get("content"), str):
        first = kept[0][1]
        first["content"] = f"{first['content'].rstrip()}\n\n{note}" if first["content"] else note
        return Summarised([m for _, m in kept], tuple(i for i, _ in kept), True)
    n_head = 1 if kept and kept[0][1].get("role") == "system" else 0
    pair = [(SUMMARY_ORIGIN, {"role": "user", "content": note})]
    pair.append((SUMMARY_ORIGIN, {"role": "assistant", "content": ACK}))
    out = kept[:n_head] + pair + kept[n_head:]
    return Summarised([m for _, m in out], tuple(i for i, _ in out), False)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI-style parts: their text
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return "" if content is None else str(content)


__all__ = [
    "SUMMARY_ORIGIN",
    "SUMMARY_TOKENS",
    "Summarised",
    "Summary",
    "fitted_summary_request",
    "summary_request",
    "summary_room",
    "transcript",
    "with_summary",
]
