"""A chat's summary of the turns its context leaves out (policy "summarise"), as the session
keeps it: the text and the messages it stands for, by their ids on screen, so that it maps
onto each new request whatever else the request holds (a system prompt, passages). The
engine writes it (engine.host.chat_engine: the old summary and the newly left-out turns,
summarised again when more must go); the store keeps it with the stored ids of the
messages it covers, and the person may edit its text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.services.chat_store import ChatStore
from app.services.conversation import Conversation
from engine.host.context_summary import Summary

# For each message of a request, the id of the message on screen it came from (None: the
# system message).
Sources = Sequence[str | None]


@dataclass(frozen=True)
class ChatSummary:
    text: str
    covers: frozenset[str]  # `Message.id`s

    @classmethod
    def of(cls, summary: Summary, sources: Sources) -> ChatSummary:
        """The engine's summary (its covers: indices into the request) by message ids."""
        ids = (sources[i] for i in summary.covers if 0 <= i < len(sources))
        return cls(summary.text, frozenset(i for i in ids if i is not None))

    def for_request(self, sources: Sources) -> Summary | None:
        """The summary for a request of these messages (None: it covers none of them)."""
        covers = tuple(i for i, s in enumerate(sources) if s is not None and s in self.covers)
        return Summary(self.text, covers) if covers and self.text.strip() else None


def load_summary(store: ChatStore, conversation: Conversation) -> ChatSummary | None:
    """The stored summary of the conversation on screen, mapped onto its messages."""
    cid = conversation.store_id
    stored = store.summary(cid) if cid is not None else None
    if stored is None:
        return None
    by_store = {m.store_id: m.id for m in conversation.messages if m.store_id is not None}
    covers = frozenset(by_store[i] for i in stored.covers if i in by_store)
    return ChatSummary(stored.text, covers)


def save_summary(store: ChatStore, conversation: Conversation, summary: ChatSummary) -> None:
    """Keep `summary` with the stored ids of the messages it covers."""
    cid = conversation.store_id
    if cid is None:
        return
    ids = [m.store_id for m in conversation.messages if m.id in summary.covers]
    store.set_summary(cid, summary.text, [i for i in ids if i is not None])


__all__ = ["ChatSummary", "Sources", "load_summary", "save_summary"]
