"""The benchmark results as a Qt table model: one row per concurrency level, units in the
headers. DisplayRole is the formatted text; `RAW_ROLE` the number as measured (None when the
level has no such figure), for sorting, copying and tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, QPersistentModelIndex, Qt

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
        "Generation\n(tokens/s per request)",
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
