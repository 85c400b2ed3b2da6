"""The context made visible under the chat: where the last prompt's tokens went (a segmented
bar: system prompt, summary, history, documents, tool results, attachments, the question,
the template's own markup), the room kept for the reply and what is free, with a legend in
its tooltip; and the chat's summary of earlier turns, which the person may correct.

The numbers are engine.host.context_meter's, measured on the engine thread for the prompt
actually sent; until a prompt is measured (a remote engine, a chat just opened) the line
says the tokens in use alone, as it did before.
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine.host.context_meter import KINDS, ContextMeter, Kind

# Mid-saturation hues, told apart on light and dark windows alike.
COLORS: dict[Kind, str] = {
    "system": "#8e6fd1",
    "summary": "#d16fa8",
    "history": "#4f86e0",
    "documents": "#e08a2e",
    "tool_results": "#4fa64a",
    "attachments": "#2fb3bd",
    "question": "#d9b200",
    "template": "#8a8a8a",
}
LABELS: dict[Kind, str] = {
    "system": "System prompt",
    "summary": "Summary",
    "history": "History",
    "documents": "Documents",
    "tool_results": "Tool results",
    "attachments": "Attachments",
    "question": "Question",
    "template": "Template",
}


def legend_html(meter: ContextMeter) -> str:
    """Each kind's tokens (those present), the reply's room and what is free."""
    rows = [
        f'<tr><td><span style="color:{COLORS[k]}">■</span> {LABELS[k]}</td>'
        f'<td align="right">{meter.kinds[k]:,}</td></tr>'
        for k in KINDS
        if meter.kinds.get(k)
    ]
    rows.append(f'<tr><td>▨ Kept for the reply</td><td align="right">{meter.reserve:,}</td></tr>')
    rows.append(f'<tr><td>□ Free</td><td align="right">{max(meter.free, 0):,}</td></tr>')
    head = f"<b>{meter.prompt_tokens:,} of {meter.n_ctx:,} tokens sent</b>"
    if meter.left_out:
        n = len(meter.left_out)
        head += f"<br>{n} message{'s' if n != 1 else ''} left out of the context"
    return f"{head}<table cellspacing=4>{''.join(rows)}</table>"


class MeterBar(QWidget):
    """The bar: one segment a kind, then the reply's room (hatched), then free."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.meter: ContextMeter | None = None
        self.setFixedHeight(8)
        self.setMinimumWidth(80)
        self.setAccessibleName("Context use by kind")

    def sizeHint(self) -> QSize:
        return QSize(180, 8)

    def paintEvent(self, _event: QPaintEvent) -> None:
        meter = self.meter
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        pal = self.palette()
        p.fillRect(r, pal.color(QPalette.ColorRole.Base))
        if meter is not None and meter.n_ctx > 0:
            scale = r.width() / meter.n_ctx
            x = r.left()
            for k in KINDS:
                w = meter.kinds.get(k, 0) * scale
                if w > 0:
                    p.fillRect(QRectF(x, r.top(), w, r.height()), QColor(COLORS[k]))
                    x += w
            w = min(meter.reserve * scale, r.right() - x)
            if w > 0:
                p.fillRect(
                    QRectF(x, r.top(), w, r.height()),
                    pal.color(QPalette.ColorRole.Mid),
                )
                p.fillRect(
                    QRectF(x, r.top(), w, r.height()),
                    Qt.BrushStyle.BDiagPattern,
                )
        p.setPen(pal.color(QPalette.ColorRole.Mid))
        p.drawRect(r)
        p.end()


class ContextMeterView(QWidget):
    """The context line: "Context: N / M tokens (P%)", the bar and its legend (a tooltip)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Context use")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(8)
        self.label = QLabel()
        self.label.setEnabled(False)  # dimmed, as the line was
        self.bar = MeterBar()
        self.left_out = QLabel()
        self.left_out.setObjectName("contextLeftOut")
        self.left_out.setEnabled(False)
        lay.addWidget(self.label)
        lay.addWidget(self.bar, 1)
        lay.addWidget(self.left_out)
        self._meter: ContextMeter | None = None
        self._sync()

    @property
    def meter(self) -> ContextMeter | None:
        return self._meter

    def text(self) -> str:
        return self.label.text()

    def set_context(self, used: int, n_ctx: int) -> None:
        """Tokens in use (the answer too, as it grows) and the context's size."""
        self.label.setText(
            f"Context: {used:,} / {n_ctx:,} tokens ({100 * used / n_ctx:.0f}%)" if n_ctx else ""
        )
        if not n_ctx:
            self._meter = None
        self._sync()

    def set_meter(self, meter: object) -> None:
        """Where the last prompt sent went (None: not measured)."""
        self._meter = meter if isinstance(meter, ContextMeter) else None
        self._sync()

    def _sync(self) -> None:
        meter = self._meter
        self.bar.meter = meter
        self.bar.setVisible(meter is not None)
        n = len(meter.left_out) if meter is not None else 0
        self.left_out.setText(f"{n} left out" if n else "")
        self.left_out.setVisible(bool(n))
        tip = legend_html(meter) if meter is not None else ""
        for w in (self.label, self.bar, self.left_out):
            w.setToolTip(tip)
        self.bar.update()
        self.setVisible(bool(self.label.text()) or meter is not None)


class SummaryBlock(QFrame):
    """The chat's summary of earlier turns: sent in place of the turns it covers, shown
    and editable (Save keeps the edit for the next requests)."""

    edited = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("summaryBlock")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName("Summary of earlier turns")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 6, 8, 6)
        lay.setSpacing(4)
        head = QHBoxLayout()
        self.title = QLabel("<b>Summary of earlier turns</b>")
        self.hint = QLabel("sent in place of the messages marked left out")
        self.hint.setEnabled(False)
        self.save = QPushButton("Save")
        self.save.setEnabled(False)
        self.save.clicked.connect(self._save)
        head.addWidget(self.title)
        head.addWidget(self.hint, 1)
        head.addWidget(self.save)
        lay.addLayout(head)
        self.editor = QPlainTextEdit()
        self.editor.setAccessibleName("Summary text")
        self.editor.setMaximumHeight(64)
        self.editor.textChanged.connect(self._changed)
        lay.addWidget(self.editor)
        self._text = ""
        self.hide()

    def set_text(self, text: object) -> None:
        """The summary (None: the chat has none)."""
        self._text = text if isinstance(text, str) else ""
        self.editor.setPlainText(self._text)
        self.setVisible(bool(self._text))
        self.save.setEnabled(False)

    def _changed(self) -> None:
        now = self.editor.toPlainText()
        self.save.setEnabled(bool(now.strip()) and now != self._text)

    def _save(self) -> None:
        self._text = self.editor.toPlainText()
        self.save.setEnabled(False)
        self.edited.emit(self._text)


__all__ = ["COLORS", "LABELS", "ContextMeterView", "MeterBar", "SummaryBlock", "legend_html"]
