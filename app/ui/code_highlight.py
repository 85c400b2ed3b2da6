"""Syntax highlighting of the chat's code blocks (Pygments), and inline code styling.

Colours follow the widget's palette: a light Pygments style on a light base, a dark one on a
dark base, chosen again when the palette changes. Pygments lexes the whole block (strings and
comments span lines); each Qt block then takes the spans that fall in it.
"""

from __future__ import annotations

import bisect
import functools

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.style import StyleMeta
from pygments.styles import get_style_by_name
from pygments.token import _TokenType
from pygments.util import ClassNotFound
from PySide6.QtGui import (
    QColor,
    QFont,
    QPalette,
    QSyntaxHighlighter,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFrameFormat,
    QTextTable,
)

LIGHT_STYLE = "default"
DARK_STYLE = "github-dark"


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Base).lightness() < 128


@functools.cache
def _lexer(lang: str) -> Lexer | None:
    if not lang:
        return None
    try:
        # Keep every character: the spans' offsets must match the document's.
        return get_lexer_by_name(lang, stripnl=False, stripall=False, ensurenl=False)
    except ClassNotFound:
        return None


@functools.cache
def _style(dark: bool) -> StyleMeta:
    try:
        return get_style_by_name(DARK_STYLE if dark else LIGHT_STYLE)
    except ClassNotFound:
        return get_style_by_name("monokai" if dark else "default")


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2  # Qt's positions count UTF-16 units


def _format(style: StyleMeta, token: _TokenType) -> QTextCharFormat | None:
    spec = style.style_for_token(token)
    if not (spec["color"] or spec["bold"] or spec["italic"]):
        return None
    fmt = QTextCharFormat()
    if spec["color"]:
        fmt.setForeground(QColor(f"#{spec['color']}"))
    if spec["bold"]:
        fmt.setFontWeight(QFont.Weight.Bold)
    if spec["italic"]:
        fmt.setFontItalic(True)
    return fmt


def spans(code: str, lang: str, dark: bool) -> list[tuple[int, int, QTextCharFormat]]:
    """(start, end, format) in UTF-16 offsets for the coloured tokens of `code`."""
    lexer = _lexer(lang)
    if lexer is None:
        return []
    style = _style(dark)
    out: list[tuple[int, int, QTextCharFormat]] = []
    pos = 0
    for token, value in lexer.get_tokens(code):
        n = _utf16_len(value)
        fmt = _format(style, token)
        if fmt is not None and n:
            out.append((pos, pos + n, fmt))
        pos += n
    return out


class CodeHighlighter(QSyntaxHighlighter):
    """Colours a code block's document by its fence's language."""

    def __init__(self, document: QTextDocument, lang: str, dark: bool) -> None:
        self._lang = lang
        self._dark = dark
        self._spans: list[tuple[int, int, QTextCharFormat]] = []
        self._starts: list[int] = []
        self._text: str | None = None  # what the spans were lexed from
        super().__init__(document)

    def configure(self, lang: str, dark: bool) -> None:
        if (lang, dark) != (self._lang, self._dark):
            self._lang, self._dark = lang, dark
            self._text = None
            self.rehighlight()

    def highlightBlock(self, text: str) -> None:
        # Keyed by the text itself: Qt may highlight blocks mid-edit at the same revision.
        text_now = self.document().toPlainText()
        if text_now != self._text:
            self._text = text_now
            self._spans = spans(text_now, self._lang, self._dark)
            self._starts = [s for s, _, _ in self._spans]
        start = self.currentBlock().position()
        end = start + len(text)  # `text` comes from Qt: its len is in UTF-16 units already
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        while i < len(self._spans) and self._spans[i][0] < end:
            s, e, fmt = self._spans[i]
            if e > start:
                lo, hi = max(s, start), min(e, end)
                self.setFormat(lo - start, hi - lo, fmt)
            i += 1


def style_inline_code(doc: QTextDocument, palette: QPalette) -> bool:
    """Give inline code (the fixed-pitch runs of a Markdown paragraph) a tinted background
    and the monospace font. Returns whether there was any."""
    tint = QColor(palette.color(QPalette.ColorRole.Text))
    tint.setAlpha(28)  # a faint shade of the text colour: visible on light and dark bases
    fmt = QTextCharFormat()
    fmt.setBackground(tint)
    fmt.setFontFamilies(["monospace"])
    fmt.setFontFixedPitch(True)
    found = False
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.isValid() and frag.charFormat().fontFixedPitch():
                cur = QTextCursor(doc)
                cur.setPosition(frag.position())
                cur.setPosition(frag.position() + frag.length(), QTextCursor.MoveMode.KeepAnchor)
                cur.mergeCharFormat(fmt)
                found = True
            it += 1
        block = block.next()
    return found


def style_tables(doc: QTextDocument, palette: QPalette) -> int:
    """Give Markdown tables thin borders in the palette's mid colour, room in their cells and
    a tinted header row (Qt's reader gives them a black 1 px grid). Returns how many."""
    tint = QColor(palette.color(QPalette.ColorRole.Text))
    tint.setAlpha(20)
    n = 0
    for frame in doc.rootFrame().childFrames():
        if not isinstance(frame, QTextTable):
            continue
        n += 1
        fmt = frame.format()
        fmt.setBorder(1)
        fmt.setBorderBrush(palette.color(QPalette.ColorRole.Mid))
        fmt.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
        fmt.setBorderCollapse(True)
        fmt.setCellPadding(5)
        fmt.setCellSpacing(0)
        fmt.setHeaderRowCount(1)
        frame.setFormat(fmt)
        for col in range(frame.columns()):
            cell = frame.cellAt(0, col)
            cell_fmt = cell.format()
            cell_fmt.setBackground(tint)
            cell.setFormat(cell_fmt)
    return n


__all__ = ["CodeHighlighter", "is_dark", "spans", "style_inline_code", "style_tables"]
