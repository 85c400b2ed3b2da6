"""What of an answer's Markdown is spoken: its lines classified (headings, list items, quotes,
tables, code fences, rules, footnote definitions) and a line's inline text cleaned (emphasis
marks, code spans, links, citations, bare URLs, HTML tags dropped).

Both work on text that is still arriving: a decision that needs text not yet seen answers
"wait" (None, or a shorter consumed prefix), never a guess, so the spoken result is the same
however the answer was cut into deltas. Markdown parsers (markdown-it) need the whole
document; speech must start at the first sentence, so this reads the few constructs an answer
uses, line by line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    TEXT = "text"  # a paragraph's line, or a continuation of a list item
    ITEM = "item"  # a list item: starts a new sentence
    QUOTE = "quote"
    HEADING = "heading"  # a sentence of its own
    TABLE = "table"  # a row: its cells, a sentence of their own
    BLANK = "blank"
    FENCE = "fence"  # a code fence opens (or closes, inside one)
    CODE = "code"  # a line inside a fenced block: not spoken
    SKIP = "skip"  # a rule, a table's separator row, a footnote or link definition


# Kinds that start a new sentence, and those whose line ends one.
BREAK_BEFORE = frozenset(Kind) - {Kind.TEXT}
BREAK_AFTER = frozenset({Kind.HEADING, Kind.TABLE, Kind.BLANK, Kind.FENCE, Kind.CODE, Kind.SKIP})
# Kinds decided only on the whole line.
WHOLE_LINE = frozenset({Kind.TABLE, Kind.FENCE, Kind.CODE, Kind.SKIP, Kind.BLANK})


@dataclass(frozen=True)
class Fence:
    char: str
    length: int

    def closes(self, line: str) -> bool:
        s = line.strip()
        return len(s) >= self.length and s == self.char * len(s)


@dataclass(frozen=True)
class Line:
    kind: Kind
    body: int = 0  # where the spoken text starts in the line
    fence: Fence | None = None  # the fence a FENCE line opens


_FENCE = re.compile(r"(`{3,}|~{3,})")
_HEADING = re.compile(r"#{1,6}(?=[ \t]|$)")
_RULE = re.compile(r"([-*_])(?:[ \t]*\1)*[ \t]*")
_BULLET = re.compile(r"[-*+][ \t]+")
_ORDERED = re.compile(r"\d{1,3}[.)][ \t]+")
_ORDERED_PREFIX = re.compile(r"\d{1,3}[.)]?")
_QUOTE = re.compile(r"(?:>[ \t]*)+")
_DEFINITION = re.compile(r"\[[^\]]*\]:")
_TABLE_SEPARATOR = re.compile(r"[\s|:-]+")


def classify(line: str, complete: bool, fence: Fence | None) -> Line | None:
    """The kind of `line` (without its newline), or None while what has arrived of it cannot
    tell. `complete`: the line has ended. `fence`: the code block the line is inside."""
    if fence is not None:
        if not complete:
            return None
        return Line(Kind.FENCE) if fence.closes(line) else Line(Kind.CODE)
    s = line.lstrip(" \t")
    indent = len(line) - len(s)
    if not s:
        return Line(Kind.BLANK) if complete else None
    if not complete and s in ("`", "``", "~", "~~", "+", "*", "-", "_"):
        return None
    if m := _FENCE.match(s):
        if m.end() == len(s) and not complete:
            return None  # the fence's length is not known yet
        return Line(Kind.FENCE, fence=Fence(s[0], m.end()))
    if m := _HEADING.match(s):
        if m.end() == len(s) and not complete:
            return None  # "##" may become "##x", which is text
        return Line(Kind.HEADING, indent + m.end())
    if s[0] == "#" and not complete and len(s) <= 6 and s == "#" * len(s):
        return None
    if _RULE.fullmatch(s):
        if not complete:
            return None  # "- -" may be a rule or an item
        if sum(c in "-*_" for c in s) >= 3:
            return Line(Kind.SKIP)
    if m := _BULLET.match(s) or _ORDERED.match(s):
        if m.end() == len(s) and not complete:
            return None
        return Line(Kind.ITEM, indent + m.end())
    if not complete and _ORDERED_PREFIX.fullmatch(s):
        return None  # "12" may become "12. item"
    if m := _QUOTE.match(s):
        if m.end() == len(s) and not complete:
            return None
        return Line(Kind.QUOTE, indent + m.end())
    if s[0] == "|":
        if not complete:
            return None
        return Line(Kind.SKIP if _TABLE_SEPARATOR.fullmatch(s) else Kind.TABLE)
    if s[0] == "[":
        close = s.find("]")
        if close < 0 or close == len(s) - 1:
            if not complete:
                return None
        elif _DEFINITION.match(s):
            return Line(Kind.SKIP)
    return Line(Kind.TEXT, indent)


def table_cells(line: str) -> str:
    """A table row's cells, as a list a voice reads ("a, b, c")."""
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    return ", ".join(c for c in cells if c)


# A citation in brackets: [1], [1, 2], [1-3], and footnote references [^1], [^note].
_CITATION = re.compile("\\^[^\\]]+|\\d+(?:\\s*[,\u2013-]\\s*\\d+)*")  # \u2013: an en dash
_URL_START = re.compile(r"https?://|www\.", re.IGNORECASE)
# A URL's last character: never the sentence's punctuation after it.
_URL_TAIL = re.compile(r"[.,;:!?)\]'\"]+$")
_TAG = re.compile(r"/?[A-Za-z][\w-]*(?:\s[^<>]*)?/?|https?://[^<>\s]+|[^<>\s@]+@[^<>\s@]+")


def clean_inline(text: str, complete: bool) -> tuple[str, int]:
    """The spoken text of `text`'s first `n` characters, and `n`.

    Without `complete` (more of the line may come), `n` is the last cut after whitespace
    where nothing is open (a code span, a bracket, a URL, a mark whose neighbour is unseen):
    every decision before it depends on that prefix alone, so cleaning the rest later gives
    the same text as cleaning the whole."""
    out: list[str] = []
    safe_out, safe_n = 0, 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            out.append(" ")
            i += 1
            safe_out, safe_n = len(out), i
            continue
        step = _construct(text, i, complete)
        if step is None:
            return "".join(out[:safe_out]), safe_n
        spoken, i = step
        out.append(spoken)
    if complete:
        return "".join(out), n
    return "".join(out[:safe_out]), safe_n


def _construct(text: str, i: int, complete: bool) -> tuple[str, int] | None:
    """What is spoken of the construct at `i`, and where it ends; None: not decidable yet."""
    c = text[i]
    n = len(text)
    if c == "`":
        return _code_span(text, i, complete)
    if c == "[" or (c == "!" and text.startswith("[", i + 1)):
        return _bracket(text, i, complete)
    if c == "<":
        close = text.find(">", i)
        if close < 0:
            if not complete and i + 1 < n and not text[i + 1].isspace():
                return None
            return "<", i + 1
        return ("", close + 1) if _TAG.fullmatch(text[i + 1 : close]) else ("<", i + 1)
    if (i == 0 or not text[i - 1].isalnum()) and _URL_START.match(text, i):
        end = i
        while end < n and not text[end].isspace():
            end += 1
        if end == n and not complete:
            return None
        tail = _URL_TAIL.search(text[i:end])
        return (tail.group() if tail else ""), end
    if c in "*_~":
        end = i
        while end < n and text[end] == c:
            end += 1
        if end == n and not complete:
            return None
        left = text[i - 1] if i else " "
        right = text[end] if end < n else " "
        if c == "*" and left.isspace() and right.isspace():
            return text[i:end], end  # "2 * 3"
        if c == "_" and left.isalnum() and right.isalnum():
            return text[i:end], end  # snake_case
        return "", end
    return c, i + 1


def _code_span(text: str, i: int, complete: bool) -> tuple[str, int] | None:
    n = len(text)
    end = i
    while end < n and text[end] == "`":
        end += 1
    if end == n and not complete:
        return None
    ticks = end - i
    j = end
    while True:
        j = text.find("`" * ticks, j)
        if j < 0:
            if not complete:
                return None
            return "", end  # no closing run on the line: the backticks alone are dropped
        k = j + ticks
        if k == n and not complete:
            return None  # the run may go on
        if (k < n and text[k] == "`") or text[j - 1] == "`":
            while k < n and text[k] == "`":
                k += 1
            j = k
            continue
        return "", k


def _bracket(text: str, i: int, complete: bool) -> tuple[str, int] | None:
    image = text[i] == "!"
    start = i + 1 if image else i
    depth, j, n = 0, start, len(text)
    while j < n:
        if text[j] == "[":
            depth += 1
        elif text[j] == "]":
            depth -= 1
            if depth == 0:
                break
        j += 1
    if j >= n:
        if not complete:
            return None
        return ("!" if image else ""), start + 1  # an unmatched bracket: spoken without it
    inner = text[start + 1 : j]
    end = j + 1
    if end == n and not complete:
        return None  # a link's target may follow
    if end < n and text[end] in "([":
        close = text.find(")" if text[end] == "(" else "]", end)
        if close < 0:
            if not complete:
                return None
        else:
            end = close + 1
    if image or _CITATION.fullmatch(inner.strip()):
        return "", end
    spoken, _ = clean_inline(inner, True)
    return spoken, end
