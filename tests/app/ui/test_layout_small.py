"""The real main window at 1000x700 and at 1600x1000: on the Chat page the chat keeps its
width while the panels beside it give way (the performance panel folds away and comes back),
nothing on the Models page is cut, the Downloads page's tables show their headers and a few
rows, and the Local server page's request log shows its Status column and a dozen rows."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import QRect
from PySide6.QtWidgets import QApplication, QScrollArea, QTableView, QWidget
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.ui.main_window import MainWindow
from app.ui.model_manager import ModelManagerView
from app.ui.server_panel import ServerPanel
from app.ui.side_panels import CHAT_MIN, fit_panels
from engine.server.request_log import RequestRecord
from tests.app.ui.test_ui_window import close_window

pytestmark = pytest.mark.qt_log_ignore(
    "This plugin does not support propagateSizeHints", "This plugin does not support raise"
)


def settle() -> None:
    for _ in range(5):
        QApplication.processEvents()


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = build_window(model_manager=True)
    w.show()
    qtbot.waitExposed(w)
    yield w
    close_window(w)


def at(w: MainWindow, width: int, height: int) -> None:
    w.resize(width, height)
    settle()
    assert (w.width(), w.height()) == (width, height)


def chat_width(w: MainWindow) -> int:
    return w.chat_page.centre.width()


def area_of(page: QWidget) -> QScrollArea:
    holder = page.parentWidget()
    area = holder.parentWidget().parentWidget() if holder is not None else None
    assert isinstance(area, QScrollArea)
    return area


def shown_in(widget: QWidget, area: QScrollArea) -> bool:
    """`widget` lies wholly inside what `area` shows."""
    view = area.viewport()
    rect = QRect(widget.mapTo(view, widget.rect().topLeft()), widget.size())
    return view.rect().contains(rect)


def header_fits(table: QTableView) -> None:
    """The header shows every column's title in full, without scrolling sideways."""
    header = table.horizontalHeader()
    assert header.isVisible()
    assert header.length() <= table.viewport().width()
    fm = header.fontMetrics()
    model = table.model()
    for col in range(model.columnCount()):
        title = str(model.headerData(col, header.orientation()))
        assert header.sectionSize(col) >= fm.horizontalAdvance(title), title


def test_fit_panels_gives_way_to_the_chat() -> None:
    widths = {"sidebar": 250, "drawer": 330, "perf": 290}
    auto: dict[str, bool | None] = {"sidebar": None, "drawer": None, "perf": None}
    order = ["sidebar", "perf", "drawer"]
    # Wide: everything never toggled shows.
    assert fit_panels(1600, widths, auto, order) == {"sidebar", "drawer", "perf"}
    # 900 px: the sidebar only; the chat keeps its least width.
    assert fit_panels(900, widths, auto, order) == {"sidebar"}
    # The drawer opened last goes first: the sidebar gives way to it, and in a small window
    # it shows while the chat column keeps what it cannot do without.
    opened = {**auto, "drawer": True}
    assert fit_panels(900, widths, opened, ["drawer", *order[:2]]) == {"drawer"}
    assert fit_panels(800, widths, opened, ["drawer", *order[:2]], 450) == {"drawer"}
    assert fit_panels(800, widths, auto, order, 450) == {"sidebar"}
    # Hidden by the user: stays hidden however wide the window.
    assert fit_panels(3000, widths, {**auto, "perf": False}, order) == {"sidebar", "drawer"}
    assert fit_panels(CHAT_MIN - 1, widths, auto, order) == set()


def test_at_1000x700_the_chat_keeps_its_width_and_nothing_is_cut(window: MainWindow) -> None:
    w = window
    at(w, 1000, 700)
    assert w.current_page() == "chat"
    page = w.chat_page
    assert chat_width(w) >= CHAT_MIN
    assert page.shown("sidebar") and not page.shown("perf") and not page.shown("drawer")
    # The model bar and the engine row whole, inside the chat column.
    for bar in (w.model_bar, w.engine_picker):
        assert bar is not None
        assert bar.width() >= bar.minimumSizeHint().width(), type(bar).__name__
    picker = w.engine_picker
    assert picker is not None
    right = picker.manage_button.mapTo(page.centre, picker.manage_button.rect().topRight()).x()
    assert right < chat_width(w)
    # Opening the settings drawer: it shows, the sidebar gives way, the chat column is whole.
    page.toggles["drawer"].click()
    settle()
    assert page.shown("drawer") and not page.shown("sidebar")
    assert chat_width(w) >= page.centre.minimumSizeHint().width()
    assert not page.areas["drawer"].horizontalScrollBar().isVisible()
    page.toggles["drawer"].click()
    settle()
    assert page.shown("sidebar") and not page.shown("drawer")

    # The Models page: the library, every part in view, the memory legend whole.
    w.show_page("models")
    settle()
    lp = w.library_panel
    area = area_of(lp)
    assert not area.horizontalScrollBar().isVisible()
    est = lp.estimate
    assert est.legend.text()  # the estimate of the default model is shown
    for part in (
        lp.table,
        est.legend,
        est.placement,
        est.verdict,
        lp.load_button,
        lp.eject_button,
        lp.ctx_label,
        lp.gpu_auto,
        lp.draft_model,
    ):
        assert shown_in(part, area), part.accessibleName() or type(part).__name__
    for label in (est.legend, est.placement):
        assert label.height() >= label.heightForWidth(label.width())  # no line cut off
    header_fits(lp.table)  # the bundled model's whole name and every column


def test_at_1000x700_the_download_tables_show_headers_and_rows(window: MainWindow) -> None:
    w = window
    at(w, 1000, 700)
    view = w.findChild(ModelManagerView)
    assert view is not None
    w.show_page("downloads")
    assert w.page("downloads") is view
    settle()
    area = area_of(view)
    assert not area.horizontalScrollBar().isVisible()
    for table in (view.results, view.files, view.jobs, view.local):
        header_fits(table)
        assert shown_in(table.horizontalHeader(), area)
        rows = table.viewport().height() / table.verticalHeader().defaultSectionSize()
        assert rows >= 2, rows  # the old layout left one row or less
    assert view.local.rowCount() >= 1  # the bundled model, in its row


def test_the_server_log_shows_status_and_rows(window: MainWindow) -> None:
    panel = window.findChild(ServerPanel)
    assert panel is not None
    panel.log_model.add(
        [
            RequestRecord("POST", "/v1/chat/completions", "127.0.0.1:50123", 200, 20, 30, 0.8)
            for _ in range(40)
        ]
    )
    window.show_page("server")
    assert window.page("server") is panel
    for size, least in (((1000, 700), 8), ((1600, 1000), 16)):
        at(window, *size)
        log = panel.log_view
        header = log.horizontalHeader()
        status = panel.log_model.COLUMNS.index("Status")
        right = header.sectionViewportPosition(status) + header.sectionSize(status)
        assert 0 < right <= log.viewport().width()
        assert header.length() <= log.viewport().width()  # no column off to the side
        rows = log.viewport().height() / log.rowHeight(0)
        assert rows >= least, (size, rows)
        assert not area_of(panel).horizontalScrollBar().isVisible()


def test_at_1600x1000_nothing_got_worse(window: MainWindow) -> None:
    w = window
    at(w, 1600, 1000)
    page = w.chat_page
    assert page.shown("sidebar") and page.shown("perf")
    assert chat_width(w) >= CHAT_MIN
    perf = w.perf_area
    assert not perf.horizontalScrollBar().isVisible()
    assert not perf.verticalScrollBar().isVisible()
    for part in (w.perf_panel.labels["cpu"], w.perf_panel.chart.range_box, w.perf_panel.chart.view):
        assert shown_in(part, perf)
    w.show_page("models")
    settle()
    header_fits(w.library_panel.table)
    view = w.findChild(ModelManagerView)
    assert view is not None
    w.show_page("downloads")
    settle()
    area = area_of(view)
    assert not area.verticalScrollBar().isVisible()  # the whole Downloads page in view
    assert not area.horizontalScrollBar().isVisible()
    for table in (view.results, view.files, view.jobs, view.local):
        header_fits(table)
        assert shown_in(table, area)


def test_the_folded_panel_comes_back_in_a_wider_window_and_after_a_restart(qtbot: QtBot) -> None:
    w = build_window(model_manager=True)
    try:
        w.show()
        qtbot.waitExposed(w)
        at(w, 1000, 700)
        assert not w.chat_page.shown("perf")  # folded for the while: no room
        at(w, 1600, 1000)
        assert w.chat_page.shown("perf")
        w.chat_page.toggles["perf"].click()  # the user hides it
        assert not w.chat_page.shown("perf")
        at(w, 1000, 700)
    finally:
        close_window(w)
    w2 = build_window(model_manager=True)
    try:
        w2.show()
        qtbot.waitExposed(w2)
        at(w2, 1600, 1000)
        assert not w2.chat_page.shown("perf")  # the user's choice outlives the restart
        assert not w2.chat_page.toggles["perf"].isChecked()
        w2.chat_page.toggles["perf"].click()
        assert w2.chat_page.shown("perf")
    finally:
        close_window(w2)


@pytest.mark.parametrize("name", ["chat_settings", "documents"])
def test_at_1000x700_the_settings_and_documents_fit_without_scrolling_sideways(
    window: MainWindow, name: str
) -> None:
    w = window
    page = getattr(w, name)
    assert page is not None
    at(w, 1000, 700)
    assert w.reveal(page)
    settle()
    area = area_of(page) if name == "documents" else w.chat_page.areas["drawer"]
    assert not area.horizontalScrollBar().isVisible(), (
        f"{name} needs {page.minimumSizeHint().width()} px, has {area.viewport().width()}"
    )
    if name == "chat_settings":
        assert chat_width(w) >= w.chat_page.centre.minimumSizeHint().width()
