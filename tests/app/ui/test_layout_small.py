"""The real main window at 1000x700 and at 1600x1000: the chat keeps its width while the side
panels give way (the performance panel folds away and comes back), nothing in the side panels
is cut, the Download tab's tables show their headers and a few rows, and the Local server
window's request log shows its Status column and a dozen rows."""

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
from app.ui.side_panels import CHAT_ENOUGH, fit
from engine.server.request_log import RequestRecord
from tests.app.ui.test_ui_window import close_window

pytestmark = pytest.mark.qt_log_ignore(
    "This plugin does not support propagateSizeHints", "This plugin does not support raise"
)
# At 1000 px the chat gets at least 55% (550 px: 75-80 characters of its text a line, a
# comfortable measure); the library beside it keeps its own width, the performance panel
# folds. Before, the chat got a third.
CHAT_SHARE = 0.55


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
    return w.splitter.widget(1).width()


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


def test_fit_gives_way_to_the_chat() -> None:
    need = (360, 250)
    # Wide: the sides keep the widths asked for.
    assert fit(1580, (460, 290), need) == (460, 830, 290)
    # A bit narrower: both shrink toward their need, the chat keeps CHAT_ENOUGH.
    left, chat, right = fit(1300, (460, 290), need)
    assert chat == CHAT_ENOUGH and 360 < left < 460 and 250 < right < 290
    assert left + chat + right == 1300
    # 1000 px: both no longer fit: the right one folds, the left keeps what it can.
    left, chat, right = fit(980, (460, 290), need)
    assert right == 0 and left >= 360 and chat >= CHAT_SHARE * 1000
    # Folded by the user: stays folded; a left panel wider than its share gives way.
    assert fit(1580, (460, 0), need) == (460, 1120, 0)
    assert fit(980, (700, 0), need)[1] >= CHAT_SHARE * 1000


def test_at_1000x700_the_chat_keeps_its_width_and_nothing_is_cut(window: MainWindow) -> None:
    w = window
    at(w, 1000, 700)
    assert chat_width(w) >= CHAT_SHARE * w.width()
    assert w.splitter.sizes()[2] == 0  # the performance panel folded away
    # The library: every part in view, the memory legend and the Engine row whole.
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
    picker = w.engine_picker
    assert picker is not None
    assert picker.width() >= picker.minimumSizeHint().width()
    right = picker.manage_button.mapTo(
        w.splitter.widget(1), picker.manage_button.rect().topRight()
    ).x()
    assert right < chat_width(w)


def test_at_1000x700_the_download_tables_show_headers_and_rows(window: MainWindow) -> None:
    w = window
    at(w, 1000, 700)
    view = w.findChild(ModelManagerView)
    assert view is not None
    w.side_tabs.setCurrentWidget(view)
    settle()
    area = area_of(view)
    assert not area.horizontalScrollBar().isVisible()
    for table in (view.results, view.files, view.jobs, view.local):
        header_fits(table)
        assert shown_in(table.horizontalHeader(), area)
        rows = table.viewport().height() / table.verticalHeader().defaultSectionSize()
        assert rows >= 2, rows  # the old layout left one row or less
    assert view.local.rowCount() >= 1  # the bundled model, in its row


def test_the_server_log_shows_status_and_rows(window: MainWindow, qtbot: QtBot) -> None:
    panel = window.findChild(ServerPanel)
    assert panel is not None
    panel.log_model.add(
        [
            RequestRecord("POST", "/v1/chat/completions", "127.0.0.1:50123", 200, 20, 30, 0.8)
            for _ in range(40)
        ]
    )
    sizes = []
    for size in (None, (960, 640)):  # its first size (on this 800 px screen), then a
        if size is not None:  # window on a 1000x700 screen
            panel.resize(*size)
        panel.show()
        qtbot.waitExposed(panel)
        settle()
        log = panel.log_view
        header = log.horizontalHeader()
        status = panel.log_model.COLUMNS.index("Status")
        right = header.sectionViewportPosition(status) + header.sectionSize(status)
        assert 0 < right <= log.viewport().width()
        assert header.length() <= log.viewport().width()  # no column off to the side
        rows = log.viewport().height() / log.rowHeight(0)
        assert rows >= 10, (panel.size(), rows)  # two before
        sizes.append(panel.size())
    screen = panel.screen().availableGeometry()
    assert sizes[0].width() <= max(screen.width(), panel.minimumSizeHint().width())
    panel.hide()


def test_at_1600x1000_nothing_got_worse(window: MainWindow) -> None:
    w = window
    at(w, 1600, 1000)
    left, chat, right = w.splitter.sizes()
    assert (left, right) == (460, 290)  # both side panels at their widths
    assert chat >= CHAT_SHARE * 1600 - 100 and chat >= CHAT_ENOUGH
    perf = w.perf_area
    assert not perf.horizontalScrollBar().isVisible()
    assert not perf.verticalScrollBar().isVisible()
    for part in (w.perf_panel.labels["cpu"], w.perf_panel.chart.range_box, w.perf_panel.chart.view):
        assert shown_in(part, perf)
    header_fits(w.library_panel.table)
    view = w.findChild(ModelManagerView)
    assert view is not None
    w.side_tabs.setCurrentWidget(view)
    settle()
    area = area_of(view)
    assert not area.verticalScrollBar().isVisible()  # the whole Download tab in view
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
        assert w.splitter.sizes()[2] == 0
        at(w, 1600, 1000)
        assert w.splitter.sizes()[2] == 290
        at(w, 1000, 700)  # closed while folded by the narrow window
    finally:
        close_window(w)
    w2 = build_window(model_manager=True)
    try:
        w2.show()
        qtbot.waitExposed(w2)
        assert w2.splitter.sizes()[2] == 0
        at(w2, 1600, 1000)
        assert w2.splitter.sizes() == [
            460,
            1600 - 12 - 2 * w2.splitter.handleWidth() - 460 - 290,
            290,
        ]
    finally:
        close_window(w2)


@pytest.mark.parametrize("tab", ["chat_settings", "documents"])
def test_at_1000x700_the_settings_and_documents_tabs_fit_without_scrolling_sideways(
    window: MainWindow, tab: str
) -> None:
    w = window
    page = getattr(w, tab)
    assert page is not None
    at(w, 1000, 700)
    w.side_tabs.setCurrentWidget(page)
    settle()
    area = area_of(page)
    assert not area.horizontalScrollBar().isVisible(), (
        f"{tab} needs {page.minimumSizeHint().width()} px, has {area.viewport().width()}"
    )
