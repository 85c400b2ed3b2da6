"""Cutting a document into overlapping chunks sized in the embedding model's tokens.

A chunk never crosses a section boundary, so it keeps one page and one heading. Within a
section the text is cut into sentences (a sentence longer than a chunk into lines, then
words, then halves of a word), and sentences are packed greedily; a chunk ends at a
paragraph break when one falls in its second half, else at a sentence. The next chunk
starts with the last sentences of the previous one, up to `overlap_tokens`, so a passage
cut in two is still found whole in one of them.

Tokens are counted once per sentence and once per chunk (to check the sum, since a
tokenizer may count a joined text differently from its parts), never per growing prefix:
the cost is linear in the text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

from engine.rag.extract import Document, Section


@dataclass(frozen=True)
class Chunk:
    text: str
    page: int | None
    heading: str | None
    start: int  # char span [start, end) in Document.text
    end: int
    n_tokens: int


@dataclass(frozen=True)
class _Unit:
    """A sentence (or smaller piece) to pack: a char span, its tokens, and whether it opens
    a paragraph (a good place to end the chunk before it)."""

    start: int
    end: int
    n_tokens: int
    opens_paragraph: bool


_PARAGRAPH = re.compile(r"\n[ \t]*\n\s*")
# Whitespace after a sentence's end mark, perhaps behind a closing quote or bracket.
_SENTENCE = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][)\]\"'\u201d\u2019\u00bb]))\s+")
_LINE = re.compile(r"\s*\n\s*")
_WORD = re.compile(r"\s+")
# The finer cuts for a sentence too long for one chunk.
_FINER = (_LINE, _WORD)


def chunk(
    doc: Document,
    count_tokens: Callable[[str], int],
    *,
    max_tokens: int = 200,
    overlap_tokens: int = 32,
) -> list[Chunk]:
    """The document's chunks, in order: none empty, none over `max_tokens`, spans exact."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if not 0 <= overlap_tokens < max_tokens:
        raise ValueError("overlap_tokens must be at least 0 and less than max_tokens")
    chunks: list[Chunk] = []
    for section in doc.sections:
        units = _units(doc.text, section, count_tokens, max_tokens)
        chunks.extend(_pack(doc.text, section, units, count_tokens, max_tokens, overlap_tokens))
    return chunks


def _spans(text: str, start: int, end: int, separator: re.Pattern[str]) -> list[tuple[int, int]]:
    """The non-blank pieces of text[start:end] between separators, whitespace trimmed."""
    spans: list[tuple[int, int]] = []
    pos = start
    for m in separator.finditer(text, start, end):
        spans.append((pos, m.start()))
        pos = m.end()
    spans.append((pos, end))
    trimmed = []
    for s, e in spans:
        piece = text[s:e]
        stripped = piece.strip()
        if stripped:
            s += len(piece) - len(piece.lstrip())
            trimmed.append((s, s + len(stripped)))
    return trimmed


def _units(
    text: str, section: Section, count: Callable[[str], int], max_tokens: int
) -> list[_Unit]:
    units: list[_Unit] = []
    end = section.start + len(section.text)
    for p_start, p_end in _spans(text, section.start, end, _PARAGRAPH):
        first = True
        for s, e in _spans(text, p_start, p_end, _SENTENCE):
            for piece in _fitting(text, s, e, count, max_tokens, 0):
                units.append(_Unit(*piece, opens_paragraph=first))
                first = False
    return units


def _fitting(
    text: str, start: int, end: int, count: Callable[[str], int], max_tokens: int, level: int
) -> list[tuple[int, int, int]]:
    """text[start:end] as (start, end, tokens) pieces of at most max_tokens each."""
    n = count(text[start:end])
    if n <= max_tokens or end - start <= 1:
        return [(start, end, n)]  # a one-character piece is kept whatever it counts
    if level < len(_FINER):
        pieces = _spans(text, start, end, _FINER[level])
        if len(pieces) > 1:
            out: list[tuple[int, int, int]] = []
            for s, e in pieces:
                out.extend(_fitting(text, s, e, count, max_tokens, level + 1))
            return out
        return _fitting(text, start, end, count, max_tokens, level + 1)
    # One "word" longer than a chunk (a hash, base64, a minified line): cut it in halves.
    middle = (start + end) // 2
    return _fitting(text, start, middle, count, max_tokens, level) + _fitting(
        text, middle, end, count, max_tokens, level
    )


def _pack(
    text: str,
    section: Section,
    units: list[_Unit],
    count: Callable[[str], int],
    max_tokens: int,
    overlap_tokens: int,
) -> list[Chunk]:
    # before[k]: the tokens of units[:k], so any run's sum is one subtraction.
    before = [0, *accumulate(u.n_tokens for u in units)]
    chunks: list[Chunk] = []
    i = 0
    while i < len(units):
        j = i + 1  # every unit fits alone, so a chunk holds at least one
        while j < len(units) and before[j + 1] - before[i] <= max_tokens:
            j += 1
        if j < len(units):
            j = _paragraph_cut(units, before, i, j, max_tokens)
        # The parts' sum is an estimate: check the joined text, dropping sentences if over.
        n = count(text[units[i].start : units[j - 1].end]) if j - i > 1 else units[i].n_tokens
        while n > max_tokens and j - i > 1:
            j -= 1
            n = count(text[units[i].start : units[j - 1].end])
        start, end = units[i].start, units[j - 1].end
        chunks.append(Chunk(text[start:end], section.page, section.heading, start, end, n))
        if j >= len(units):
            break
        i = _overlap_start(units, i, j, max_tokens, overlap_tokens)
    return chunks


def _paragraph_cut(units: list[_Unit], before: list[int], i: int, j: int, max_tokens: int) -> int:
    """Where a full chunk units[i:j] should end: at the last paragraph break in its second
    half, else at j."""
    for p in range(j, i, -1):
        if before[p] - before[i] < max_tokens // 2:
            break
        if units[p].opens_paragraph:
            return p
    return j


def _overlap_start(units: list[_Unit], i: int, j: int, max_tokens: int, overlap_tokens: int) -> int:
    """The first unit of the chunk after units[i:j]: its last units up to overlap_tokens,
    as long as the next chunk still has room for units[j] (so it moves on)."""
    k, carried = j, 0
    room = max_tokens - units[j].n_tokens
    while k - 1 > i:
        n = units[k - 1].n_tokens
        if carried + n > overlap_tokens or carried + n > room:
            break
        carried += n
        k -= 1
    return k
