"""A stored conversation as the chat shows it: its active branch, each stored message as a
`Message` (states, figures, tool calls and results, passages, attachments), and the cuts a
new branch starts from.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from app.services.chat_store import ChatStore, StoredMessage
from app.services.conversation import (
    Conversation,
    Message,
    MessageState,
    Role,
    ToolCallView,
    ToolDecision,
    ToolStatus,
)
from engine.host.stats import GenerationStats
from engine.rag.grounding import Grounding

_STATES: dict[str, MessageState] = {
    "complete": "done",
    "interrupted": "interrupted",
    "error": "error",
    "streaming": "interrupted",  # the app died while it streamed: it can be continued
}
_STATS = frozenset(f.name for f in dataclasses.fields(GenerationStats))


def _decision(value: object) -> ToolDecision:
    """A stored call's decision. One never answered (the app closed while it waited) shows
    as not answered: its loop is gone, and the model read it as cancelled."""
    return value if value in ("allowed", "always", "denied") else "cancelled"


def _grounding(stored: dict[str, Any]) -> Grounding | None:
    """A stored answer's passages (None: it was not grounded)."""
    if not stored:
        return None
    try:
        return Grounding.from_dict(stored)
    except ValueError:  # written by hand into the database: shown without its sources
        return None


def _stats(m: StoredMessage) -> GenerationStats | None:
    if m.role != "assistant" or "gen_tokens" not in m.stats:
        return None
    stats = GenerationStats(**{k: v for k, v in m.stats.items() if k in _STATS})
    stats.server_usage = tuple(stats.server_usage)  # JSON has no tuples
    return stats


def shown_message(m: StoredMessage, store: ChatStore | None) -> Message:
    """A stored message as the chat shows it."""
    if m.role == "tool":  # a tool's result: its status is the stored one
        status = (
            m.status
            if m.status in ("running", "complete", "error", "denied", "cancelled")
            else "cancelled"
        )
        return Message(
            "tool",
            m.content,
            "done",
            store_id=m.id,
            tool_call_id=m.tool_call_id,
            tool_name=m.tool_name,
            tool_status=cast(ToolStatus, status),
            truncated=m.truncated,
        )
    stats = _stats(m)
    state = _STATES.get(m.status, "done")
    if state == "done" and stats is not None and stats.stop_reason == "cancelled":
        state = "stopped"
    role = m.role if m.role in ("system", "user", "assistant") else "user"
    calls = [
        ToolCallView(
            str(c.get("id", "")),
            str(c.get("name", "")),
            str(c.get("arguments", "")),
            str(c.get("server") or ""),
            _decision(c.get("decision")),
        )
        for c in m.tool_calls
    ]
    answer = m.role == "assistant"
    return Message(
        cast(Role, role),
        m.content,
        state,
        stats=stats,
        tool_calls=calls,
        error=m.stats.get("error") if m.status in ("error", "interrupted") else None,
        store_id=m.id,
        branch=store.branch_position(m.id) if store is not None else (1, 1),
        thinking=m.thinking,
        thought=(stats.thinking_tokens, stats.thinking_s)
        if stats is not None and stats.thinking_tokens
        else None,
        answer_format="json" if m.sampling.get("json_schema") is not None else "markdown",
        model=m.model if answer else None,
        grounding=_grounding(m.grounding) if answer else None,
        attachments=list(m.attachments),
    )


def stored_conversation(store: ChatStore, conversation_id: int) -> tuple[Conversation, Any]:
    """A stored conversation's active branch, and its settings as stored."""
    conv = store.conversation(conversation_id)
    shown = Conversation(
        title=conv.title,
        store_id=conv.id,
        messages=[shown_message(m, store) for m in store.active_path(conv.id)],
    )
    return shown, conv.settings


def cut_at(conv: Conversation, row: int) -> Conversation:
    """The conversation up to (not including) `row`: where a new branch starts."""
    return Conversation(conv.messages[:row], conv.title, store_id=conv.store_id)


def last_context(conv: Conversation) -> int:
    """What the chat takes in the context: its last reply's prompt and answer."""
    last = next((m.stats for m in reversed(conv.messages) if m.stats is not None), None)
    return last.prompt_tokens + last.gen_tokens if last else 0


__all__ = ["cut_at", "last_context", "shown_message", "stored_conversation"]
