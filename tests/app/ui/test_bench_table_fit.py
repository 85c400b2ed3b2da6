"""The benchmark table fits its width: in a narrow window the least useful columns hide
(failures, VRAM, the medians), never the figures a run is read by; the header's menu shows
or hides any column for good, and "Fit to the window" forgets that."""

from __future__ import annotations

from PySide6.QtWidgets import QMenu
from pytestqt.qtbot import QtBot

from app.ui.bench_table import (
    COLUMNS,
    DROP_ORDER,
    BenchTable,
    BenchTableModel,
    column_name,
    columns_to_hide,
)

FIRST = {c.header.split("\n")[0]: i for i, c in enumerate(COLUMNS)}


def test_columns_to_hide_drops_in_order_until_it_fits() -> None:
    widths = [100] * len(COLUMNS)
    everything = 100 * len(COLUMNS)
    assert columns_to_hide(widths, everything, {}) == set()
    assert columns_to_hide(widths, everything - 1, {}) == {FIRST[DROP_ORDER[0]]}
    assert columns_to_hide(widths, everything - 150, {}) == {FIRST[n] for n in DROP_ORDER[:2]}
    # What the person asked for wins: a column they showed stays, one they hid stays hidden.
    shown = {FIRST["Failures"]: True, FIRST["Status"]: False}
    assert columns_to_hide(widths, everything - 150, shown) == {
        FIRST["Status"],
        FIRST["Peak VRAM"],
    }
    # Never more than the drop list, however narrow.
    assert columns_to_hide(widths, 0, {}) == {FIRST[n] for n in DROP_ORDER}


def test_the_table_hides_columns_in_a_narrow_window_and_the_menu_chooses(qtbot: QtBot) -> None:
    table = BenchTable(BenchTableModel())
    qtbot.addWidget(table)
    notes: list[list[str]] = []
    table.hidden_changed.connect(notes.append)
    header = table.horizontalHeader()
    table.resize(2000, 300)
    table.show()
    qtbot.waitExposed(table)
    table.fit()
    assert not any(header.isSectionHidden(i) for i in range(len(COLUMNS)))
    need = sum(table.natural_width(i) for i in range(len(COLUMNS)))
    frame = table.width() - table.viewport().width()
    table.resize(need + frame - 10, 300)  # a little short: the first of the list goes
    table.fit()
    failures = FIRST["Failures"]
    assert [i for i in range(len(COLUMNS)) if header.isSectionHidden(i)] == [failures]
    assert notes[-1] == [column_name(failures)] == ["Failures (%)"]
    assert not table.horizontalScrollBar().isVisible()
    # Shown from the header's menu: it stays, and the next one in the list gives way.
    menu = table.header_menu()
    (act,) = [a for a in menu.actions() if a.text() == "Failures (%)"]
    assert not act.isChecked()
    act.setChecked(True)
    assert not header.isSectionHidden(failures)
    assert header.isSectionHidden(FIRST["Peak VRAM"])
    # Hidden from the menu, whatever the width.
    status = FIRST["Status"]
    (act,) = [a for a in table.header_menu().actions() if a.text() == "Status"]
    act.setChecked(False)
    table.resize(3000, 300)
    table.fit()
    assert [i for i in range(len(COLUMNS)) if header.isSectionHidden(i)] == [status]
    (fit,) = [a for a in table.header_menu().actions() if a.text() == "Fit to the window"]
    fit.trigger()
    assert not any(header.isSectionHidden(i) for i in range(len(COLUMNS))) and notes[-1] == []
    assert isinstance(menu, QMenu)
