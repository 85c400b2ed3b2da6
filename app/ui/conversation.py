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


@dataclass
class Conversation:
    messages: list[Message] = field(default_factory=list)
    title: str = "New chat"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    store_id: int | None = None  # the conversation in the chat store, once saved

    def for_model(self) -> list[dict[str, str]]:
        """The chat as the engine wants it: finished turns only, failed replies left out."""
        return [
            {"role": m.role, "content": m.text}
            for m in self.messages
            if m.state != "error" and m.state != "streaming" and (m.text or m.role != "assistant")
        ]
