"""Every page of the window's rail as the screen shows it, on a real X server, at 1600x1000,
1280x800 and 1000x700, in the light and the dark palette: no horizontal scroll bar, no
button, field or label narrower than it needs (cut text), nothing outside the window; on
the Chat page the composer and the end of the last message are in view and painted. One
window goes through every size, scheme and page (the tier's time is short); a failure lists
every problem found, with the screenshot of each place.

Run by test_xserver_tier.py on Xvfb; see conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QPoint, QRect
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractScrollArea,
    QApplication,
    QComboBox,
    QLabel,
    QLineEdit,
    QScrollArea,
    QWidget,
)
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.ui.main_window import MainWindow
from tests.app.ui.visual.painted import (
    MIN_INK_SHARE,
    end_of_chat_problems,
    grab_screen,
    ink_mask,
    ink_share,
)

pytestmark = pytest.mark.xserver
SIZES = ((1600, 1000), (1280, 800), (1000, 700))
# WCAG's least contrast for body text.
MIN_CONTRAST = 4.5


def luminance(c: object) -> float:
    from PySide6.QtGui import QColor

    assert isinstance(c, QColor)

    def lin(v: float) -> float:
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(c.redF()) + 0.7152 * lin(c.greenF()) + 0.0722 * lin(c.blueF())


def contrast(pal: QPalette, fg: QPalette.ColorRole, bg: QPalette.ColorRole) -> float:
    a, b = luminance(pal.color(fg)), luminance(pal.color(bg))
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    assert QGuiApplication.platformName() == "xcb", "this tier draws on a real X server"
    w = build_window(model_manager=True)
    w.show()
    qtbot.waitExposed(w)
    yield w
    w.set_scheme("system")
    w.close()
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def settle(qtbot: QtBot) -> None:
    qtbot.wait(120)
    QApplication.sync()


def shown_rect(w: QWidget, top: QWidget) -> QRect:
    return QRect(w.mapTo(top, QPoint(0, 0)), w.size())


def clipped_by_scrolling(w: QWidget, stop: QWidget) -> bool:
    """`w` lies in a scroll area (up to `stop`, itself one when the page scrolls) whose view
    does not show all of it: being scrolled out of view is not being cut."""
    p = w.parentWidget()
    while p is not None:
        if isinstance(p, QAbstractScrollArea):
            vp = p.viewport()
            return not vp.rect().contains(shown_rect(w, vp))
        if p is stop:
            break
        p = p.parentWidget()
    return False


def page_problems(w: MainWindow, key: str, where: str) -> list[str]:
    """What is wrong on the page on screen: scroll bars sideways, cut widgets."""
    page = w.pages.currentWidget()
    assert page is not None
    problems = []
    window_rect = w.rect()
    # Every scrolled view: the pages' scroll areas, lists, tables, text fields.
    areas = [page] if isinstance(page, QScrollArea) else []
    areas += [a for a in page.findChildren(QAbstractScrollArea) if a.isVisible()]
    for area in areas:
        if area.horizontalScrollBar().isVisible():
            name = area.accessibleName() or area.objectName() or type(area).__name__
            problems.append(f"{where}: {name} scrolls sideways")
    kinds = (QAbstractButton, QComboBox, QLineEdit, QLabel)
    for widget in page.findChildren(QWidget):
        if not isinstance(widget, kinds) or not widget.isVisible() or not widget.isVisibleTo(w):
            continue
        if clipped_by_scrolling(widget, page):
            continue
        name = (
            widget.accessibleName()
            or getattr(widget, "text", lambda: "")()[:30]
            or type(widget).__name__
        )
        rect = shown_rect(widget, w)
        if not window_rect.contains(rect):
            problems.append(f"{where}: {name!r} lies outside the window ({rect.getRect()})")
        if isinstance(widget, QLabel) and widget.wordWrap():
            if widget.height() < widget.heightForWidth(widget.width()):
                problems.append(f"{where}: {name!r} has lines cut off")
            continue
        hint = widget.minimumSizeHint()
        if isinstance(widget, QLabel):
            hint = widget.sizeHint() if not widget.text().startswith("<") else hint
        if hint.isValid() and widget.width() + 1 < hint.width():
            problems.append(f"{where}: {name!r} is {widget.width()} px wide, needs {hint.width()}")
    return problems


def stored_chat(w: MainWindow) -> int:
    assert w.store is not None
    c = w.store.create_conversation("Rivers of Europe")
    for i in range(4):
        w.store.add_message(c.id, "user", f"Question {i}: which rivers cross three countries?")
        w.store.add_message(
            c.id,
            "assistant",
            "\n\n".join(
                f"Part {j}: the Danube flows through ten countries, the Rhine through six, "
                "and both carry more barges than any other river on the continent."
                for j in range(5)
            ),
        )
    return c.id


def test_every_page_at_three_sizes_in_light_and_dark(
    window: MainWindow, qtbot: QtBot, tmp_path: Path
) -> None:
    w = window
    cid = stored_chat(w)
    w.open_conversation(cid)
    assert w.conversation_list is not None
    w.conversation_list.refresh()
    keys = w.page_keys()
    assert keys == ["chat", "models", "downloads", "documents", "server", "benchmark"]
    problems: list[str] = []
    for scheme in ("light", "dark"):
        w.set_scheme(scheme)
        pal = w.palette()
        for fg, bg in (
            (QPalette.ColorRole.WindowText, QPalette.ColorRole.Window),
            (QPalette.ColorRole.Text, QPalette.ColorRole.Base),
            (QPalette.ColorRole.ButtonText, QPalette.ColorRole.Button),
        ):
            if contrast(pal, fg, bg) < MIN_CONTRAST:
                problems.append(f"{scheme}: {fg.name} on {bg.name} is hard to read")
        for width, height in SIZES:
            w.resize(width, height)
            for key in keys:
                w.show_page(key)
                settle(qtbot)
                where = f"{scheme} {width}x{height} {key}"
                assert (w.width(), w.height()) == (width, height), where
                found = page_problems(w, key, where)
                if found:  # what the screen showed, for the failure's reader
                    page_shot = tmp_path / f"{scheme}-{width}x{height}-{key}.png"
                    grab_screen(w).save(str(page_shot))
                    found = [f"{p} (screenshot {page_shot})" for p in found]
                problems += found
                if key != "chat":
                    continue
                view = w.chat_view
                shot = tmp_path / f"{scheme}-{width}x{height}.png"
                problems += [f"{where}: {p}" for p in end_of_chat_problems(view, shot)]
                composer = view.input
                if not composer.isVisible() or not w.rect().contains(shown_rect(composer, w)):
                    problems.append(f"{where}: the composer is not in view")
                # The rail and the model bar are painted (text on the palette's background).
                for part in (w.rail, w.model_bar):
                    share = ink_share(ink_mask(grab_screen(part)), part.rect())
                    if share < MIN_INK_SHARE:
                        problems.append(f"{where}: {type(part).__name__} shows no ink")
    assert not problems, "\n".join(problems)
