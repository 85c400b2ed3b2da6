"""What one streamed update costs the GUI thread: only the growing paragraph is laid out and
repainted, the figures under the chat do not lay the window out again, and the scroll area
re-places its content only when the content's size changes.

These count events (paints, layout requests) rather than time: the counts are what made each
update cost several milliseconds on 2 cores, and they do not depend on the machine's load.
"""

from __future__ import annotations

from collections import Counter

import pytest
from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget
from pytestqt.qtbot import QtBot

from app.ui.chat_model import ChatModel
from app.ui.chat_view import ChatView, MarkdownBody
from app.ui.prose_label import ProseLabel
from app.ui.scroll_guard import LayoutRequestGuard, guard_layout_requests, wanted_size
from app.ui.steady_label import SteadyLabel
from app.ui.streaming_prose import StreamingProse
from engine.host.stats import GenerationStats

# Offscreen, a top-level window's layout says this whenever it asks for a size.
pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

STORY = "\n\n".join(
    f"Paragraph {i}: the keeper climbed the stairs of the lighthouse again, counting the "
    "steps as the storm pressed on the glass, and wrote the hour in the log before the lamp "
    "was lit for the night." * 2
    for i in range(1, 6)
)


class Counts(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.by: Counter[tuple[int, QEvent.Type]] = Counter()

    def watch(self, w: QObject) -> None:
        w.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        self.by[(id(watched), event.type())] += 1
        return False

    def of(self, w: QObject, kind: QEvent.Type) -> int:
        return self.by[(id(w), kind)]


def chat_like(qtbot: QtBot) -> tuple[QScrollArea, MarkdownBody]:
    """A Markdown body in a widget-resizable scroll area, as the chat view holds a reply."""
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.resize(700, 900)
    inner = QWidget()
    lay = QVBoxLayout(inner)
    body = MarkdownBody()
    lay.addWidget(body)
    lay.addStretch(1)
    area.setWidget(inner)
    guard_layout_requests(area)
    qtbot.addWidget(area)
    area.show()
    qtbot.waitExposed(area)
    return area, body


def stream(qtbot: QtBot, body: MarkdownBody, start: int, step: int = 9) -> int:
    n = 0
    for end in range(start, len(STORY) + 1, step):
        body.set_markdown(STORY[:end])
        qtbot.wait(1)
        n += 1
    return n


def test_a_streamed_update_repaints_the_growing_paragraph_not_those_above(
    qtbot: QtBot,
) -> None:
    _area, body = chat_like(qtbot)
    last = STORY.rfind("\n\n")
    body.set_markdown(STORY[: last + 2])
    qtbot.wait(20)
    done = body.widgets
    assert len(done) == 4 and all(isinstance(w, ProseLabel) for w in done)
    counts = Counts()
    for w in done:
        counts.watch(w)
    updates = stream(qtbot, body, last + 12)
    assert updates > 20
    tail = body.widgets[-1]
    assert tail.text().startswith("Paragraph 5") and len(body.widgets) == 5
    # A plain QLabel paragraph was repainted on every update (its sizes were laid out
    # again for each question the layout asked); a ProseLabel only when the layout moves.
    for w in done:
        assert counts.of(w, QEvent.Type.Paint) <= updates // 3, w.text()[:12]


def test_prose_label_keeps_its_sizes_until_its_text_or_font_change(qtbot: QtBot) -> None:
    label = ProseLabel()
    label.setWordWrap(True)
    qtbot.addWidget(label)
    label.setText("one two three four five six seven eight nine ten")
    h = label.heightForWidth(120)
    assert h == QLabel.heightForWidth(label, 120) and label.heightForWidth(120) == h
    assert label.sizeHint() == QLabel.sizeHint(label)
    # Growing (a streamed paragraph): heights are asked again, the widths are kept.
    hint = label.sizeHint()
    label.setText(label.text() + " eleven twelve thirteen fourteen fifteen sixteen")
    assert label.heightForWidth(120) == QLabel.heightForWidth(label, 120) > h
    assert label.sizeHint() == hint
    # Another text: everything is asked again.
    label.setText("short")
    assert label.sizeHint() == QLabel.sizeHint(label) != hint
    assert label.heightForWidth(120) == QLabel.heightForWidth(label, 120)
    font = label.font()
    font.setPointSize(font.pointSize() * 3)
    big = label.heightForWidth(120)
    label.setFont(font)
    assert label.heightForWidth(120) == QLabel.heightForWidth(label, 120) > big


def test_a_steady_label_changes_its_text_without_laying_out_its_window(qtbot: QtBot) -> None:
    window = QWidget()
    lay = QVBoxLayout(window)
    steady = SteadyLabel("Context: 100 / 4,096 tokens (2%)")
    plain = QLabel("Context: 100 / 4,096 tokens (2%)")
    lay.addWidget(steady)
    lay.addWidget(plain)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    qtbot.wait(20)
    counts = Counts()
    counts.watch(window)
    for n in range(101, 141):
        steady.setText(f"Context: {n} / 4,096 tokens (2%)")
        qtbot.wait(1)
    assert counts.of(window, QEvent.Type.LayoutRequest) == 0
    assert steady.text() == "Context: 140 / 4,096 tokens (2%)"
    for n in range(101, 111):  # the same with a plain label: the window is laid out
        plain.setText(f"Context: {n} / 4,096 tokens (2%)")
        qtbot.wait(1)
    assert counts.of(window, QEvent.Type.LayoutRequest) >= 5
    # A longer text grows it (once), so nothing is cut.
    wide = "Context: 1,000,000 / 1,048,576 tokens (95%)"
    steady.setText(wide)
    # Its new size is applied by the layout, in an event of its own.
    qtbot.waitUntil(lambda: steady.width() >= steady.fontMetrics().horizontalAdvance(wide))
    steady.clear()
    assert steady.text() == ""


def test_the_scroll_area_still_follows_content_that_grows(qtbot: QtBot) -> None:
    area, body = chat_like(qtbot)
    area.resize(700, 200)
    qtbot.wait(20)
    bar = area.verticalScrollBar()
    stream(qtbot, body, 40, step=60)
    inner = area.widget()
    assert inner is not None
    # The whole story is far taller than the viewport: the content grew and can be scrolled
    # to its end, and its size is the one QScrollArea would give it (once the layout events
    # the last update posted are through).
    qtbot.waitUntil(
        lambda: (
            bar.maximum() > 0
            and inner.height() == bar.maximum() + area.viewport().height()
            and wanted_size(area) == inner.size()
        )
    )


def test_the_guard_drops_only_requests_that_change_nothing(qtbot: QtBot) -> None:
    area, body = chat_like(qtbot)
    guards = [f for f in area.children() if isinstance(f, LayoutRequestGuard)]
    assert len(guards) == 1
    guard = guards[0]
    body.set_markdown("A first line")
    qtbot.wait(20)
    before = guard.passed, guard.dropped
    body.set_markdown("A first line, a little longer")  # same height: nothing to re-place
    qtbot.waitUntil(lambda: guard.dropped > before[1])
    area.resize(700, 120)
    body.set_markdown(STORY)  # taller than the viewport now: this one must pass
    qtbot.waitUntil(lambda: guard.passed > before[0])
    qtbot.waitUntil(lambda: area.verticalScrollBar().maximum() > 0)


def test_a_growing_paragraph_is_laid_out_once_per_update_at_the_width_it_is_shown(
    qtbot: QtBot,
) -> None:
    """A word-wrapped label laid the paragraph being written out at three widths for each
    update (shown, hint, minimum; its height query alone lays it out three times): the last
    paragraph of a streaming answer is a `StreamingProse`, laid out once per new text, and
    a `ProseLabel` (selectable, links) once the answer is done."""
    model = ChatModel()
    view = ChatView(model)
    view.resize(760, 900)
    qtbot.addWidget(view)
    view.show()
    qtbot.waitExposed(view)
    model.append("user", "Tell me about the lighthouse keeper.")
    row = model.append("assistant", "", "streaming")
    qtbot.wait(20)
    end = STORY.find("\n\n")
    updates = 0
    for stop in range(10, end, 11):
        model.append_text(row, STORY[len(model.message(row).text) : stop])
        qtbot.wait(1)
        updates += 1
    (growing,) = view.message_widgets[row].body.widgets
    assert isinstance(growing, StreamingProse)
    assert growing.text() == model.message(row).text
    assert updates > 10
    assert growing.layouts <= updates + 1  # once per update (the first at its width)
    # Its height follows its text once the layout event of the last update is through.
    qtbot.waitUntil(lambda: growing.heightForWidth(growing.width()) == growing.height())
    # A new paragraph: the finished one becomes a label, the new one grows.
    model.append_text(row, STORY[len(model.message(row).text) : end + 12])
    qtbot.wait(5)
    first, second = view.message_widgets[row].body.widgets
    assert isinstance(first, ProseLabel) and isinstance(second, StreamingProse)
    assert first.text() == STORY[:end]
    model.finish(row, GenerationStats(gen_tokens=updates))
    qtbot.wait(5)
    assert all(isinstance(w, ProseLabel) for w in view.message_widgets[row].body.widgets)


@pytest.mark.parametrize(
    "text",
    [
        "The **keeper** wrote `lamp lit` in the log before the storm came over the rocks, "
        "and *waited* for the ships. ",
        "The keeper wrote in the [log](https://example.org) before the storm came over the "
        "rocks, and waited for the ships. ",
    ],
)
def test_a_streaming_paragraph_is_drawn_as_its_label_is(qtbot: QtBot, text: str) -> None:
    """The same Markdown (bold, italics, inline code; a link), the same pixels: swapping the
    growing paragraph for a label when it is done must not move or restyle the text."""
    shots = []
    for streaming in (True, False):
        area, body = chat_like(qtbot)
        body.set_markdown(text * 3, streaming=streaming)
        qtbot.wait(20)
        (w,) = body.widgets
        assert isinstance(w, StreamingProse if streaming else ProseLabel)
        shots.append((w.height(), area.viewport().grab().toImage()))
    (h_streaming, streaming_shot), (h_label, label_shot) = shots
    assert h_streaming == h_label
    assert streaming_shot == label_shot
