"""Grounding an answer in a collection's passages: which search hits go in the prompt under a
token budget, numbered [1]..[n], and the text the model reads them in.

The passages are taken in rank order; one that does not fit what is left of the budget is
passed over and the next (shorter) one tried, so a long passage near the top never costs the
answer every other excerpt. The count of the whole block is what is checked against the
budget, not a sum of the parts: tokens at the joins are counted as the model will see them.

The text is built from the sources alone (`grounding_text`), so an answer continued later is
given exactly the excerpts it was first written from, read back from the chat store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the chat store reads groundings: no PDF and Word parsers imported for that
    from engine.rag.search import Hit

CountTokens = Callable[[str], int]

DEFAULT_SHARE = 0.25  # of the context, unless the chat says otherwise
DEFAULT_K = 5  # passages searched for
INSTRUCTIONS = (
    "Answer from these excerpts of the user's documents. Cite the excerpts you use by their "
    "number, as [1]. If they do not hold the answer, say so."
)
# Formats whose extracted text is not the file's own text: no line number for them.
_NO_LINES = frozenset({".pdf", ".docx", ".html", ".htm", ".xhtml"})


@dataclass(frozen=True)
class Source:
    """One passage given to the model: its number in the prompt, where it is, its text."""

    number: int
    path: str
    page: int | None
    heading: str | None
    start: int  # the chunk's span in the document's extracted text
    end: int
    line: int | None  # the line `start` is on (text formats), else None
    text: str

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def where(self) -> str:
        """Where in the file, for a reader: "p. 4", "§ Install", "line 12" or ""."""
        if self.page is not None:
            return f"p. {self.page}"
        if self.heading:
            return f"§ {self.heading}"
        if self.line is not None:
            return f"line {self.line}"
        return ""

    @property
    def label(self) -> str:
        """ "[1] guide.pdf, p. 4"."""
        where = f", {self.where}" if self.where else ""
        return f"[{self.number}] {self.name}{where}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "path": self.path,
            "page": self.page,
            "heading": self.heading,
            "start": self.start,
            "end": self.end,
            "line": self.line,
            "text": self.text,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Source:
        """A stored or imported source; ValueError (one line) for one that is not."""
        if not isinstance(d, Mapping):
            raise ValueError("a source must be an object")
        number, start, end = (_whole(d.get(k)) for k in ("number", "start", "end"))
        if number is None or start is None or end is None:
            raise ValueError("a source needs whole numbers for number, start and end")
        if not isinstance(d.get("path"), str) or not isinstance(d.get("text"), str):
            raise ValueError("a source needs a path and a text")
        heading = d.get("heading")
        return cls(
            number=number,
            path=d["path"],
            page=_whole(d.get("page")),
            heading=heading if isinstance(heading, str) else None,
            start=start,
            end=end,
            line=_whole(d.get("line")),
            text=d["text"],
        )


def _whole(v: object) -> int | None:
    """`v` if it is an int (JSON's true is not), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Grounding:
    """What retrieval added to one answer's prompt."""

    sources: tuple[Source, ...]
    text: str  # the block put in the prompt ("" when no passage was used)
    tokens: int  # its size in the chat model's tokens
    budget: int  # the most it could take
    offered: int = 0  # distinct passages search found (some may not have fit)
    collections: tuple[str, ...] = ()

    @property
    def summary(self) -> str:
        """ "Retrieval adds 1,840 tokens from 4 passages (budget 2,048)"; when nothing was
        used, why."""
        where = ", ".join(self.collections) or "the chat's collections"
        if not self.offered:
            return f"Nothing in {where} matches the question: this answer is not grounded"
        if not self.sources:
            return (
                f"No passage of {where} fits the budget of {self.budget:,} tokens: this "
                "answer is not grounded"
            )
        n = len(self.sources)
        left = self.offered - n
        out = (
            f"Retrieval adds {self.tokens:,} tokens from {n} passage{'s' if n != 1 else ''} "
            f"(budget {self.budget:,})"
        )
        return out + (f"; {left} more did not fit" if left > 0 else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "sources": [s.to_dict() for s in self.sources],
            "tokens": self.tokens,
            "budget": self.budget,
            "offered": self.offered,
            "collections": list(self.collections),
        }

    @classmethod
    def from_dict(cls, d: Any) -> Grounding:
        """A stored or imported grounding; ValueError (one line) for one that is not."""
        if not isinstance(d, Mapping):
            raise ValueError("the sources of an answer must be an object")
        raw = d.get("sources", [])
        if not isinstance(raw, list):
            raise ValueError("'sources' must be a list")
        sources = tuple(Source.from_dict(s) for s in raw)
        cols = d.get("collections", [])
        offered = _whole(d.get("offered"))
        return cls(
            sources=sources,
            text=grounding_text(sources),
            tokens=_whole(d.get("tokens")) or 0,
            budget=_whole(d.get("budget")) or 0,
            offered=len(sources) if offered is None else offered,
            collections=tuple(str(c) for c in cols) if isinstance(cols, list) else (),
        )


def passage_text(s: Source) -> str:
    """One numbered passage as the model reads it."""
    where = f", {s.where}" if s.where else ""
    return f"[{s.number}] {s.name}{where}\n{s.text.strip()}"


def grounding_text(sources: Sequence[Source]) -> str:
    """The block for the prompt: the instructions, then each passage ("" for none)."""
    if not sources:
        return ""
    return "\n\n".join([INSTRUCTIONS, *(passage_text(s) for s in sources)])


def budget_for(n_ctx: int, max_tokens: int, used: int, share: float = DEFAULT_SHARE) -> int:
    """The tokens retrieval may add: `share` of the context, and never more than what leaves
    room for the conversation (`used`) and the answer (`max_tokens`)."""
    return max(0, min(int(n_ctx * share), n_ctx - max_tokens - used))


def approx_tokens(text: str) -> int:
    """A count without the model's tokenizer (a remote engine): 3.5 characters a token,
    rounded up, more than most text takes, so a budget is kept rather than overrun."""
    return math.ceil(len(text) / 3.5)


def ground(
    hits: Sequence[Hit],
    count_tokens: CountTokens,
    budget: int,
    *,
    collections: Sequence[str] = (),
    line_numbers: bool = True,
) -> Grounding:
    """Pick the hits (best first) whose passages fit `budget` tokens together with the
    instructions, number them in that order, and build the prompt's block. The same chunk
    found twice (the same span of the same file, e.g. in two collections) is used once.
    `line_numbers`: find the line each passage starts on in its file (text formats)."""
    distinct: list[Hit] = []
    seen: set[tuple[str, int, int]] = set()
    for h in hits:
        key = (str(h.path), h.start, h.end)
        if key not in seen:
            seen.add(key)
            distinct.append(h)
    chosen: list[Source] = []
    text, tokens = "", 0
    for h in distinct:
        if not h.text.strip():
            continue
        candidate = Source(
            number=len(chosen) + 1,
            path=str(h.path),
            page=h.page,
            heading=h.heading,
            start=h.start,
            end=h.end,
            line=line_of(h.path, h.start, h.text) if line_numbers else None,
            text=h.text,
        )
        trial = grounding_text([*chosen, candidate])
        n = count_tokens(trial)
        if n <= budget:
            chosen.append(candidate)
            text, tokens = trial, n
    return Grounding(
        sources=tuple(chosen),
        text=text,
        tokens=tokens,
        budget=budget,
        offered=len(distinct),
        collections=tuple(collections),
    )


def line_of(path: Path | str, start: int, passage: str) -> int | None:
    """The 1-based line of `start` in a text file, when the file still holds `passage` at
    that offset (its text read as the index read it); None for other formats or a file that
    changed or is gone."""
    from engine.rag.extract import ExtractError, extract

    p = Path(path)
    if p.suffix.lower() in _NO_LINES:
        return None
    try:
        text = extract(p).text
    except (ExtractError, OSError):
        return None
    if text[start : start + len(passage)] != passage:
        return None
    return text.count("\n", 0, start) + 1


__all__ = [
    "DEFAULT_K",
    "DEFAULT_SHARE",
    "INSTRUCTIONS",
    "CountTokens",
    "Grounding",
    "Source",
    "approx_tokens",
    "budget_for",
    "ground",
    "grounding_text",
    "line_of",
    "passage_text",
]
