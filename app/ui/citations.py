"""The sources of a grounded answer, below it: what retrieval added ("Retrieval adds 1,840
tokens from 4 passages (budget 2,048)") and a numbered list, "[1] guide.pdf, p. 4", each
opening its file where the passage is.

A PDF opens at its page (`#page=N`, which PDF viewers and browsers follow); any other file
opens as it is, with the passage's line and text in the link's tooltip (a file URL cannot say
a line for every editor).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QFrame, QLabel, QVBoxLayout, QWidget

from app.ui.conversation import Message
from engine.rag.grounding import Grounding, Source

TIP_CHARS = 400  # of the passage, in a source's tooltip


def source_url(source: Source) -> QUrl:
    """The file of `source`, at its page for a PDF."""
    url = QUrl.fromLocalFile(source.path)
    if source.page is not None and Path(source.path).suffix.lower() == ".pdf":
        url.setFragment(f"page={source.page}")
    return url


def source_tooltip(source: Source) -> str:
    """Where the passage is and how it starts (plain text)."""
    where = [source.path]
    if source.page is not None:
        where.append(f"page {source.page}")
    if source.heading:
        where.append(f"under “{source.heading}”")
    if source.line is not None:
        where.append(f"line {source.line}")
    text = " ".join(source.text.split())
    if len(text) > TIP_CHARS:
        text = text[: TIP_CHARS - 1] + "…"
    return f"{', '.join(where)}\n\n{text}"


class SourcesBlock(QFrame):
    """A grounded answer's budget line and its numbered sources (hidden for other messages)."""

    # (the source, the URL opened): after a click on a source
    opened = Signal(object, QUrl)
    # How a URL is opened; tests put a recorder here instead of the desktop's handler.
    open_url: ClassVar[Callable[[QUrl], object]] = QDesktopServices.openUrl

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("sources")
        self.setAccessibleName("Sources")
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(0, 4, 0, 0)
        self._lay.setSpacing(1)
        self.summary = QLabel()
        self.summary.setObjectName("retrievalSummary")
        self.summary.setAccessibleName("Retrieval")
        self.summary.setWordWrap(True)
        self.summary.setEnabled(False)
        self.summary.setTextFormat(Qt.TextFormat.PlainText)
        self._lay.addWidget(self.summary)
        self.links: list[QLabel] = []
        self._shown: Grounding | None = None
        self.hide()

    @property
    def grounding(self) -> Grounding | None:
        return self._shown

    def sync(self, message: Message) -> None:
        """Show `message`'s sources; cheap when they did not change (every streamed update
        of the message calls this)."""
        g = message.grounding if message.role == "assistant" else None
        if g is self._shown:
            return
        self._shown = g
        for link in self.links:
            self._lay.removeWidget(link)
            link.deleteLater()
        self.links = []
        if g is None:
            self.hide()
            return
        self.summary.setText(g.summary)
        for s in g.sources:
            self.links.append(self._link(s))
        self.show()

    def _link(self, source: Source) -> QLabel:
        label = QLabel(f'<a href="{source.number}">{html.escape(source.label)}</a>')
        label.setObjectName("source")
        label.setAccessibleName(source.label)
        label.setTextFormat(Qt.TextFormat.RichText)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.LinksAccessibleByMouse)
        label.setToolTip(source_tooltip(source))
        label.linkActivated.connect(lambda _href, s=source: self.open_source(s))
        self._lay.addWidget(label)
        return label

    def open_source(self, source: Source) -> None:
        url = source_url(source)
        type(self).open_url(url)
        self.opened.emit(source, url)


__all__ = ["SourcesBlock", "source_tooltip", "source_url"]
