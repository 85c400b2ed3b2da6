"""An answer streaming in, as the sentences a voice speaks, each as soon as it is complete.

`SentenceSplitter.feed(delta)` takes the answer's text as it arrives and returns the sentences
that are ready; `flush()` the rest at the end. What is spoken is the answer's prose: Markdown
marks, code (fenced blocks, open across deltas too, and inline spans), citations ([1], [^1],
footnote definitions), bare URLs and a thinking block at the start are left out; a link is
its text. Abbreviations and decimals ("e.g.", "Dr.", "3.14") do not end a sentence; a very
long one is cut at a clause so the first words come early.

Every decision waits for the text it needs (the next character after a full stop, the close of
a bracket), so the sentences are the same however the answer was cut into deltas.
"""

from __future__ import annotations

import re

from engine.decoding.reasoning import KNOWN_MARKERS
from engine.speech.markdown_text import (
    BREAK_AFTER,
    BREAK_BEFORE,
    WHOLE_LINE,
    Fence,
    Kind,
    Line,
    classify,
    clean_inline,
    table_cells,
)

# A sentence's end: full stops and the like, with the quotes and brackets that close after
# them; CJK full stops need no space after them.
# (\u2019 a right single quote; \uff01, \uff1f, \uff09: fullwidth "!", "?", ")")
_END = re.compile("[.!?…]+[\"'”\u2019)\\]]*|[。\uff01\uff1f]+[」』”\uff09]*")
_CJK_END = frozenset("。\uff01\uff1f")
# Words before a full stop that do not end a sentence: titles and Latin abbreviations.
_WORDS = "mr mrs ms dr prof sr jr st mt vs cf e.g i.e a.k.a approx dept esp gen gov lt col capt"
ABBREVIATIONS = frozenset([*_WORDS.split(), "sgt", "rev", "hon"])
# ...and those that do not when a number follows ("No. 5", "Fig. 2", "p. 12").
BEFORE_NUMBER = frozenset(["no", "nos", "fig", "figs", "eq", "vol", "p", "pp", "ch", "sec", "ex"])
# Where a long sentence is cut: after a clause's punctuation, or around a dash.
_CLAUSE = re.compile("[,;:](?=\\s)|\\s[—\u2013-](?=\\s)")  # \u2013: an en dash
_SPACE_BEFORE = re.compile(r"\s+([,.;:!?…)\]])")
_EMPTY_BRACKETS = re.compile(r"\(\s*\)|\[\s*\]")


class SentenceSplitter:
    """Sentences to speak from an answer's text deltas.

    `in_thinking`: the answer starts inside a thinking block (its template opened it), so
    everything up to its close marker is left out. `max_chars`: a sentence longer than this
    is cut at its last clause (a comma, semicolon, colon or dash after `min_chars`), else at
    its last word; `first_max_chars` does the same for the first sentence, so speech starts
    soon after the answer does."""

    def __init__(
        self,
        *,
        in_thinking: bool = False,
        max_chars: int = 200,
        first_max_chars: int = 100,
        min_chars: int = 20,
    ) -> None:
        if not 0 < min_chars < min(max_chars, first_max_chars):
            raise ValueError("min_chars must be positive and below max_chars")
        self.max_chars = max_chars
        self.first_max_chars = first_max_chars
        self.min_chars = min_chars
        self._raw = ""  # the answer's text not consumed yet
        # Thinking: "start" (not known yet whether a block opens), "inside" it, "done".
        self._think = "inside" if in_thinking else "start"
        self._close: tuple[str, ...] = tuple(m.close for m in KNOWN_MARKERS)
        self._line: Line | None = None  # the current line's kind, once known
        self._pos = 0  # how much of the current line is spoken
        self._fence: Fence | None = None  # the code block open
        self._text = ""  # spoken text of the sentence being written
        self._said = 0  # sentences given so far

    def feed(self, delta: str) -> list[str]:
        """The sentences `delta` completes (often none)."""
        self._raw += delta.replace("\r", "")
        return self._run(final=False)

    def flush(self) -> list[str]:
        """The answer has ended: the sentences that remain."""
        out = self._run(final=True)
        out += self._sentences(final=True)
        self._raw = ""
        return out

    def _run(self, final: bool) -> list[str]:
        if self._think != "done" and not self._skip_thinking(final):
            return []
        out: list[str] = []
        while True:
            nl = self._raw.find("\n")
            ended = nl >= 0
            line = self._raw[:nl] if ended else self._raw
            complete = ended or final
            if self._line is None:
                kind = classify(line, complete, self._fence)
                if kind is None:
                    break
                self._line, self._pos = kind, kind.body
                if kind.kind in BREAK_BEFORE:
                    out += self._sentences(final=True)
            current = self._line
            if current.kind in WHOLE_LINE:
                if not complete:
                    break
                self._whole_line(current, line)
            else:
                spoken, used = clean_inline(line[self._pos :], complete)
                self._pos += used
                self._text += spoken
                out += self._sentences(final=False)
                if not complete:
                    break
            # The line has ended.
            self._text += " "
            if current.kind in BREAK_AFTER:
                out += self._sentences(final=True)
            self._line = None
            self._raw = self._raw[nl + 1 :] if ended else ""
            if not ended:
                break
        return out

    def _whole_line(self, line: Line, text: str) -> None:
        if line.kind is Kind.FENCE:
            self._fence = None if self._fence is not None else line.fence
        elif line.kind is Kind.TABLE:
            self._text += clean_inline(table_cells(text), True)[0]

    def _skip_thinking(self, final: bool) -> bool:
        """Leaves a thinking block at the start out; False while that is not decided."""
        if self._think == "start":
            lead = self._raw.lstrip()
            if not lead and not final:
                return False
            for markers in KNOWN_MARKERS:
                if lead.startswith(markers.open):
                    self._think, self._close = "inside", (markers.close,)
                    self._raw = lead[len(markers.open) :]
                    break
                if markers.open.startswith(lead) and not final:
                    return False  # "<thi" may become "<think>"
            else:
                self._think = "done"
                return True
        found = [(i, c) for c in self._close if (i := self._raw.find(c)) >= 0]
        if found:
            i, close = min(found)
            self._raw = self._raw[i + len(close) :]
            self._think = "done"
            return True
        keep = max(len(c) for c in self._close) - 1  # a marker cut between deltas
        self._raw = "" if final else self._raw[max(0, len(self._raw) - keep) :]
        return False

    def _sentences(self, final: bool) -> list[str]:
        """The sentences complete in the spoken text; with `final` (a break: a heading, a
        new list item, a blank line, the end), the rest too."""
        out: list[str] = []
        while (cut := self._cut(final)) is not None:
            self._said += self._take(cut, out)
        if final:
            self._said += self._take(len(self._text), out)
        return out

    def _take(self, cut: int, out: list[str]) -> int:
        sentence = _tidy(self._text[:cut])
        self._text = self._text[cut:]
        if not any(c.isalnum() for c in sentence):
            return 0  # nothing a voice says: "---", "()"
        out.append(sentence)
        return 1

    def _cut(self, final: bool) -> int | None:
        """Where the first sentence ends, None if no end is known yet."""
        text = self._text
        limit = self.max_chars if self._said else self.first_max_chars
        for m in _END.finditer(text):
            if m.start() > limit:
                break
            end = m.end()
            if m.group()[0] in _CJK_END:
                return end
            rest = text[end:]
            if rest and not rest[0].isspace():
                continue  # "3.14", "e.g.x"
            after = rest.lstrip()
            if not after:
                if final:
                    return end
                return None  # the next word decides
            if m.group()[0] == "." and _abbreviation(text[: m.start()], after):
                continue
            if after[0].islower():
                continue  # "approx. five"
            return end
        if len(text) > limit:
            return self._clause(text, limit)
        return None

    def _clause(self, text: str, limit: int) -> int:
        head = text[: limit + 1]
        clauses = [m.end() for m in _CLAUSE.finditer(head, self.min_chars)]
        if clauses:
            return clauses[-1]
        space = head.rfind(" ", self.min_chars)
        return space if space > 0 else limit


def _abbreviation(before: str, after: str) -> bool:
    words = before.split()
    if not words:
        return False
    word = words[-1].lstrip("(\"'“\u2018").lower()
    if word in ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
        return True  # "Dr. Who", "J. Smith"
    if word in BEFORE_NUMBER and after[0].isdigit():
        return True
    return bool(re.fullmatch(r"(?:[a-z]\.)+[a-z]", word))  # "e.g", "U.S", "a.m"


def _tidy(sentence: str) -> str:
    s = _EMPTY_BRACKETS.sub("", " ".join(sentence.split()))
    return " ".join(_SPACE_BEFORE.sub(r"\1", s).split())
