"""Texts of the app's own stores to score quants on (engine.bench.quality): a saved chat, or a
documents collection. Qt-free; the CLI and the window read them alike."""

from __future__ import annotations

from app.services.chat_store import ChatStore, ChatStoreError
from engine.bench.quality_text import QualityText
from engine.errors import EngineError
from engine.rag.store import RagStore, StoredChunk, StoreError

_SPOKEN = ("system", "user", "assistant")


def chat_text(store: ChatStore, conversation_id: int) -> QualityText:
    """A chat's branch on screen: its system, user and assistant messages, one paragraph each,
    oldest first (tool results and thinking blocks left out: they are not what the model
    writes as text)."""
    try:
        conv = store.conversation(conversation_id)
    except ChatStoreError:
        raise EngineError(f"no chat with id {conversation_id}") from None
    parts = [
        m.content.strip()
        for m in store.active_path(conversation_id)
        if m.role in _SPOKEN and m.content.strip()
    ]
    if not parts:
        raise EngineError(f"chat {conversation_id} has no text to score")
    return QualityText(f"chat {conversation_id} ({conv.title})", "\n\n".join(parts) + "\n")


def collection_text(store: RagStore, name: str) -> QualityText:
    """A collection's indexed documents, file by file (by path), each one's chunks joined
    where they overlap, so every passage is read once."""
    try:
        ids = store.vectors(name).chunk_ids
    except StoreError:
        known = ", ".join(c.name for c in store.collections()) or "none yet"
        raise EngineError(f"no collection named {name!r} (collections: {known})") from None
    chunks = sorted(
        store.chunks([int(i) for i in ids]).values(), key=lambda c: (str(c.path), c.ordinal)
    )
    docs: list[str] = []
    current: list[StoredChunk] = []
    for chunk in chunks:
        if current and chunk.path != current[-1].path:
            docs.append(_stitched(current))
            current = []
        current.append(chunk)
    if current:
        docs.append(_stitched(current))
    text = "\n\n".join(d for d in docs if d)
    if not text:
        raise EngineError(f"collection {name!r} has no indexed text; index it first")
    return QualityText(f"collection {name}", text + "\n")


def _stitched(chunks: list[StoredChunk]) -> str:
    """One document's chunks in order, each starting where the one before ended (they
    overlap by a few sentences: engine.rag.chunking)."""
    out: list[str] = []
    end = 0
    for c in chunks:
        if out and c.start > end:  # what lay between them was a separator: a paragraph break
            out.append("\n\n")
        skip = max(0, end - c.start)
        out.append(c.text[skip:])
        end = max(end, c.end)
    return "".join(out).strip()


__all__ = ["chat_text", "collection_text"]
