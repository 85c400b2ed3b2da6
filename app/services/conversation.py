"""A conversation as plain Python data: no Qt here, so a store (SQLite) can load and save it
and the chat's session (app/services/chat_session.py) can run it.

`ChatModel` (app/ui/chat_model.py) is the Qt item model over one of these; every change goes
through a `Transcript` (app/services/chat_transcript.py), so views are told about it.
`for_model` builds the model's history from what is on screen (a chat with no store too),
with the store's words for tool results (app/services/chat_history.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from app.services.attachments import Attachment
from app.services.chat_history import tool_result_text
from engine.host.stats import GenerationStats
from engine.rag.grounding import Grounding

Role = Literal["system", "user", "assistant", "tool"]
# streaming: tokens still arriving; done: finished normally; stopped: the user pressed Stop;
# error: the engine failed, `error` says why; interrupted: the app died while it streamed
# (found in the store on the next start; it can be continued).
MessageState = Literal["streaming", "done", "stopped", "error", "interrupted"]
# How an answer's text is shown: as Markdown, or (structured output) as JSON.
AnswerFormat = Literal["markdown", "json"]
# What the user decided about a tool call: pending (asked, not answered yet), allowed (once),
# always (this tool from now on, without asking), denied; cancelled: the turn was stopped
# before it was answered.
ToolDecision = Literal["pending", "allowed", "always", "denied", "cancelled"]
# A tool result: running (the call is out), complete, error (the tool failed or its server
# did), denied (the user said no), cancelled (Stop, or the turn ended before it ran).
ToolStatus = Literal["running", "complete", "error", "denied", "cancelled"]


@dataclass
class ToolCallView:
    """A call the model made: `arguments` is the JSON text it wrote."""

    id: str
    name: str
    arguments: str
    server: str = ""
    decision: ToolDecision = "pending"


@dataclass
class ToolProgress:
    """A long tool's progress (MCP progress notifications): done of total, and its words."""

    done: float
    total: float | None = None
    message: str | None = None


@dataclass
class Message:
    role: Role
    text: str
    state: MessageState = "done"
    stats: GenerationStats | None = None
    error: str | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    store_id: int | None = None  # the message's row in the chat store, once saved
    branch: tuple[int, int] = (1, 1)  # position among its alternatives ("2/3")
    # A reasoning model's thinking block, apart from `text` (the answer): shown above it,
    # never sent back to the model. `thought`: (tokens, seconds) once the block has closed.
    thinking: str = ""
    thought: tuple[int, float] | None = None
    answer_format: AnswerFormat = "markdown"
    model: str | None = None  # the name of the model that wrote an answer, as it was then
    # An answer's tool calls (the agent loop), and for a "tool" message: which call it
    # answers, the tool, how it ended, whether its text was cut to the size limit.
    tool_calls: list[ToolCallView] = field(default_factory=list)
    tool_call_id: str | None = None
    tool_name: str | None = None
    tool_status: ToolStatus = "complete"
    truncated: bool = False
    progress: ToolProgress | None = None  # while a tool runs
    # The passages of the chat's collections an answer was given (None: not grounded). They
    # go in that answer's prompt only: the history sent later holds the answer's text alone.
    grounding: Grounding | None = None
    # Images and audio sent with a user message (the files are the store's, by hash).
    attachments: list[Attachment] = field(default_factory=list)


# Which attachments go to the model (those of a kind it reads, whose file can be read).
Sends = Callable[[Attachment], bool]


def _sent(m: Message) -> bool:
    return m.role == "user" and m.state not in ("error", "streaming")


@dataclass
class Conversation:
    messages: list[Message] = field(default_factory=list)
    title: str = "New chat"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    store_id: int | None = None  # the conversation in the chat store, once saved

    def media_for_model(self, sends: Sends) -> list[Attachment]:
        """The attachments `for_model` puts a marker for, in the same order."""
        return [a for m in self.messages if _sent(m) for a in m.attachments if sends(a)]

    def for_model(self, marker: str = "", sends: Sends | None = None) -> list[dict[str, Any]]:
        """The chat as the engine wants it: finished turns only, failed replies left out.
        An answer is its text alone: earlier thinking is not sent back (the reasoning
        models' own templates drop it too). Tool calls and their results go in the OpenAI
        shape the engine's tool formats read (a denied or cancelled call is answered so).
        A user message's attachments that `sends` accepts stand as one `marker` each
        before its text (the media go with the request: `media_for_model`); the others
        are left out (a model without a projector for them reads the text alone)."""
        out: list[dict[str, Any]] = []
        for m in self.messages:
            if m.role == "tool":
                if m.tool_status != "running":
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": m.tool_call_id or "",
                            "name": m.tool_name or "",
                            "content": _result_text(m),
                        }
                    )
                continue
            if m.state in ("error", "streaming"):
                continue
            if m.role == "assistant" and m.tool_calls:
                out.append(
                    {
                        "role": "assistant",
                        "content": m.text,
                        "tool_calls": [
                            {
                                "id": c.id,
                                "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments},
                            }
                            for c in m.tool_calls
                        ],
                    }
                )
            elif m.text or m.role != "assistant":
                shown = [a for a in m.attachments if sends(a)] if sends and _sent(m) else []
                text = "".join(f"{marker}\n" for _ in shown) + m.text
                out.append({"role": m.role, "content": text})
        return out


def _result_text(m: Message) -> str:
    """What the model reads as a tool's answer (the same words as for a stored chat)."""
    return tool_result_text(m.tool_status, m.text)
