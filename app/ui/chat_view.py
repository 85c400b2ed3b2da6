"""The chat: messages rendered as Markdown (code blocks with a Copy button, tables), the
user's as bubbles on the right and answers as full-width text under an avatar line; a
welcome with example prompts while the chat is empty (app/ui/welcome.py); and the composer
(app/ui/composer.py): Enter sends, Shift+Enter starts a new line, Send turns into Stop.

A message's actions show while it is hovered or has the keyboard focus; a focused message
answers keys (Up/Down, Enter for its menu, Ctrl+C, E, R, Delete: `MessageWidget`).

The view follows a `ChatModel` through its signals. While a reply streams only the last
Markdown segment of the last message is re-rendered, so the cost of an update stays small
however long the reply grows.

Edit turns a message into a text box in place (`app/ui/message_editor.py`); saving it asks
for a new version of the message (`edit_requested`), as the controller's branches have it.

A reasoning model's thinking is a `ThinkingBlock` above its answer: open while the model
thinks, folded to one line ("Thought for 3.2 s · 140 tokens") once the answer starts, and
opened again with a click. A structured answer (JSON) is shown pretty-printed in a JSON code
block.

Images and audio are attached with the Attach button, by dropping files on the input or by
pasting a picture or file links into it (app/ui/attacher.py); they wait in a tray of
thumbnails above the input until sent, and a sent message shows its own.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from PySide6.QtCore import (
    QEvent,
    QModelIndex,
    QPersistentModelIndex,
    QRectF,
    QSize,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import (
    QColor,
    QContextMenuEvent,
    QCursor,
    QEnterEvent,
    QFocusEvent,
    QFont,
    QFontDatabase,
    QGuiApplication,
    QHideEvent,
    QKeyEvent,
    QKeySequence,
    QPainter,
    QPaintEvent,
    QPalette,
    QPen,
    QResizeEvent,
    QShowEvent,
    QTextCursor,
    QTextDocument,
    QTextOption,
    QTextTable,
)
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QGraphicsOpacityEffect,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.ui.attacher import Attacher
from app.ui.attachment_tray import AttachmentReader, AttachmentStrip
from app.ui.chat_model import ChatModel
from app.ui.citations import SourcesBlock
from app.ui.code_highlight import CodeHighlighter, is_dark, style_inline_code, style_tables
from app.ui.composer import Composer, CountTokens
from app.ui.context_meter import ContextMeterView, SummaryBlock
from app.ui.conversation import Message
from app.ui.message_editor import MessageEditor
from app.ui.prose_label import ProseLabel, hint_at_own_width
from app.ui.scroll_guard import guard_layout_requests
from app.ui.streaming_prose import StreamingProse
from app.ui.tool_blocks import ToolCallBlock, ToolResultBlock
from app.ui.voice_input import VoiceInput
from app.ui.welcome import WelcomePane
from engine.host.stats import GenerationStats

_FENCE = re.compile(r"^ {0,3}(```|~~~)\s*([\w+#.-]*)\s*$")


@dataclass(frozen=True)
class Segment:
    kind: str  # "text" | "code" | "table"
    text: str
    lang: str = ""


def split_markdown(text: str) -> list[Segment]:
    """Split Markdown into prose paragraphs, fenced code blocks and tables. An unclosed fence
    (a reply still streaming) is code up to the end.

    Prose is cut at blank lines so that, while a reply streams, only its last paragraph is
    laid out again; earlier ones keep their cached layout. A GFM table (a row with pipes over
    a delimiter row) is its own segment: Qt's Markdown reader renders it (`TableBlock`), but
    in a word-wrapped label a wide table would widen the whole chat. Only where a table
    starts and ends is decided here; its cells are parsed by Qt.
    """
    out: list[Segment] = []
    buf: list[str] = []
    fence: str | None = None
    lang = ""
    table = False
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if table:
            if line.strip() and "|" in line:
                buf.append(line)
                continue
            out.append(Segment("table", "\n".join(buf)))
            buf, table = [], False
        m = _FENCE.match(line)
        if fence is None and not line.strip():
            if any(s.strip() for s in buf) and not _open_list_item(buf):
                out.append(Segment("text", "\n".join(buf)))
                buf = []
            elif buf:
                buf.append(line)
            continue
        if fence is None and m:
            if any(s.strip() for s in buf):
                out.append(Segment("text", "\n".join(buf)))
            buf, fence, lang = [], m.group(1), m.group(2)
        elif fence is None and _table_starts(lines, i) and not _open_list_item(buf):
            if any(s.strip() for s in buf):
                out.append(Segment("text", "\n".join(buf)))
            buf, table = [line], True
        elif fence is not None and m and m.group(1) == fence and not m.group(2):
            out.append(Segment("code", "\n".join(buf), lang))
            buf, fence, lang = [], None, ""
        else:
            buf.append(line)
    if fence is not None:
        out.append(Segment("code", "\n".join(buf), lang))
    elif table:
        out.append(Segment("table", "\n".join(buf)))
    elif buf and any(s.strip() for s in buf):
        out.append(Segment("text", "\n".join(buf)))
    return out


# A GFM table's delimiter row: cells of dashes, optionally with colons, between pipes.
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def _table_starts(lines: list[str], i: int) -> bool:
    if i + 1 >= len(lines) or "|" not in lines[i]:
        return False
    rule = lines[i + 1]
    return "|" in rule and _TABLE_RULE.match(rule) is not None


_LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")


def _open_list_item(lines: list[str]) -> bool:
    """A loose list (items separated by blank lines) stays one segment, so its numbering and
    indentation render as one list."""
    return any(_LIST_ITEM.match(s) for s in lines)


def json_display(text: str, *, complete: bool = True) -> str:
    """A structured (JSON) answer as Markdown: a JSON code block, pretty-printed with an
    indent of 2 once the whole answer parses; as it came while it streams (or if it does not
    parse: an answer cut off by the length limit)."""
    shown = text
    if complete:
        with contextlib.suppress(ValueError, RecursionError):
            shown = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    return f"```json\n{shown}\n```" if shown else ""


def thinking_summary(message: Message) -> str:
    """The thinking block's one line: how long and how many tokens, once it has closed."""
    stats = message.stats
    thought = message.thought
    if stats is not None and stats.thinking_tokens:
        thought = (stats.thinking_tokens, stats.thinking_s)
    if thought is not None:
        tokens, seconds = thought
        return f"Thought for {seconds:.1f} s · {tokens:,} token{'s' if tokens != 1 else ''}"
    if message.state == "streaming":
        return "Thinking…"
    if message.state in ("interrupted", "error", "stopped"):
        return "Thinking (cut off)"
    return "Thought"  # figures unknown (an imported answer)


def format_stats(stats: GenerationStats) -> str:
    parts = [
        f"TTFT {stats.ttft_s:.2f} s",
        f"{stats.gen_tps:.1f} tok/s",
        f"{stats.gen_tokens} tokens",
    ]
    if stats.stop_reason == "cancelled":
        parts.append("stopped")
    elif stats.stop_reason == "length":
        parts.append("length limit")
    elif stats.stop_reason == "context_full":
        parts.append("context full")
    if measured_on_client(stats):
        parts.append("measured here")
    return " · ".join(parts)


def measured_on_client(stats: GenerationStats) -> bool:
    return stats.measured_on == "client"


USAGE_NAMES = {"prompt_tokens": "prompt tokens", "gen_tokens": "answer tokens"}


def stats_tooltip(stats: GenerationStats) -> str:
    """Where the footer's numbers come from."""
    if not measured_on_client(stats):
        return "Measured by the engine (llama.cpp counters)."
    usage = [USAGE_NAMES.get(u, u) for u in stats.server_usage]
    source = (
        f"From the server's usage report: {' and '.join(usage)}."
        if usage
        else "The server sent no usage report: answer tokens are the chunks received."
    )
    return (
        "Measured on this computer from the stream: time to first token and tokens/s "
        f"from when the chunks arrived, so they include the network. {source}"
    )


class CodeBlock(QFrame):
    def __init__(self, code: str, lang: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setObjectName("codeBlock")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 4, 6, 6)
        lay.setSpacing(2)
        head = QHBoxLayout()
        self.lang_label = QLabel(lang or "code")
        self.lang_label.setEnabled(False)  # dimmed, from the palette
        self.copy_button = QToolButton()
        self.copy_button.setText("Copy")
        self.copy_button.setAccessibleName("Copy code")
        self.copy_button.setToolTip("Copy this code block to the clipboard")
        self.copy_button.clicked.connect(self.copy)
        # Puts "Copy" back after a moment; a child timer dies with the block.
        self._reset = QTimer(self)
        self._reset.setSingleShot(True)
        self._reset.setInterval(1500)
        self._reset.timeout.connect(lambda: self.copy_button.setText("Copy"))
        head.addWidget(self.lang_label)
        head.addStretch(1)
        head.addWidget(self.copy_button)
        lay.addLayout(head)
        self.editor = QPlainTextEdit()
        self.editor.setReadOnly(True)
        self.editor.setAccessibleName("Code")
        self.editor.setWordWrapMode(QTextOption.WrapMode.NoWrap)
        self.editor.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.editor.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        lay.addWidget(self.editor)
        self._lang = lang
        self.highlighter = CodeHighlighter(self.editor.document(), lang, is_dark(self.palette()))
        self.set_code(code, lang)

    @property
    def code(self) -> str:
        return self.editor.toPlainText()

    def set_code(self, code: str, lang: str) -> None:
        self.lang_label.setText(lang or "code")
        self._lang = lang
        self.highlighter.configure(lang, is_dark(self.palette()))
        if code != self.editor.toPlainText():
            self.editor.setPlainText(code)
        lines = max(1, code.count("\n") + 1)
        fm = self.editor.fontMetrics()
        frame = 2 * self.editor.frameWidth() + 8
        bar = self.editor.horizontalScrollBar().sizeHint().height()
        self.editor.setFixedHeight(lines * fm.lineSpacing() + frame + bar)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code)
        self.copy_button.setText("Copied")
        self._reset.start()

    def changeEvent(self, e: QEvent) -> None:
        if e.type() == QEvent.Type.PaletteChange:  # light <-> dark: the other style
            self.highlighter.configure(self._lang, is_dark(self.palette()))
        super().changeEvent(e)

    def showEvent(self, e: QShowEvent) -> None:
        # A block made before it had a parent saw the default palette, not the one it
        # inherits now (no PaletteChange comes for that).
        self.highlighter.configure(self._lang, is_dark(self.palette()))
        super().showEvent(e)

    def hideEvent(self, e: QHideEvent) -> None:
        self._reset.stop()
        self.copy_button.setText("Copy")
        super().hideEvent(e)


class TableBlock(QTextBrowser):
    """A Markdown table as Qt's Markdown reader renders it (a `QTextTable`), styled from the
    palette. As tall as the table; a table wider than the chat scrolls sideways on its own
    instead of widening the conversation."""

    def __init__(self, markdown: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("tableBlock")
        self.setAccessibleName("Table")
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setOpenExternalLinks(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.viewport().setAutoFillBackground(False)  # on the message's background
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.document().setDocumentMargin(1)
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self.horizontalScrollBar().rangeChanged.connect(self._fit_height)
        self._markdown = ""
        self.set_markdown(markdown)

    @property
    def markdown(self) -> str:
        return self._markdown

    def tables(self) -> list[QTextTable]:
        frames = self.document().rootFrame().childFrames()
        return [f for f in frames if isinstance(f, QTextTable)]

    def set_markdown(self, text: str) -> None:
        if text != self._markdown:
            self._markdown = text
            self._fill()

    def _fill(self) -> None:
        doc = self.document()
        doc.setMarkdown(self._markdown)
        style_tables(doc, self.palette())
        if "`" in self._markdown:
            style_inline_code(doc, self.palette())
        self._fit_height()

    def _fit_height(self, *_: object) -> None:
        height = math.ceil(self.document().size().height()) + 2 * self.frameWidth()
        bar = self.horizontalScrollBar()
        if bar.maximum() > 0:
            height += bar.sizeHint().height()
        if height != self.height() or self.minimumHeight() != height:
            self.setFixedHeight(height)

    def sizeHint(self) -> QSize:
        return QSize(math.ceil(self.document().idealWidth()) + 4, self.height())

    def minimumSizeHint(self) -> QSize:
        return QSize(8 * self.fontMetrics().averageCharWidth(), self.height())

    def changeEvent(self, e: QEvent) -> None:
        super().changeEvent(e)
        if e.type() == QEvent.Type.PaletteChange and self._markdown:
            self._fill()


class MarkdownBody(QWidget):
    """Prose segments as Markdown labels, code segments as `CodeBlock`s. `dim`: prose in the
    palette's placeholder colour (a model's thinking, set apart from its answer)."""

    def __init__(self, parent: QWidget | None = None, *, dim: bool = False) -> None:
        super().__init__(parent)
        self._dim = dim
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.setSpacing(6)
        self._segments: list[Segment] = []
        self._widgets: list[QWidget] = []

    @property
    def widgets(self) -> list[QWidget]:
        return list(self._widgets)

    def sizeHint(self) -> QSize:
        return hint_at_own_width(self) or super().sizeHint()

    def set_markdown(self, text: str, *, streaming: bool = False) -> None:
        """Show `text`. `streaming`: it is still being written, and its last paragraph is
        drawn by a `StreamingProse` (laid out once per update) until it is finished."""
        segs = split_markdown(text)
        for i, seg in enumerate(segs):
            growing = streaming and i == len(segs) - 1 and seg.kind == "text"
            kind = _widget_kind(seg, growing)
            fits = i < len(self._widgets) and isinstance(self._widgets[i], kind)
            if fits and self._segments[i] == seg:
                continue  # unchanged: most of a streaming reply
            if fits:
                self._update(self._widgets[i], seg)
            else:
                w = self._make(seg, growing)
                if i < len(self._widgets):
                    old = self._widgets[i]
                    self._lay.replaceWidget(old, w)
                    old.hide()  # stops what it has running before it goes
                    old.deleteLater()
                    self._widgets[i] = w
                else:
                    self._lay.addWidget(w)
                    self._widgets.append(w)
        for w in self._widgets[len(segs) :]:
            self._lay.removeWidget(w)
            w.hide()
            w.deleteLater()
        del self._widgets[len(segs) :]
        self._segments = segs

    def _make(self, seg: Segment, growing: bool = False) -> QWidget:
        if seg.kind == "code":
            return CodeBlock(seg.text, seg.lang)
        if seg.kind == "table":
            return TableBlock(seg.text)
        if growing:
            prose = StreamingProse()
            if self._dim:
                prose.setForegroundRole(QPalette.ColorRole.PlaceholderText)
            prose.setText(seg.text)
            return prose
        label = ProseLabel()
        if self._dim:
            label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        label.setTextFormat(Qt.TextFormat.MarkdownText)
        label.setWordWrap(True)
        label.setOpenExternalLinks(True)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        # Keep the word-wrap label's own policy (Preferred, height-for-width). A "Minimum"
        # vertical policy made its sizeHint height (laid out ~280 px wide) its minimum: the
        # messages' minimums then added up to far more than their height at the real width,
        # the scroll area sized the list by them, and the surplus went to the trailing
        # stretch, a blank region where auto-scroll landed.
        _set_prose(label, seg.text)
        return label

    def _update(self, w: QWidget, seg: Segment) -> None:
        if isinstance(w, CodeBlock):
            w.set_code(seg.text, seg.lang)
        elif isinstance(w, TableBlock):
            w.set_markdown(seg.text)
        elif isinstance(w, StreamingProse):
            w.setText(seg.text)
        elif isinstance(w, QLabel):
            _set_prose(w, seg.text)

    def changeEvent(self, e: QEvent) -> None:
        if e.type() == QEvent.Type.PaletteChange:  # inline code's tint follows the palette
            for w, seg in zip(self._widgets, self._segments, strict=False):
                if isinstance(w, QLabel) and "`" in seg.text:
                    _set_prose(w, seg.text)
        super().changeEvent(e)


def _widget_kind(seg: Segment, growing: bool) -> type[QWidget]:
    if seg.kind == "code":
        return CodeBlock
    if seg.kind == "table":
        return TableBlock
    return StreamingProse if growing else ProseLabel


def _set_prose(label: QLabel, text: str) -> None:
    """Markdown as Qt renders it; a paragraph with inline code goes through a document whose
    code runs get a tinted background (Qt's Markdown gives them only the monospace font)."""
    if "`" in text:
        doc = QTextDocument()
        doc.setMarkdown(text)
        if style_inline_code(doc, label.palette()):
            label.setTextFormat(Qt.TextFormat.RichText)
            label.setText(doc.toHtml())
            return
    label.setTextFormat(Qt.TextFormat.MarkdownText)
    label.setText(text)


class ThinkingBlock(QFrame):
    """A model's thinking above its answer: a one-line header that folds and unfolds it, and
    the thinking itself (dimmed Markdown). It is open while the model thinks and folds once
    the answer starts; after the reader clicks it, it stays as the reader left it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("thinkingBlock")
        self.setFrameShape(QFrame.Shape.NoFrame)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 4)  # a little air between the thinking and the answer
        lay.setSpacing(2)
        self.toggle = QToolButton()
        self.toggle.setObjectName("thinkingToggle")
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setAccessibleName("Thinking")
        self.toggle.toggled.connect(self._on_toggled)
        self.body = MarkdownBody(dim=True)
        self.body.setObjectName("thinkingText")
        self.body.setContentsMargins(14, 0, 0, 0)
        lay.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(self.body)
        self._text = ""
        self._chosen: bool | None = None  # the reader's choice, once they clicked
        self._syncing = False
        self._show(False)

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    @property
    def summary(self) -> str:
        return self.toggle.text()

    def set_expanded(self, expanded: bool) -> None:
        """As a click does: the block stays so from then on."""
        self.toggle.setChecked(expanded)

    def sync(self, message: Message) -> None:
        self._text = message.thinking
        self.setVisible(bool(message.thinking))
        if not message.thinking:
            return
        summary = thinking_summary(message)
        self.toggle.setText(summary)
        self.toggle.setAccessibleDescription(summary)
        # Open while the model thinks and nothing of the answer has come; folded after.
        thinking_now = message.state == "streaming" and message.thought is None and not message.text
        want = self._chosen if self._chosen is not None else thinking_now
        if want != self.expanded:
            self._syncing = True
            try:
                self.toggle.setChecked(want)
            finally:
                self._syncing = False
        elif want:
            self.body.set_markdown(self._text, streaming=thinking_now)  # open: laid out

    def _on_toggled(self, checked: bool) -> None:
        if not self._syncing:
            self._chosen = checked
        self._show(checked)

    def _show(self, expanded: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        self.toggle.setToolTip("Hide the thinking" if expanded else "Show the thinking")
        if expanded:
            # Folded, the text is not laid out as it streams; it is when the block opens.
            self.body.set_markdown(self._text)
        self.body.setVisible(expanded)


def _tint(palette: QPalette, share: float) -> QColor:
    """The palette's base with a share of its highlight mixed in: a user's bubble, readable
    with the palette's text colour on light and dark palettes alike."""
    base = palette.color(QPalette.ColorRole.Base)
    hi = palette.color(QPalette.ColorRole.Highlight)
    return QColor(
        round(base.red() + (hi.red() - base.red()) * share),
        round(base.green() + (hi.green() - base.green()) * share),
        round(base.blue() + (hi.blue() - base.blue()) * share),
    )


class Bubble(QFrame):
    """A user's message: a rounded tint of the palette's highlight colour, as wide as its
    longest line (`ideal_width`) up to the share of the row its message allows."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("userBubble")
        self.ideal_width = 0

    def sizeHint(self) -> QSize:
        hint = hint_at_own_width(self) or super().sizeHint()
        m = self.contentsMargins()
        lay = self.layout()
        inner = lay.contentsMargins() if lay is not None else m
        pad = m.left() + m.right() + inner.left() + inner.right()
        return QSize(max(self.ideal_width + pad, 40), hint.height())

    def paintEvent(self, e: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(_tint(self.palette(), 0.16))
        p.drawRoundedRect(QRectF(self.rect()), 14, 14)
        p.end()


class Avatar(QWidget):
    """A small round badge with a letter, in the palette's highlight colours."""

    SIZE = 22

    def __init__(self, letter: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.letter = letter
        self.setFixedSize(self.SIZE, self.SIZE)
        self.setAccessibleName("Avatar")

    def paintEvent(self, e: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(pal.color(QPalette.ColorRole.Highlight))
        p.drawEllipse(QRectF(self.rect()))
        p.setPen(pal.color(QPalette.ColorRole.HighlightedText))
        font = QFont(self.font())
        font.setBold(True)
        p.setFont(font)
        p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, self.letter)
        p.end()


class MessageWidget(QFrame):
    """One message. The user's is a tinted bubble on the right (at most 3/4 of the width),
    an answer full-width text under a small avatar and name line. Its action buttons are
    faded out until the message is hovered or has the keyboard focus; they keep their place
    meanwhile, so revealing them repaints them and lays nothing out.

    The message takes the focus (Tab, a click, Up/Down from another message): Enter or the
    menu key opens its actions as a menu; Ctrl+C copies, E edits, Delete deletes, R answers
    again."""

    ROLE_TITLES: ClassVar[dict[str, str]] = {
        "user": "You",
        "assistant": "Assistant",
        "system": "System",
        "tool": "Tool",
    }
    BUBBLE_SHARE = 0.75  # of the message's width, at most

    # (action, self): prev/next (branch), edit, regenerate, continue, copy, delete
    action = Signal(str, object)
    # (self, text): the in-place editor saved this text; (self): it was cancelled
    edit_saved = Signal(object, str)
    edit_cancelled = Signal(object)
    # (self, call id, allowed | always | denied): a tool call answered; (self): Cancel on a
    # running tool
    tool_decided = Signal(object, str, str)
    tool_cancelled = Signal(object)
    # (self, -1 | +1): Up or Down pressed on the message: the one before or after
    navigate = Signal(object, int)

    EDIT_HINT = "Enter saves · Shift+Enter adds a line · Esc cancels"

    def __init__(
        self,
        message: Message,
        parent: QWidget | None = None,
        *,
        reader: AttachmentReader | None = None,
    ) -> None:
        super().__init__(parent)
        self.role = message.role
        self._reader = reader
        self.setObjectName(f"message-{message.role}")
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        who = self.ROLE_TITLES.get(message.role, message.role)
        self.setAccessibleName(f"{who} message")
        lay = self._lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 4, 10, 4)
        lay.setSpacing(4)
        self.title = QLabel(f"<b>{who}</b>")
        self.avatar = Avatar(who[:1].upper())
        self.thinking = ThinkingBlock()
        self.body = MarkdownBody()
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setObjectName("messageError")
        self.error_label.setStyleSheet("color: #c62828;")  # readable on light and dark
        self.footer = QLabel()
        self.footer.setObjectName("statsFooter")
        self.footer.setEnabled(False)
        self.footer.setAccessibleName("Reply statistics")
        # Which model wrote an answer (its name when it did), dimmed beside "Assistant".
        self.model_label = QLabel()
        self.model_label.setObjectName("messageModel")
        self.model_label.setEnabled(False)
        self.model_label.setAccessibleName("Model")
        self.model_label.setTextFormat(Qt.TextFormat.PlainText)
        self.prev_button = self._tool("\u2039", "Previous version", "prev")
        self.branch_label = QLabel()
        self.branch_label.setAccessibleName("Version")
        self.next_button = self._tool("\u203a", "Next version", "next")
        self.continue_button = self._tool("Continue", "Continue this answer", "continue")
        self.edit_button = self._tool("Edit", "Edit (as a new version) · E", "edit")
        self.regenerate_button = self._tool(
            "Regenerate", "Answer again (a new version) · R", "regenerate"
        )
        self.copy_message_button = self._tool("Copy", "Copy the message · Ctrl+C", "copy")
        # An answer spoken (app/ui/read_aloud.py); "Stop reading" while it is.
        self.read_aloud_button = self._tool("Read aloud", "Read this answer aloud", "read_aloud")
        self.speaking = False
        self.delete_button = self._tool(
            "Delete", "Delete this message and what follows · Delete", "delete"
        )
        # The buttons in one widget: an edit in progress hides them all at once; the fade
        # hides them until the message is hovered or focused.
        self.tools = QWidget()
        self.tools.setObjectName("messageActions")
        self.tools.setAccessibleName("Message actions")
        tools = QHBoxLayout(self.tools)
        tools.setContentsMargins(0, 0, 0, 0)
        tools.setSpacing(0)
        for b in self.action_buttons:
            if b is self.next_button:
                tools.addWidget(self.branch_label)
            tools.addWidget(b)
        self._fade = QGraphicsOpacityEffect(self.tools)
        self.tools.setGraphicsEffect(self._fade)
        self._hovered = False
        self._focus_within = False
        self.actions_menu: QMenu | None = None
        self._reveal(False)
        # A user message's images and audio, as sent.
        self.attachments = AttachmentStrip()
        self.bubble: Bubble | None = None
        self._measured: str | None = None
        if message.role == "user":
            # The bubble holds what was sent.
            self.bubble = Bubble()
            inside = self._content = QVBoxLayout(self.bubble)
            inside.setContentsMargins(12, 8, 12, 8)
            inside.addWidget(self.attachments)
            inside.addWidget(self.body)
            # Its actions at the bubble's left, level with its last line: no row of its own.
            row = QHBoxLayout()
            row.setContentsMargins(0, 0, 0, 0)
            row.addStretch(1)
            row.addWidget(self.tools, 0, Qt.AlignmentFlag.AlignBottom)
            row.addWidget(self.bubble)
            lay.addLayout(row)
            self.title.hide()
            self.avatar.hide()
        else:
            head = QHBoxLayout()
            head.setContentsMargins(0, 0, 0, 0)
            head.setSpacing(6)
            head.addWidget(self.avatar)
            head.addWidget(self.title)
            head.addWidget(self.model_label)
            head.addStretch(1)
            head.addWidget(self.tools)
            lay.addLayout(head)
            self._content = lay
            lay.addWidget(self.attachments)
        lay.addWidget(self.thinking)
        if message.role != "user":
            lay.addWidget(self.body)
        # An answer's tool calls, each waiting for the user's decision or showing it.
        self.calls = QWidget()
        self.calls.setAccessibleName("Tool calls")
        self._calls_lay = QVBoxLayout(self.calls)
        self._calls_lay.setContentsMargins(0, 0, 0, 0)
        self.call_blocks: dict[str, ToolCallBlock] = {}
        lay.addWidget(self.calls)
        self.result: ToolResultBlock | None = None
        if message.role == "tool":
            self.result = ToolResultBlock(message)
            self.result.cancel_requested.connect(lambda: self.tool_cancelled.emit(self))
            lay.addWidget(self.result)
            self.body.hide()
        # A grounded answer's sources (app/ui/citations.py), below its text.
        self.sources = SourcesBlock()
        lay.addWidget(self.sources)
        lay.addWidget(self.error_label)
        lay.addWidget(self.footer)
        self.editor: MessageEditor | None = None  # while the message is edited in place
        self.edit_button.setVisible(message.role == "user")
        self.regenerate_button.setVisible(message.role == "assistant")
        for b in (self.copy_message_button, self.delete_button):
            b.setVisible(message.role != "tool")
        self.read_aloud_button.setVisible(message.role == "assistant")
        self.text = message.text
        self.left_out_label: QLabel | None = None  # the last prompt left it out
        self.sync(message)

    def set_left_out(self, left_out: bool) -> None:
        """Dimmed, with a note, while the last prompt left the message out of the context."""
        label = self.left_out_label
        if label is None:
            if not left_out:
                return
            label = self.left_out_label = QLabel("Left out of the context")
            label.setObjectName("leftOutNote")
            label.setToolTip("The last prompt did not hold this message: the model did not see it")
            label.setEnabled(False)
            self._lay.insertWidget(0, label)
            self._dim = QGraphicsOpacityEffect(self.body)
            self._dim.setOpacity(0.5)
            self.body.setGraphicsEffect(self._dim)
        label.setVisible(left_out)
        self._dim.setEnabled(left_out)

    @property
    def action_buttons(self) -> list[QToolButton]:
        return [
            self.prev_button,
            self.next_button,
            self.continue_button,
            self.edit_button,
            self.regenerate_button,
            self.copy_message_button,
            self.read_aloud_button,
            self.delete_button,
        ]

    def set_speaking(self, speaking: bool) -> None:
        """The answer is being read aloud: its Read aloud button stops it."""
        self.speaking = speaking
        b = self.read_aloud_button
        b.setText("Stop reading" if speaking else "Read aloud")
        b.setToolTip("Stop reading this answer aloud" if speaking else "Read this answer aloud")
        b.setAccessibleName(b.toolTip())

    def sizeHint(self) -> QSize:
        return hint_at_own_width(self) or super().sizeHint()

    def _measure_bubble(self, text: str) -> None:
        """The user's text laid out without wrapping: its longest line, the bubble's width."""
        if self.bubble is None or text == self._measured:
            return
        self._measured = text
        doc = QTextDocument()
        doc.setDocumentMargin(0)
        doc.setDefaultFont(self.body.font())
        doc.setMarkdown(text)
        widest = max(math.ceil(doc.idealWidth()) + 4, self.attachments.sizeHint().width())
        if widest != self.bubble.ideal_width:
            self.bubble.ideal_width = widest
            self.bubble.updateGeometry()

    def resizeEvent(self, e: QResizeEvent) -> None:
        if self.bubble is not None:
            self.bubble.setMaximumWidth(max(120, int(self.width() * self.BUBBLE_SHARE)))
        super().resizeEvent(e)

    # -- actions on hover and focus --------------------------------------------------------

    @property
    def actions_shown(self) -> bool:
        """Whether the action buttons are drawn (hovered, focused, or their menu open)."""
        return self._fade.opacity() > 0.5

    def _reveal(self, shown: bool) -> None:
        self._fade.setOpacity(1.0 if shown else 0.0)

    def _sync_reveal(self) -> None:
        menu_open = self.actions_menu is not None and self.actions_menu.isVisible()
        self._reveal(self._hovered or self._focus_within or menu_open)
        self.update()  # the focus ring

    def set_focus_within(self, inside: bool) -> None:
        """The chat view tells: the keyboard focus is on this message or inside it."""
        if inside != self._focus_within:
            self._focus_within = inside
            self._sync_reveal()

    @property
    def hovered(self) -> bool:
        return self._hovered

    def set_hovered(self, hovered: bool) -> None:
        if hovered != self._hovered:
            self._hovered = hovered
            self._sync_reveal()

    def enterEvent(self, e: QEnterEvent) -> None:
        self.set_hovered(True)
        super().enterEvent(e)

    def leaveEvent(self, e: QEvent) -> None:
        self.set_hovered(False)
        super().leaveEvent(e)

    def offered_actions(self) -> list[QToolButton]:
        """The buttons this message offers now (shown in its row and enabled)."""
        if self.editor is not None:
            return []
        return [b for b in self.action_buttons if b.isVisibleTo(self.tools) and b.isEnabled()]

    def open_actions_menu(self) -> QMenu:
        """Its actions as a menu under the message's top (Enter, the menu key, right click)."""
        if self.actions_menu is not None:
            self.actions_menu.close()
            self.actions_menu.deleteLater()
        menu = self.actions_menu = QMenu(self)
        menu.setAccessibleName("Message actions")
        for b in self.offered_actions():
            a = menu.addAction(b.toolTip().split(" · ")[0])
            a.triggered.connect(b.click)
        menu.aboutToHide.connect(self._sync_reveal)
        menu.popup(self.mapToGlobal(self.tools.geometry().bottomLeft()))
        self._sync_reveal()
        return menu

    def contextMenuEvent(self, e: QContextMenuEvent) -> None:
        if self.offered_actions():
            self.open_actions_menu()
            e.accept()
        else:
            super().contextMenuEvent(e)

    def keyPressEvent(self, e: QKeyEvent) -> None:
        key, mods = e.key(), e.modifiers()
        plain = mods in (Qt.KeyboardModifier.NoModifier, Qt.KeyboardModifier.KeypadModifier)
        target: QToolButton | None = None
        if e.matches(QKeySequence.StandardKey.Copy):
            target = self.copy_message_button
        elif plain and key == Qt.Key.Key_E:
            target = self.edit_button
        elif plain and key == Qt.Key.Key_R:
            target = self.regenerate_button
        elif plain and key == Qt.Key.Key_Delete:
            target = self.delete_button
        elif plain and key in (Qt.Key.Key_Up, Qt.Key.Key_Down):
            self.navigate.emit(self, -1 if key == Qt.Key.Key_Up else 1)
            e.accept()
            return
        elif (plain and key in (Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Menu)) or (
            key == Qt.Key.Key_F10 and mods == Qt.KeyboardModifier.ShiftModifier
        ):
            if self.offered_actions():
                self.open_actions_menu()
            e.accept()
            return
        if target is not None:
            if target in self.offered_actions():
                target.click()
            e.accept()
            return
        super().keyPressEvent(e)

    def paintEvent(self, e: QPaintEvent) -> None:
        super().paintEvent(e)
        if self.hasFocus():  # the keyboard is on the message itself: a ring around it
            p = QPainter(self)
            p.setRenderHint(QPainter.RenderHint.Antialiasing)
            p.setPen(QPen(self.palette().color(QPalette.ColorRole.Highlight), 1.5))
            p.drawRoundedRect(QRectF(self.rect()).adjusted(1, 1, -1, -1), 8, 8)
            p.end()

    def focusInEvent(self, e: QFocusEvent) -> None:
        super().focusInEvent(e)
        self.update()

    def focusOutEvent(self, e: QFocusEvent) -> None:
        super().focusOutEvent(e)
        self.update()

    # -- editing in place ------------------------------------------------------------------

    def start_editing(self) -> MessageEditor:
        """Show the message as an editable box (Save / Cancel) in place of its text."""
        if self.editor is None:
            self.editor = MessageEditor(self.text, self.EDIT_HINT)
            self.editor.saved.connect(lambda text: self.edit_saved.emit(self, text))
            self.editor.cancelled.connect(lambda: self.edit_cancelled.emit(self))
            if self.bubble is not None:
                # The box takes the message's whole width, where the bubble was.
                self._lay.insertWidget(self._lay.indexOf(self.thinking), self.editor)
                self.bubble.hide()
            else:
                self._lay.insertWidget(self._lay.indexOf(self.body), self.editor)
            self.body.hide()
            self.tools.hide()
        self.editor.box.setFocus(Qt.FocusReason.OtherFocusReason)
        return self.editor

    def stop_editing(self) -> None:
        """Back to the message as it is shown (what was typed is dropped)."""
        if self.editor is None:
            return
        editor, self.editor = self.editor, None
        editor.hide()
        self._lay.removeWidget(editor)
        editor.deleteLater()
        if self.bubble is not None:
            self.bubble.show()
        self.body.show()
        self.tools.show()

    def _tool(self, text: str, tip: str, name: str) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.setAccessibleName(tip.split(" · ")[0])
        b.setAutoRaise(True)
        b.clicked.connect(lambda: self.action.emit(name, self))
        return b

    def sync(self, message: Message) -> None:
        self.text = message.text
        model = message.model if message.role == "assistant" else None
        self.model_label.setText(model or "")
        self.model_label.setVisible(bool(model))
        index, count = message.branch
        self.branch_label.setText(f"{index}/{count}")
        for w in (self.prev_button, self.branch_label, self.next_button):
            w.setVisible(count > 1)
        self.prev_button.setEnabled(index > 1)
        self.read_aloud_button.setEnabled(bool(message.text.strip()) or self.speaking)
        self.next_button.setEnabled(index < count)
        self.continue_button.setVisible(
            message.role == "assistant"
            and message.state in ("interrupted", "stopped")
            and message.answer_format == "markdown"
        )
        self.thinking.sync(message)
        self.sources.sync(message)
        self.attachments.show_attachments(message.attachments, self._reader or _no_file)
        self._sync_tools(message)
        if message.role == "tool":
            self.text = message.text
        elif message.answer_format == "json":
            shown = json_display(message.text, complete=message.state != "streaming")
            self.body.set_markdown(shown)
            # Copy takes the JSON as shown (pretty-printed), without the fence.
            self.text = shown.removeprefix("```json\n").removesuffix("\n```")
        else:
            self.body.set_markdown(message.text, streaming=message.state == "streaming")
            self._measure_bubble(message.text)
        if message.state != "streaming":  # the paragraph being written tells its own
            self.setAccessibleDescription(self.text[:2000])
        shows_error = bool(message.error) and message.state in ("error", "interrupted")
        if shows_error and message.error:
            self.error_label.setText(message.error)
        self.error_label.setVisible(shows_error)
        self.footer.setToolTip("")
        if message.state == "interrupted":
            # A partial answer kept: after a crash, or cut off by the engine (a dropped
            # connection); the error line above says which.
            self.footer.setText(
                "interrupted: the answer above is partial"
                if message.error
                else "interrupted (the app closed while it was written)"
            )
        elif message.stats is not None:
            self.footer.setText(format_stats(message.stats))
            self.footer.setToolTip(stats_tooltip(message.stats))
        elif message.state == "streaming":
            self.footer.setText("generating…")
        else:
            self.footer.clear()
        self.footer.setVisible(message.role == "assistant" and bool(self.footer.text()))

    def _sync_tools(self, message: Message) -> None:
        if self.result is not None:
            self.result.sync(message)
        for call in message.tool_calls:
            block = self.call_blocks.get(call.id)
            if block is None:
                block = self.call_blocks[call.id] = ToolCallBlock(call)
                block.decided.connect(lambda cid, d: self.tool_decided.emit(self, cid, d))
                self._calls_lay.addWidget(block)
            else:
                block.sync(call)
        self.calls.setVisible(bool(message.tool_calls))
        if self.editor is None:  # an answer that is only calls has no text to show
            self.body.setVisible(
                message.role != "tool" and (bool(message.text) or not message.tool_calls)
            )


def _no_file(_a: object) -> None:
    return None


class ChatView(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    # (action, row) from a message's buttons; copy and edit are handled here: an edit saved
    # in place comes as (row, new text)
    message_action = Signal(str, int)
    edit_requested = Signal(int, str)
    # (conversation id in the store, "md" | "json"): the chat on screen, from Export
    export_requested = Signal(int, str)
    # (row, call id, allowed | always | denied): the user answered a tool call; (row): the
    # user cancelled the tool running there
    tool_decision = Signal(int, str, str)
    tool_cancel = Signal(int)

    SYSTEM_PREVIEW = 200  # characters of the system prompt shown; the tooltip has it all
    WAIT_TO_SAVE = "Wait for the reply to finish (or press Stop), then save"

    def __init__(self, model: ChatModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self._widgets: list[MessageWidget] = []
        self._follow = True  # keep the newest text in view unless the user scrolled up
        self._shown: object = None  # which conversation is on screen (see _rebuild)
        self._busy = False
        self._editing: MessageWidget | None = None  # the message edited in place, if any

        self.scroll_area = QScrollArea()
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setAccessibleName("Conversation")
        # Everything in the list fits its width (code and tables scroll on their own), so a
        # sideways scroll bar would only ever appear for a pixel of rounding.
        self.scroll_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll_area.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll_area.viewport().setBackgroundRole(QPalette.ColorRole.Base)
        self._inner = QWidget()
        self._inner.setBackgroundRole(QPalette.ColorRole.Base)
        self._list = QVBoxLayout(self._inner)
        self._list.setContentsMargins(8, 8, 8, 8)
        self._list.setSpacing(10)
        self._list.addStretch(1)
        self.scroll_area.setWidget(self._inner)
        self.layout_guard = guard_layout_requests(self.scroll_area)
        # An empty chat: the welcome (model, help, examples) in the conversation's place.
        self.welcome = WelcomePane()
        self.welcome.setAutoFillBackground(True)
        self.welcome.setBackgroundRole(QPalette.ColorRole.Base)
        self.welcome.example_chosen.connect(self.fill_composer)
        self.empty_label = self.welcome  # the name the empty state had
        bar = self.scroll_area.verticalScrollBar()
        bar.rangeChanged.connect(self._on_range)
        bar.valueChanged.connect(self._on_scrolled)

        self.attacher = Attacher(self)
        self.voice = VoiceInput(self.attacher, self.send_draft, self)
        self.composer = Composer(self.attacher, self.voice)
        self.input = self.composer.input
        self.input.submitted.connect(self._submit)
        self.input.up_from_empty.connect(self.focus_last_message)
        self.input.files_dropped.connect(self.attacher.add_paths)
        self.input.image_pasted.connect(self.attacher.add_image)
        # A sent attachment's bytes, for the thumbnails (the window sets the controller's).
        self.attachment_reader: AttachmentReader | None = None
        self.send_button = self.composer.send_button
        self.send_button.clicked.connect(self.send_draft)
        self.stop_button = self.composer.stop_button
        self.stop_button.clicked.connect(self.stop_requested)
        self.set_busy(False)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        # The chat's header: its system prompt (what the model is told first), and Export
        # once the chat is in the store. Hidden for a new chat without a system prompt.
        self.system_label = QLabel()
        self.system_label.setObjectName("systemPrompt")
        self.system_label.setAccessibleName("System prompt")
        self.system_label.setWordWrap(True)
        self.system_label.setContentsMargins(10, 4, 10, 4)
        self.system_label.setTextFormat(Qt.TextFormat.PlainText)
        self.system_label.hide()
        self.export_button = QToolButton()
        self.export_button.setText("Export")
        self.export_button.setAccessibleName("Export this chat")
        self.export_button.setToolTip("Save this chat to a file, as Markdown or JSON")
        self.export_button.setAutoRaise(True)
        self.export_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.export_menu = QMenu(self.export_button)
        for fmt, word in (("md", "Markdown"), ("json", "JSON")):
            self.export_menu.addAction(f"Export as {word}…", self._exporter(fmt))
        self.export_button.setMenu(self.export_menu)
        self.header = QWidget()
        self.header.setObjectName("chatHeader")
        head = QHBoxLayout(self.header)
        head.setContentsMargins(0, 0, 4, 0)
        head.addWidget(self.system_label, 1)
        head.addStretch(0)
        head.addWidget(self.export_button, 0, Qt.AlignmentFlag.AlignTop)
        lay.addWidget(self.header)
        lay.addWidget(self.scroll_area, 1)
        lay.addWidget(self.welcome, 1)
        # Where the last prompt's tokens went, and the chat's summary of earlier turns.
        self.context_label = ContextMeterView()
        self.summary_block = SummaryBlock()
        model.meter_changed.connect(self.context_label.set_meter)
        model.summary_changed.connect(self.summary_block.set_text)
        self.summary_block.edited.connect(model.summary_edited)
        self.context_note = QLabel()
        self.context_note.setObjectName("contextNote")
        self.context_note.setWordWrap(True)
        self.context_note.setStyleSheet("color: #b26a00;")
        self.context_note.hide()
        lay.addWidget(self.summary_block)
        lay.addWidget(self.context_note)
        lay.addWidget(self.context_label)
        lay.addWidget(self.attacher.tray)
        lay.addWidget(self.composer)
        app = QApplication.instance()
        if isinstance(app, QApplication):
            app.focusChanged.connect(self._on_focus_changed)

        model.rowsInserted.connect(self._on_inserted)
        model.dataChanged.connect(self._on_changed)
        model.modelReset.connect(self._rebuild)
        model.rowsRemoved.connect(self._rebuild)
        self._rebuild()

    @property
    def message_widgets(self) -> list[MessageWidget]:
        return list(self._widgets)

    # -- welcome, composer and keyboard ------------------------------------------------------

    def _show_welcome(self, empty: bool) -> None:
        if self.welcome.isVisibleTo(self) != empty or self.scroll_area.isVisibleTo(self) == empty:
            self.welcome.setVisible(empty)
            self.scroll_area.setVisible(not empty)

    def set_model_name(self, name: str) -> None:
        """The model that will answer, for the welcome of an empty chat."""
        self.welcome.set_model_name(name)

    def set_token_counter(self, counter: CountTokens | None) -> None:
        """How the draft's tokens are counted (the loaded model's tokenizer)."""
        self.composer.set_token_counter(counter)

    def fill_composer(self, text: str) -> None:
        """Put `text` in the message box, ready to edit or send (an example's button)."""
        self.input.setPlainText(text)
        self.input.moveCursor(QTextCursor.MoveOperation.End)
        self.focus_input()

    def focus_input(self) -> None:
        self.input.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def focus_message(self, row: int) -> bool:
        if not 0 <= row < len(self._widgets):
            return False
        w = self._widgets[row]
        w.setFocus(Qt.FocusReason.OtherFocusReason)
        self.scroll_area.ensureWidgetVisible(w, 0, 0)
        return True

    def focus_last_message(self) -> None:
        self.focus_message(len(self._widgets) - 1)

    def _navigate(self, w: MessageWidget, step: int) -> None:
        if w not in self._widgets:
            return
        row = self._widgets.index(w) + step
        if row >= len(self._widgets):
            self.focus_input()  # Down from the last message: back to typing
        else:
            self.focus_message(max(row, 0))

    def regenerate_last(self) -> bool:
        """Answer the last question again (Ctrl+R): the newest answer's Regenerate."""
        for w in reversed(self._widgets):
            if w.role == "assistant":
                if w.regenerate_button.isEnabled() and not self._busy:
                    w.regenerate_button.click()
                    return True
                return False
        return False

    def _on_focus_changed(self, old: QWidget | None, new: QWidget | None) -> None:
        was, now = self._message_of(old), self._message_of(new)
        if was is not now:
            if was is not None:
                was.set_focus_within(False)
            if now is not None:
                now.set_focus_within(True)

    def _message_of(self, w: QWidget | None) -> MessageWidget | None:
        while w is not None:
            if isinstance(w, MessageWidget):
                return w if w in self._widgets else None
            if w is self:
                return None
            w = w.parentWidget()
        return None

    def set_busy(self, busy: bool, paused: str | None = None) -> None:
        """What the chat's controller says: a reply is on its way (Stop in Send's place), or
        sending is paused (Send off, with `paused`, the reason, as its tooltip)."""
        self._busy = busy
        self.composer.set_busy(busy, paused)
        if self._editing is not None and self._editing.editor is not None:
            self._editing.editor.set_saving_allowed(not busy, self.WAIT_TO_SAVE)

    def _exporter(self, fmt: str) -> Callable[[], None]:
        # A closure, not a lambda with defaults: PySide would pass `checked` into a default.
        return lambda: self.export(fmt)

    def export(self, fmt: str) -> None:
        """Ask for the chat on screen to be exported (once it is in the store)."""
        cid = self.model.conversation.store_id
        if cid is not None:
            self.export_requested.emit(cid, fmt)

    def _sync_header(self) -> None:
        stored = self.model.conversation.store_id is not None
        self.export_button.setVisible(stored)
        self.header.setVisible(stored or bool(self.system_label.text()))

    def send_draft(self) -> bool:
        """Send what is typed with what is attached (Send; a voice recording). A recording
        alone is a message too. False: nothing to send, or an answer is being written."""
        text = self.input.toPlainText().strip()
        if not (text or self.attacher.items()) or not self.send_button.isEnabled():
            return False
        self._submit(text)
        return True

    def _submit(self, text: str) -> None:
        if not self.send_button.isEnabled():
            return  # a reply is still streaming; keep what the user typed
        self.input.clear()
        self.send_requested.emit(text)

    def _rebuild(self) -> None:
        for w in self._widgets:
            self._list.removeWidget(w)
            w.deleteLater()
        self._widgets = []
        self._editing = None  # its widget went with the others
        for row in range(self.model.rowCount()):
            self._insert(row)
        self._show_welcome(not self._widgets)
        self._sync_header()
        # Another chat opens at its end, even if the last one was scrolled up; the same chat
        # cut or re-read (regenerate, a branch switch, a delete) keeps the reader's place.
        conv = self.model.conversation
        shown = conv.store_id if conv.store_id is not None else conv.id
        if shown != self._shown:
            self._shown = shown
            self._follow = True
            # Its list may come out exactly as tall as the last one's: no range change then
            # (see _on_range), so go to the end now; a range that changes follows it there.
            bar = self.scroll_area.verticalScrollBar()
            bar.setValue(bar.maximum())

    def set_system_prompt(self, text: str) -> None:
        """Show this chat's system prompt above the messages ('' hides the line)."""
        text = text.strip()
        self.system_label.setVisible(bool(text))
        one_line = " ".join(text.split())
        if len(one_line) > self.SYSTEM_PREVIEW:
            one_line = one_line[: self.SYSTEM_PREVIEW - 1] + "…"
        self.system_label.setText(f"System prompt: {one_line}" if text else "")
        self.system_label.setToolTip(text)
        self._sync_header()

    def set_context(self, used: int, n_ctx: int) -> None:
        self.context_label.set_context(used, n_ctx)

    def show_context_note(self, text: str) -> None:
        self.context_note.setText(text)
        self.context_note.setVisible(bool(text))

    def _on_message_action(self, name: str, w: MessageWidget) -> None:
        if w not in self._widgets:
            return
        row = self._widgets.index(w)
        if name == "copy":
            QGuiApplication.clipboard().setText(w.text)
        elif name == "edit":
            self.start_editing(row)
        else:
            self.message_action.emit(name, row)

    def _on_tool_decided(self, w: MessageWidget, call_id: str, decision: str) -> None:
        if w in self._widgets:
            self.tool_decision.emit(self._widgets.index(w), call_id, decision)

    def _on_tool_cancelled(self, w: MessageWidget) -> None:
        if w in self._widgets:
            self.tool_cancel.emit(self._widgets.index(w))

    def start_editing(self, row: int) -> MessageEditor:
        """Edit the message at `row` in place (one at a time: another edit is dropped)."""
        w = self._widgets[row]
        if self._editing is not None and self._editing is not w:
            self._editing.stop_editing()
        self._editing = w
        editor = w.start_editing()
        editor.set_saving_allowed(not self._busy, self.WAIT_TO_SAVE)
        self.scroll_area.ensureWidgetVisible(w)
        return editor

    def _on_edit_saved(self, w: MessageWidget, text: str) -> None:
        if w not in self._widgets or not text.strip() or self._busy:
            return  # nothing to save yet: the box stays open with what was typed
        row = self._widgets.index(w)
        self._end_edit(w)
        self.edit_requested.emit(row, text.strip())

    def _end_edit(self, w: MessageWidget) -> None:
        w.stop_editing()
        if self._editing is w:
            self._editing = None

    def _insert(self, row: int) -> None:
        w = MessageWidget(self.model.message(row), reader=self.attachment_reader)
        w.action.connect(self._on_message_action)
        w.edit_saved.connect(self._on_edit_saved)
        w.edit_cancelled.connect(self._end_edit)
        w.tool_decided.connect(self._on_tool_decided)
        w.tool_cancelled.connect(self._on_tool_cancelled)
        w.navigate.connect(self._navigate)
        self._list.insertWidget(row, w)
        self._widgets.insert(row, w)

    def _on_inserted(
        self, _parent: QModelIndex | QPersistentModelIndex, first: int, last: int
    ) -> None:
        for row in range(first, last + 1):
            self._insert(row)
        self._show_welcome(False)
        self._follow = True
        self._sync_header()

    def _on_changed(
        self,
        top: QModelIndex | QPersistentModelIndex,
        bottom: QModelIndex | QPersistentModelIndex,
        _roles: object = None,
    ) -> None:
        for row in range(top.row(), bottom.row() + 1):
            if 0 <= row < len(self._widgets):
                self._widgets[row].sync(self.model.message(row))
                self._widgets[row].set_left_out(self.model.left_out(row))
        self._sync_header()  # a new chat's first message gave it its id in the store

    def _on_range(self, _lo: int, hi: int) -> None:
        if self._follow:
            self.scroll_area.verticalScrollBar().setValue(hi)

    def _on_scrolled(self, value: int) -> None:
        bar = self.scroll_area.verticalScrollBar()
        self._follow = value >= bar.maximum() - 4
        self._rehover()

    def _rehover(self) -> None:
        """The messages moved under a still mouse (a scroll, an answer pushing them up): Qt
        sends no enter or leave for that, so the one under the mouse is found again."""
        if not self.scroll_area.viewport().underMouse():
            return
        under = self._message_of(QApplication.widgetAt(QCursor.pos()))
        for w in self._widgets:
            if w.hovered and w is not under:
                w.set_hovered(False)
        if under is not None:
            under.set_hovered(True)
