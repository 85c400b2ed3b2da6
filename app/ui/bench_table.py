"""The benchmark results as a Qt table model: one row per concurrency level, units in the
headers. DisplayRole is the formatted text; `RAW_ROLE` the number as measured (None when the
level has no such figure), for sorting, copying and tests.

`BenchTable` shows it with its columns as wide as their contents. All of them need about
900 px; in a narrower window the least useful are hidden (`DROP_ORDER`) rather than the
table scrolling sideways, which would hide the figures on the right. Right-clicking the header
shows or hides any column; what the person chose there stays, whatever the width."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QPoint,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QMenu, QTableView, QWidget

from engine.bench.metrics import LevelMetrics
from engine.bench.result import BenchResult

RAW_ROLE = Qt.ItemDataRole.UserRole + 1
MiB = 1 << 20

Index = QModelIndex | QPersistentModelIndex


@dataclass(frozen=True)
class LevelRow:
    """A level as the table shows it: its metrics, and whether a cancel cut it short."""

    level: LevelMetrics
    cancelled: bool = False


@dataclass(frozen=True)
class Column:
    header: str
    tip: str
    value: Callable[[LevelRow], Any]
    fmt: Callable[[Any], str]


def _num(digits: int) -> Callable[[Any], str]:
    return lambda v: "-" if v is None else f"{v:.{digits}f}"


def _mib(v: Any) -> str:
    return "-" if v is None else f"{v / MiB:,.0f}"


def _status(row: LevelRow) -> str:
    if row.cancelled:
        return "cancelled"
    failed = row.level.requests - row.level.succeeded
    return "done" if failed == 0 else f"{failed} failed"


def _slo(v: Any) -> str:
    return "-" if v is None else ("yes" if v else "no")


COLUMNS: tuple[Column, ...] = (
    Column(
        "Concurrent\nrequests",
        "requests in flight at once at this level",
        lambda r: r.level.concurrency,
        str,
    ),
    Column(
        "OK / sent",
        "requests that succeeded / requests sent",
        lambda r: r.level.succeeded,
        lambda _v: "",
    ),  # text filled in by the model
    Column(
        "Failures\n(%)",
        "errors and timeouts / requests",
        lambda r: 100.0 * r.level.failure_rate,
        _num(0),
    ),
    Column("TTFT p50\n(s)", "time to first token, median", lambda r: r.level.ttft_p50, _num(3)),
    Column(
        "TTFT p95\n(s)", "time to first token, 95th percentile", lambda r: r.level.ttft_p95, _num(3)
    ),
    Column(
        "Prompt\n(tokens/s)",
        "prompt tokens / TTFT, median over requests",
        lambda r: r.level.prompt_tps_p50,
        _num(1),
    ),
    Column(
        "Generation\n(tokens/s each)",
        "(completion tokens - 1) / (last token - first token), median over requests",
        lambda r: r.level.gen_tps_p50,
        _num(1),
    ),
    Column(
        "Latency p50\n(s)",
        "request sent to end of answer, median",
        lambda r: r.level.latency_p50,
        _num(2),
    ),
    Column(
        "Latency p95\n(s)",
        "request sent to end of answer, 95th percentile",
        lambda r: r.level.latency_p95,
        _num(2),
    ),
    Column(
        "Total\n(tokens/s)",
        "completion tokens of all requests / wall time of the level",
        lambda r: r.level.total_throughput_tps,
        _num(1),
    ),
    Column(
        "Peak RAM\n(MiB)",
        "resident memory of the whole app process, peak at this level",
        lambda r: r.level.peak_ram_bytes,
        _mib,
    ),
    Column(
        "Peak VRAM\n(MiB)",
        "GPU memory of this process (NVIDIA only); - when unknown",
        lambda r: r.level.peak_vram_bytes,
        _mib,
    ),
    Column(
        "Meets TTFT\nobjective",
        "TTFT p95 within the objective and no failures",
        lambda r: r.level.meets_slo,
        _slo,
    ),
    Column("Status", "done, cancelled part-way, or how many requests failed", _status, str),
)


class BenchTableModel(QAbstractTableModel):
    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._levels: list[LevelRow] = []

    def set_result(self, result: BenchResult | None) -> None:
        """Show a result's levels; the level a cancel cut short is marked cancelled."""
        rows = (
            [LevelRow(lv, result.level_cancelled(lv.concurrency)) for lv in result.levels]
            if result is not None
            else []
        )
        self.beginResetModel()
        self._levels = rows
        self.endResetModel()

    def level(self, row: int) -> LevelRow:
        return self._levels[row]

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._levels)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if (
            not index.isValid()
            or not 0 <= index.row() < len(self._levels)
            or not 0 <= index.column() < len(COLUMNS)
        ):
            return None
        row = self._levels[index.row()]
        col = COLUMNS[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            if index.column() == 1:
                return f"{row.level.succeeded} / {row.level.requests}"
            return col.fmt(col.value(row))
        if role == RAW_ROLE:
            return col.value(row)
        if role == Qt.ItemDataRole.TextAlignmentRole:
            if index.column() == len(COLUMNS) - 1:
                return int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if (
            role == Qt.ItemDataRole.ToolTipRole
            and index.column() == len(COLUMNS) - 1
            and row.level.error_samples
        ):
            return "\n".join(str(s) for s in row.level.error_samples)
        return None

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if orientation != Qt.Orientation.Horizontal or not 0 <= section < len(COLUMNS):
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section].header
        if role == Qt.ItemDataRole.ToolTipRole:
            return COLUMNS[section].tip
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable


# The columns hidden first when the window is too narrow for all, least useful first: the
# failures are in "OK / sent" too, the VRAM peak is "-" on most machines, and the medians
# have their 95th percentiles beside them.
DROP_ORDER = ("Failures", "Peak VRAM", "Latency p50", "TTFT p50", "Prompt")


def column_name(section: int) -> str:
    """A column's header on one line ("TTFT p50 (s)")."""
    return " ".join(COLUMNS[section].header.split("\n"))


def columns_to_hide(widths: Sequence[int], room: int, chosen: Mapping[int, bool]) -> set[int]:
    """The columns to hide: those the person hid (`chosen[i]` False), then those of
    `DROP_ORDER` the person did not ask for, one at a time, until the rest fit in `room`."""
    hidden = {i for i, on in chosen.items() if not on}
    need = sum(w for i, w in enumerate(widths) if i not in hidden)
    firsts = [c.header.split("\n")[0] for c in COLUMNS]
    for name in DROP_ORDER:
        if need <= room:
            break
        i = firsts.index(name)
        if i in hidden or chosen.get(i):
            continue
        hidden.add(i)
        need -= widths[i]
    return hidden


class BenchTable(QTableView):
    """The results table: columns fitted to the width (see the module's doc); `hidden_changed`
    carries the names of the columns hidden (for a note under the table)."""

    hidden_changed = Signal(list)

    def __init__(self, model: BenchTableModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setModel(model)
        self.chosen: dict[int, bool] = {}  # column -> shown, as the person chose
        # The headers' widths, kept from when each was shown (a hidden one's hint is 0).
        self._header_widths: dict[int, int] = {}
        self._hidden: list[str] = []
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.verticalHeader().hide()
        self.setWordWrap(False)
        header = self.horizontalHeader()
        # The stretched last column is never narrower than the default size: keep that to
        # what a column needs at least, or it would ask for room the fit did not count.
        header.setDefaultSectionSize(header.minimumSectionSize())
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        header.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        header.customContextMenuRequested.connect(self._header_menu)
        # The default levels (1, 2, 4) in view, even where the charts take the rest of a low
        # window.
        rows = 3 * self.verticalHeader().defaultSectionSize()
        self.setMinimumHeight(header.sizeHint().height() + rows + 2 * self.frameWidth())
        # After the reset the rows' widths are known (the view lays them out first).
        model.modelReset.connect(lambda: QTimer.singleShot(0, self.fit))

    def natural_width(self, section: int) -> int:
        """What the column needs, shown or not: its header or its widest figure."""
        header = self.horizontalHeader()
        if header.isSectionHidden(section):
            width = self._header_widths.get(section, 0)
        else:
            width = self._header_widths[section] = header.sectionSizeHint(section)
        return max(width, self.sizeHintForColumn(section))

    def fit(self) -> None:
        header = self.horizontalHeader()
        widths = [self.natural_width(i) for i in range(header.count())]
        hidden = columns_to_hide(widths, self.viewport().width(), self.chosen)
        for i in range(header.count()):
            if header.isSectionHidden(i) != (i in hidden):
                header.setSectionHidden(i, i in hidden)
        names = [column_name(i) for i in sorted(hidden)]
        if names != self._hidden:
            self._hidden = names
            self.hidden_changed.emit(names)

    def resizeEvent(self, e: QResizeEvent) -> None:
        super().resizeEvent(e)
        self.fit()

    def header_menu(self) -> QMenu:
        """Each column, ticked when shown: unticking hides it, ticking shows it (for good,
        whatever the width); "Fit to the window" forgets those choices."""
        menu = QMenu(self)
        header = self.horizontalHeader()
        for i in range(header.count()):
            act = menu.addAction(column_name(i))
            act.setCheckable(True)
            act.setChecked(not header.isSectionHidden(i))
            act.toggled.connect(self._chooser(i))
        menu.addSeparator()
        menu.addAction("Fit to the window", self.fit_to_window)
        return menu

    def _chooser(self, section: int) -> Callable[[bool], None]:
        def choose(shown: bool) -> None:
            self.chosen[section] = shown
            self.fit()

        return choose

    def fit_to_window(self) -> None:
        self.chosen.clear()
        self.fit()

    def _header_menu(self, pos: QPoint) -> None:
        menu = self.header_menu()
        menu.exec(self.horizontalHeader().viewport().mapToGlobal(pos))
        menu.deleteLater()
