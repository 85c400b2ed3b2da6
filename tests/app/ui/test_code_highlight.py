"""Code blocks in the chat are syntax-highlighted in the palette's light or dark style, and
inline code gets a tinted background: checked on the document's formats and a grab's pixels."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QColor, QImage, QPalette
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from app.ui.chat_view import CodeBlock, MarkdownBody
from app.ui.code_highlight import spans

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

REPLY = """Use `sorted()` here:

```python
def total(xs: list[int]) -> int:
    # add them up
    return sum(x * 2 for x in xs if x > 0)  # "doubled"
```
"""


def dark_palette() -> QPalette:
    p = QPalette()
    for role, colour in (
        (QPalette.ColorRole.Window, "#202124"),
        (QPalette.ColorRole.Base, "#1b1b1d"),
        (QPalette.ColorRole.Text, "#e8e8e8"),
        (QPalette.ColorRole.WindowText, "#e8e8e8"),
    ):
        p.setColor(role, QColor(colour))
    return p


def code_colours(block: CodeBlock) -> set[str]:
    """Foreground colours Qt lays the block's text out with."""
    doc = block.editor.document()
    out = set()
    b = doc.begin()
    while b.isValid():
        for r in b.layout().formats():
            out.add(r.format.foreground().color().name())
        b = b.next()
    return out


def ink(img: QImage) -> set[tuple[int, int, int]]:
    """Distinct saturated colours in a grab (text in colour, not the grey of plain text)."""
    found = set()
    for y in range(0, img.height(), 1):
        for x in range(0, img.width(), 1):
            c = img.pixelColor(x, y)
            if c.saturation() > 90 and c.value() > 60:
                found.add((c.red() // 32, c.green() // 32, c.blue() // 32))
    return found


def show(qtbot: QtBot, palette: QPalette | None = None) -> MarkdownBody:
    body = MarkdownBody()
    qtbot.addWidget(body)
    if palette is not None:
        body.setPalette(palette)
    body.set_markdown(REPLY)
    body.resize(620, 260)
    body.show()
    qtbot.waitExposed(body)
    return body


def test_a_python_block_is_painted_in_several_colours(qtbot: QtBot) -> None:
    body = show(qtbot)
    block = next(w for w in body.widgets if isinstance(w, CodeBlock))
    light = code_colours(block)
    assert len(light) >= 3  # keywords, comments, strings, numbers...
    assert len(ink(block.editor.viewport().grab().toImage())) >= 2
    # Inline code: monospace with a tinted background, through rich text.
    label = next(w for w in body.widgets if isinstance(w, QLabel))
    assert "background-color" in label.text() and "sorted()" in label.text()


def test_the_dark_palette_takes_the_dark_style(qtbot: QtBot) -> None:
    light_body = show(qtbot)
    light_block = next(w for w in light_body.widgets if isinstance(w, CodeBlock))
    body = show(qtbot, dark_palette())
    block = next(w for w in body.widgets if isinstance(w, CodeBlock))
    dark = code_colours(block)
    assert len(dark) >= 3 and dark != code_colours(light_block)
    # On the dark base every coloured run is light enough to read.
    assert all(QColor(c).lightness() > 100 for c in dark if c != "#000000")
    img = block.editor.viewport().grab().toImage()
    assert img.pixelColor(img.width() - 3, img.height() - 3).lightness() < 60  # dark base
    assert len(ink(img)) >= 2
    # Switching the palette back re-colours the same block.
    body.setPalette(QPalette())
    assert code_colours(block) == code_colours(light_block)


def test_unknown_language_and_offsets_past_non_bmp_text() -> None:
    assert spans("print(1)", "no-such-language", dark=False) == []
    # An emoji is two UTF-16 units in Qt: the string after it still starts where Qt has it.
    code = 'x = "🙂"; y = "a"'
    starts = [s for s, _, _ in spans(code, "python", dark=False)]
    assert len('x = "🙂"; y = ') + 1 in starts
