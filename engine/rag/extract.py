"""Text out of one file, with its pages and headings, through kept parsing libraries.

The libraries, and why these:

- PDF: `pypdf`, pure Python (no native build on any platform), maintained, reads encrypted
  files well enough to say so.
- DOCX: `python-docx`, the standard reader of Word's XML; paragraphs carry their style, so
  "Heading 1".."Heading 9" and "Title" give the headings.
- HTML: `selectolax` (the lexbor engine): a small wheel with no dependencies, an HTML5
  parser as browsers parse, and fast. The page readers (trafilatura, readability) guess the
  "main content" with heuristics and pull in lxml and more; a local document collection
  wants all of a page's text, with its headings, which a plain tree walk gives.
- Markdown: `markdown-it-py` (CommonMark); its heading tokens carry their source lines, so
  the document's text stays the file's own text and spans point into it.
- Plain text and source code: UTF-8, else the encoding `charset-normalizer` guesses.
- reStructuredText: the file's own text; a title is a line underlined (and perhaps
  overlined) with one repeated punctuation character, which a line pattern finds exactly.
  docutils would parse the whole document without source offsets.

Every failure on a bad file is an `ExtractError` whose message is one line for the user.
"""

from __future__ import annotations

import io
import os
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

import charset_normalizer
import docx
import pypdf
from docx.table import Table
from docx.text.paragraph import Paragraph
from markdown_it import MarkdownIt
from pypdf.errors import PdfReadError
from selectolax.lexbor import LexborHTMLParser, LexborNode

MARKDOWN = frozenset({".md", ".markdown"})
HTML = frozenset({".html", ".htm", ".xhtml"})
RST = frozenset({".rst"})
PLAIN = frozenset(
    {
        ".txt", ".text", ".log", ".csv", ".tsv",
        ".py", ".pyi", ".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx",
        ".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".m", ".mm",
        ".rs", ".go", ".java", ".kt", ".kts", ".scala", ".swift", ".cs", ".fs",
        ".rb", ".php", ".pl", ".lua", ".r", ".jl", ".dart", ".zig", ".nim",
        ".sh", ".bash", ".zsh", ".fish", ".ps1", ".bat",
        ".sql", ".css", ".scss", ".less", ".vue", ".svelte",
        ".toml", ".yaml", ".yml", ".json", ".jsonl", ".ini", ".cfg", ".conf", ".xml",
        ".tex", ".bib", ".org", ".adoc", ".proto", ".graphql", ".cmake", ".mk",
    }
)  # fmt: skip
SUPPORTED = MARKDOWN | HTML | RST | PLAIN | {".pdf", ".docx"}
# Text files known by their whole name rather than an extension.
PLAIN_NAMES = frozenset({"makefile", "dockerfile", "readme", "license", "changelog"})

# A text file in which more than this share of characters are control characters is binary
# data that a lenient decoder turned into characters.
MAX_CONTROL_SHARE = 0.05


@dataclass(frozen=True)
class Section:
    """A slice of a document's text that shares one page and one heading."""

    text: str
    page: int | None  # 1-based page (PDF), else None
    heading: str | None  # nearest heading above (Markdown/HTML/DOCX/reST), else None
    start: int  # char offset of `text` within the document's full text


@dataclass(frozen=True)
class Document:
    path: Path
    text: str  # the full extracted text; sections are slices of it
    sections: list[Section]


class ExtractError(Exception):
    """A file that gives no text; str(e) is one line for the user ("encrypted PDF", ...)."""


def supported(path: Path) -> bool:
    """Whether `extract` reads this kind of file, by its extension (or whole name)."""
    suffix = path.suffix.lower()
    return suffix in SUPPORTED or (not suffix and path.name.lower() in PLAIN_NAMES)


def extract(path: Path) -> Document:
    """The text of one file, in sections; raises ExtractError, never else, for bad files."""
    if not supported(path):
        raise ExtractError("not a supported format")
    data = _read_stable(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".pdf":
            parts = _pdf(data)
        elif suffix == ".docx":
            parts = _docx(data)
        elif suffix in HTML:
            parts = _html(_decode(data))
        else:
            text = _decode(data)
            if suffix in MARKDOWN:
                return Document(path, text, _markdown_sections(text))
            if suffix in RST:
                return Document(path, text, _rst_sections(text))
            return Document(path, text, _whole(text))
    except ExtractError:
        raise
    except Exception as e:  # a parser's own failure on a malformed file
        raise ExtractError(f"unreadable {_kind(suffix)} ({_one_line(e)})") from e
    return _joined(path, parts)


def _read_stable(path: Path) -> bytes:
    """The file's bytes, refusing a file that changes while it is read."""
    try:
        before = os.stat(path)
        if not stat.S_ISREG(before.st_mode):
            raise ExtractError("not a regular file")
        with open(path, "rb") as f:
            data = f.read()
        after = os.stat(path)
    except FileNotFoundError as e:
        raise ExtractError("file disappeared") from e
    except PermissionError as e:
        raise ExtractError("permission denied") from e
    except OSError as e:
        raise ExtractError(f"cannot read ({_one_line(e)})") from e
    same = (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns)
    if not same or len(data) != after.st_size:
        raise ExtractError("changed while being read")
    return data


def _decode(data: bytes) -> str:
    """Text from bytes: UTF-8, else a guessed encoding; binary data is refused."""
    if b"\x00" in data:
        raise ExtractError("binary file with a text extension")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        best = charset_normalizer.from_bytes(data).best()
        if best is None:
            raise ExtractError("binary file with a text extension") from None
        text = str(best)
    control = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r\f")
    if text and control / len(text) > MAX_CONTROL_SHARE:
        raise ExtractError("binary file with a text extension")
    # One line ending everywhere, so offsets mean the same for every file.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _kind(suffix: str) -> str:
    return {".pdf": "PDF", ".docx": "DOCX"}.get(suffix, "HTML" if suffix in HTML else "file")


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:117] + "...") if len(text) > 120 else (text or type(e).__name__)


def _whole(text: str) -> list[Section]:
    return [Section(text, None, None, 0)] if text.strip() else []


# A part is (text, page, heading) before the parts are joined into one document text.
_Part = tuple[str, int | None, str | None]


def _joined(path: Path, parts: list[_Part]) -> Document:
    """One document from its parts, each a section, separated by a blank line."""
    pieces: list[str] = []
    sections: list[Section] = []
    offset = 0
    for text, page, heading in parts:
        text = text.strip()
        if not text:
            continue
        if pieces:
            pieces.append("\n\n")
            offset += 2
        sections.append(Section(text, page, heading, offset))
        pieces.append(text)
        offset += len(text)
    return Document(path, "".join(pieces), sections)


def _pdf(data: bytes) -> list[_Part]:
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
    except PdfReadError as e:
        raise ExtractError(f"corrupt PDF ({_one_line(e)})") from e
    if reader.is_encrypted:
        # Many PDFs are "encrypted" only against editing, with an empty password to open.
        try:
            opened = reader.decrypt("")
        except Exception as e:  # a cipher pypdf cannot do without extra packages
            raise ExtractError("encrypted PDF") from e
        if not opened:
            raise ExtractError("encrypted PDF (needs a password)")
    parts: list[_Part] = []
    for number, page in enumerate(reader.pages, start=1):
        parts.append((page.extract_text() or "", number, None))
    if not any(text.strip() for text, _, _ in parts):
        raise ExtractError("PDF has no text (scanned pages need OCR)")
    return parts


def _docx(data: bytes) -> list[_Part]:
    try:
        document = docx.Document(io.BytesIO(data))
    except (zipfile.BadZipFile, KeyError, ValueError) as e:
        raise ExtractError("corrupt DOCX (not a Word document)") from e
    parts: list[_Part] = []
    heading: str | None = None
    lines: list[str] = []

    def flush() -> None:
        if lines:
            parts.append(("\n\n".join(lines), None, heading))
            lines.clear()

    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            text = block.text.strip()
            style = block.style.name if block.style is not None else ""
            if text and style and (style.startswith("Heading") or style == "Title"):
                flush()
                heading = text
            if text:
                lines.append(text)
        elif isinstance(block, Table):
            rows = [" | ".join(c.text.strip() for c in row.cells) for row in block.rows]
            lines.append("\n".join(r for r in rows if r.strip(" |")))
    flush()
    return parts


# Elements whose text is never document text.
_HTML_DROP = ["script", "style", "noscript", "template", "svg", "head", "iframe", "object"]
_HTML_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
# Elements that end a paragraph: their text is not run together with their neighbours'.
_HTML_BLOCKS = frozenset(
    {
        "p", "div", "section", "article", "main", "aside", "header", "footer", "nav",
        "ul", "ol", "li", "dl", "dt", "dd", "table", "tr", "td", "th", "thead", "tbody",
        "blockquote", "pre", "figure", "figcaption", "hr", "br", "form", "fieldset",
        "address", "details", "summary", "body", "html",
    }
)  # fmt: skip


def _html(markup: str) -> list[_Part]:
    tree = LexborHTMLParser(markup)
    title_node = tree.css_first("title")
    title = " ".join(title_node.text().split()) if title_node is not None else ""
    tree.strip_tags(_HTML_DROP)
    root = tree.body or tree.root
    parts: list[_Part] = []
    heading: str | None = title or None
    paragraphs: list[str] = []
    # Raw text of the paragraph so far: inline markup ("wo<b>rd</b>") adds no space.
    run: list[str] = []

    def end_paragraph() -> None:
        text = " ".join("".join(run).split())
        if text:
            paragraphs.append(text)
        run.clear()

    def end_section() -> None:
        end_paragraph()
        if paragraphs:
            parts.append(("\n\n".join(paragraphs), None, heading))
            paragraphs.clear()

    def visit(node: LexborNode) -> None:
        nonlocal heading
        for child in node.iter(include_text=True):
            if child.is_text_node:
                run.append(child.text_content or "")
                continue
            tag = child.tag or ""
            if tag in _HTML_HEADINGS:
                end_section()
                heading = " ".join(child.text().split()) or heading
                if heading:
                    paragraphs.append(heading)
            elif tag == "pre":
                end_paragraph()
                paragraphs.append(child.text().strip("\n"))
            elif tag in _HTML_BLOCKS:
                end_paragraph()
                visit(child)
                end_paragraph()
            else:
                visit(child)

    if root is not None:
        visit(root)
    end_section()
    return parts


def _markdown_sections(text: str) -> list[Section]:
    """Sections of a Markdown text, each from a heading to the next, by markdown-it tokens."""
    lines = text.splitlines(keepends=True)
    line_starts = [0]
    for line in lines:
        line_starts.append(line_starts[-1] + len(line))
    tokens = MarkdownIt("commonmark").parse(text)
    cuts: list[tuple[int, str | None]] = [(0, None)]
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and token.map is not None:
            inline = tokens[i + 1]
            cuts.append((line_starts[token.map[0]], inline.content.strip() or None))
    return _sections_at(text, cuts)


# A reST title: text underlined by one repeated punctuation character at least as long.
_RST_PUNCT = r"[!-/:-@\[-`{-~]"
_RST_TITLE = re.compile(
    rf"^(?:({_RST_PUNCT})\1{{2,}}\n)?(?P<title>\S.*?)[ \t]*\n"
    rf"(?P<rule>({_RST_PUNCT})\4{{2,}})[ \t]*$",
    re.MULTILINE,
)


def _rst_sections(text: str) -> list[Section]:
    cuts: list[tuple[int, str | None]] = [(0, None)]
    for m in _RST_TITLE.finditer(text):
        title = m.group("title")
        if len(m.group("rule")) >= len(title) and not _RST_TITLE_NOT.match(title):
            cuts.append((m.start(), title.strip()))
    return _sections_at(text, cuts)


# Lines that an underline follows but that are not titles (a table border, a transition).
_RST_TITLE_NOT = re.compile(r"^([!-/:-@\[-`{-~])\1*$")


def _sections_at(text: str, cuts: list[tuple[int, str | None]]) -> list[Section]:
    """Sections of `text` cut at the given offsets, each with its heading, blank ones left out."""
    sections: list[Section] = []
    ends = [start for start, _ in cuts[1:]] + [len(text)]
    for (start, heading), end in zip(cuts, ends, strict=True):
        piece = text[start:end]
        stripped = piece.strip()
        if not stripped:
            continue
        lead = len(piece) - len(piece.lstrip())
        sections.append(Section(stripped, None, heading, start + lead))
    return sections
