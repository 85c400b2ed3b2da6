"""The one reply the chat is producing now, and where it is in its life.

A reply is asked for (send, regenerate, edit, continue, the next step of a tool loop), may
wait for the chosen engine to load, for the chat's collections to be searched (a chat with
documents) and for the chat's tools to be listed, then streams until the engine says it
finished or failed. The chat's session holds at most one and moves it through the steps
of its pipeline (app/services/chat_session.py); the engine's events carry a request id, and
one that is not this reply's belongs to an abandoned one.

    ASKED -> (WAITING_FOR_MODEL) -> (RETRIEVING) -> (WAITING_FOR_TOOLS) -> STREAMING
          -> ended (dropped)

Each step records what it found on the reply (`retrieved`, `grounding`, `tools`), so the
pipeline knows which step comes next without re-entering the one before.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from app.services.chat_store import ChatStoreError, StreamWriter
from app.services.chat_tools import OfferedTool
from engine.host.stats import GenerationStats
from engine.rag.grounding import Grounding

# Where a new answer attaches in the store: a message id, True for the branch's last
# message, None for a conversation's first message.
Parent = int | bool | None


class ReplyState(enum.Enum):
    ASKED = "asked"  # just asked for: the session is deciding what it waits for
    WAITING_FOR_MODEL = "waiting for the model"  # the chosen engine loads (or connects)
    RETRIEVING = "searching the documents"  # the question is searched in the collections
    WAITING_FOR_TOOLS = "waiting for tools"  # the chat's tool servers start and list theirs
    STREAMING = "streaming"  # the engine generates it; `rid` says which request


@dataclass
class ActiveReply:
    """A new answer (attached at `parent`) or more of the answer at `continue_row`."""

    state: ReplyState = ReplyState.ASKED
    parent: Parent = True
    continue_row: int | None = None
    row: int | None = None  # the assistant message on screen, once it streams
    rid: int | None = None  # the engine's request id, once it streams
    writer: StreamWriter | None = None  # its message in the store, if the chat is stored
    first_flushed: bool = False
    prompt_tokens: int = 0
    # A continued answer's thinking figures before this part (tokens, seconds).
    continued: tuple[int, float] | None = None
    # The engine the chat wants is the one in use (the pipeline's first step is done).
    engine_ready: bool = False
    # The passages its prompt holds, once retrieved (None: not grounded, or not yet), and
    # why retrieval failed (the answer then fails with it: never quietly ungrounded).
    grounding: Grounding | None = None
    retrieved: bool = False
    retrieval_error: str | None = None
    # The chat's tools offered with it, once listed (None: not decided yet; []: none).
    tools: list[OfferedTool] | None = None
    # Why the store stopped taking this answer (a full disk): it streams on, unsaved, and the
    # session says so once (`take_store_error`).
    store_error: str | None = None
    # For each message of the request sent, the id of the message on screen it came from
    # (None: the system prompt): what the meter's left-out indices and a summary's map to.
    sent: list[str | None] | None = None

    @property
    def streaming(self) -> bool:
        return self.state is ReplyState.STREAMING

    def is_for(self, rid: int) -> bool:
        """Whether an engine signal with request id `rid` is about this reply."""
        return self.streaming and rid == self.rid and self.row is not None

    def write(self, text: str, *, thinking: bool = False) -> None:
        """Text (or thinking) as it arrives, to the store: on disk from its first words,
        then at most a second behind."""
        if self.writer is None:
            return
        try:
            if thinking:
                self.writer.append_thinking(text)
            else:
                self.writer.append(text)
            if not self.first_flushed:
                self.writer.flush()
                self.first_flushed = True
        except ChatStoreError as e:
            self._store_failed(e)

    def thought(self, tokens: int, seconds: float) -> tuple[int, float]:
        """The thinking figures to show: a continued answer's earlier part counts too."""
        if self.continued is None:
            return tokens, seconds
        return tokens + self.continued[0], seconds + self.continued[1]

    def final_stats(self, stats: GenerationStats) -> GenerationStats:
        """`stats` of the whole answer: a continued one's thinking is both parts'."""
        if self.continued is not None and self.continued[0]:
            stats.thinking_tokens += self.continued[0]
            stats.thinking_s += self.continued[1]
        return stats

    def close(self, status: str = "complete", stats: dict[str, Any] | None = None) -> bool:
        """Save the stored message as it ends; True when there was one to save."""
        writer, self.writer = self.writer, None
        if writer is None:
            return False
        try:
            writer.finish(status=status, stats=stats)
        except ChatStoreError as e:
            self._store_failed(e)
            return False
        return True

    def _store_failed(self, error: ChatStoreError) -> None:
        self.writer = None  # what is stored stays as last written; no half-saved end
        self.store_error = str(error)

    def take_store_error(self) -> str | None:
        """The store's refusal, once: None when there is none or it was taken before."""
        error, self.store_error = self.store_error, None
        return error


__all__ = ["ActiveReply", "Parent", "ReplyState"]
