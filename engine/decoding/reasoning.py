"""Reasoning separation: the think block a reasoning model writes before its answer.

Qwen3, QwQ and the DeepSeek-R1 distills write `<think>…</think>` first and the answer after
it; the API returns the two apart (`reasoning_content` and `content`). As in llama-server,
only a block at the very start of the answer counts: a `<think>` later in ordinary text is
text. Some templates open the block themselves at the end of the prompt (R1 distills, QwQ),
so the answer starts inside it and has only the close marker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PieceKind = Literal["reasoning", "content"]


@dataclass(frozen=True)
class ThinkMarkers:
    open: str = "<think>"
    close: str = "</think>"


# Marker pairs of the reasoning families we know, the most specific first.
KNOWN_MARKERS = (
    ThinkMarkers("<seed:think>", "</seed:think>"),
    ThinkMarkers("[THINK]", "[/THINK]"),
    ThinkMarkers("◁think▷", "◁/think▷"),
    ThinkMarkers(),
)


def thinking_markers(template_source: str | None) -> ThinkMarkers | None:
    """The think markers a template uses (Qwen3, DeepSeek-R1 distills, QwQ: <think>…</think>),
    None when it has none."""
    if not template_source:
        return None
    for markers in KNOWN_MARKERS:
        if markers.open in template_source and markers.close in template_source:
            return markers
    return None


def starts_thinking(prompt_text: str, markers: ThinkMarkers | None) -> bool:
    """The rendered prompt already opened the thinking block (it ends with the open marker,
    ignoring trailing whitespace), so the answer starts inside it (DeepSeek-R1 distills,
    QwQ)."""
    return markers is not None and prompt_text.rstrip().endswith(markers.open)


def split_reasoning(
    text: str, markers: ThinkMarkers | None, *, in_thinking: bool = False
) -> tuple[str, str]:
    """(reasoning, content) of a complete answer; content has the block removed and leading
    whitespace after the close marker stripped. An unclosed block is all reasoning.

    Reasoning is stripped of the blank lines models put around it, as llama-server does.
    """
    if markers is None:
        return "", text
    if not in_thinking:
        body = text.lstrip()
        if not body.startswith(markers.open):
            return "", text
        text = body[len(markers.open) :]
    end = text.find(markers.close)
    if end < 0:
        return text.strip(), ""
    return text[:end].strip(), text[end + len(markers.close) :].lstrip()


def block_end(text: str, markers: ThinkMarkers, *, in_thinking: bool = False) -> int:
    """Where the answer after a think block at the start of `text` begins: 0 without a block
    (or while its open marker is not yet whole), `len(text)` while the block is open.
    `in_thinking`: the prompt opened the block."""
    start = 0
    if not in_thinking:
        body = text.lstrip()
        if not body.startswith(markers.open):
            return 0
        start = len(text) - len(body) + len(markers.open)
    closed = text.find(markers.close, start)
    return len(text) if closed < 0 else closed + len(markers.close)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could grow into `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


class ReasoningSplitter:
    """Streaming version. push(text) -> list of ("reasoning" | "content", text) pieces ready
    to send; holds back a partial marker at the end of a piece ("<thi"); flush() at the end.

    What it sends, joined per kind, equals `split_reasoning` of the whole answer: the
    whitespace that split_reasoning strips is held until text follows it.
    """

    def __init__(self, markers: ThinkMarkers | None, *, in_thinking: bool = False) -> None:
        self._markers = markers
        # "start": not yet known whether a block opens; "think": inside it; "after": just
        # past the close marker (leading whitespace is dropped); "content": plain text.
        self._state = "think" if in_thinking and markers else "start" if markers else "content"
        self._pending = ""
        self._reasoning_started = False  # leading whitespace of the reasoning is dropped

    @property
    def thinking(self) -> bool:
        """Currently inside the block."""
        return self._state == "think"

    def push(self, text: str) -> list[tuple[PieceKind, str]]:
        self._pending += text
        pieces: list[tuple[PieceKind, str]] = []
        while self._pending:
            before = (self._state, len(self._pending))
            self._step(pieces)
            if (self._state, len(self._pending)) == before:
                break  # waiting for more text
        return _merge(pieces)

    def flush(self) -> list[tuple[PieceKind, str]]:
        pending, self._pending = self._pending, ""
        pieces: list[tuple[PieceKind, str]] = []
        if self._state == "think":
            self._reasoning(pending.rstrip(), pieces)
        elif self._state == "after":
            pieces.append(("content", pending.lstrip()))
        else:
            pieces.append(("content", pending))
        return _merge(pieces)

    def _step(self, pieces: list[tuple[PieceKind, str]]) -> None:
        assert self._markers is not None or self._state == "content"
        if self._state == "content":
            pieces.append(("content", self._pending))
            self._pending = ""
        elif self._state == "start":
            self._decide_start()
        elif self._state == "think":
            self._think(pieces)
        else:  # after
            rest = self._pending.lstrip()
            self._pending = rest
            if rest:
                self._state = "content"

    def _decide_start(self) -> None:
        assert self._markers is not None
        body = self._pending.lstrip()
        opener = self._markers.open
        if body.startswith(opener):
            self._pending = body[len(opener) :]
            self._state = "think"
        elif not opener.startswith(body):  # can no longer become the open marker
            self._state = "content"

    def _think(self, pieces: list[tuple[PieceKind, str]]) -> None:
        assert self._markers is not None
        close = self._markers.close
        end = self._pending.find(close)
        if end >= 0:
            self._reasoning(self._pending[:end].rstrip(), pieces)
            self._pending = self._pending[end + len(close) :]
            self._state = "after"
            return
        # Hold a partial close marker and the whitespace before it: both may yet be dropped.
        keep = _partial_suffix(self._pending, close)
        ready = self._pending[: len(self._pending) - keep].rstrip()
        self._reasoning(ready, pieces)
        self._pending = self._pending[len(ready) :]

    def _reasoning(self, text: str, pieces: list[tuple[PieceKind, str]]) -> None:
        if not self._reasoning_started:
            text = text.lstrip()
        if text:
            self._reasoning_started = True
            pieces.append(("reasoning", text))


def _merge(pieces: list[tuple[PieceKind, str]]) -> list[tuple[PieceKind, str]]:
    merged: list[tuple[PieceKind, str]] = []
    for kind, text in pieces:
        if not text:
            continue
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + text)
        else:
            merged.append((kind, text))
    return merged
