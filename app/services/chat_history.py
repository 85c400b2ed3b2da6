"""A stored branch as the model's history, OpenAI-shaped, tool calls and results included.

The engine (and any OpenAI-compatible server) wants every tool call of an assistant turn
answered by one 'tool' message right after it. The store may lack some (a denied call never
ran, the app died before a result was written, a call was never decided), so each call gets a
result here: its stored one, or a sentence saying why there is none. Results that answer no
call of the turn just before them are dropped: a server would refuse them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.services.chat_store import StoredMessage

DENIED = "The user denied this tool call."
CANCELLED = "The tool call was cancelled."
INTERRUPTED = "The tool call was interrupted before it finished; its result is unknown."


def tool_result_text(status: str, content: str, stats: dict[str, Any] | None = None) -> str:
    """What the model reads for a tool result of this status."""
    if status == "complete":
        return content
    if status == "error":
        detail = content or str((stats or {}).get("error") or "") or "the tool failed"
        return f"Error: {detail}"
    if status == "denied":
        # A reason the person gave travels with the refusal.
        return f"{DENIED} {content}" if content else DENIED
    if status == "cancelled":
        return CANCELLED
    return INTERRUPTED  # 'interrupted', or 'running' when asked mid-run


def _sent(m: StoredMessage) -> bool:
    # As the chat's own history: failed or unfinished answers and empty ones are left out.
    if m.role != "assistant":
        return True
    return m.status not in ("error", "streaming") and bool(m.content or m.tool_calls)


def history_messages(
    messages: Sequence[StoredMessage], *, system_prompt: str | None = None
) -> list[dict[str, Any]]:
    """`messages` (a branch, root first: `ChatStore.active_path`, or a prefix of it) as the
    chat completion's `messages`; `system_prompt` first when given. Thinking is not sent."""
    out: list[dict[str, Any]] = []
    if system_prompt and system_prompt.strip():
        out.append({"role": "system", "content": system_prompt.strip()})
    i = 0
    while i < len(messages):
        m = messages[i]
        i += 1
        if m.role == "tool" or not _sent(m):
            continue  # a result is taken with its call below; an orphan is dropped
        if m.role != "assistant" or not m.tool_calls:
            out.append({"role": m.role, "content": m.content})
            continue
        out.append(
            {
                "role": "assistant",
                "content": m.content,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in m.tool_calls
                ],
            }
        )
        results: dict[str, StoredMessage] = {}
        while i < len(messages) and messages[i].role == "tool":
            r = messages[i]
            if r.tool_call_id is not None:
                results.setdefault(r.tool_call_id, r)
            i += 1
        for c in m.tool_calls:  # in the order the model called them
            got = results.get(c["id"])
            if got is not None:
                text = tool_result_text(got.status, got.content, got.stats)
            else:
                text = DENIED if c.get("decision") == "denied" else CANCELLED
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": c["id"],
                    "name": got.tool_name if got is not None and got.tool_name else c["name"],
                    "content": text,
                }
            )
    return out
