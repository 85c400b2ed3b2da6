"""A conversation as plain Python data: no Qt here, so a store (SQLite) can load and save it.

`ChatModel` (app/ui/chat_model.py) is the Qt item model over one of these; every change goes
through the item model so views are told about it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Literal

from engine.host.stats import GenerationStats

Role = Literal["system", "user", "assistant"]
# streaming: tokens still arriving; done: finished normally; stopped: the user pressed Stop;
# error: the engine failed, `error` says why; interrupted: the app died while it streamed
# (found in the store on the next start; it can be continued).
MessageState = Literal["streaming", "done", "stopped", "error", "interrupted"]
# How an answer's text is shown: as Markdown, or (structured output) as JSON.
AnswerFormat = Literal["markdown", "json"]


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


@dataclass
class Conversation:
    messages: list[Message] = field(default_factory=list)
    title: str = "New chat"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    store_id: int | None = None  # the conversation in the chat store, once saved

    def for_model(self) -> list[dict[str, str]]:
        """The chat as the engine wants it: finished turns only, failed replies left out.
        An answer is its text alone: earlier thinking is not sent back (the reasoning
        models' own templates drop it too)."""
        return [
            {"role": m.role, "content": m.text}
            for m in self.messages
            if m.state != "error" and m.state != "streaming" and (m.text or m.role != "assistant")
        ]
