"""The Benchmark page's Compare quants tab on precomputed results: the saved comparison is
shown when the tab opens (rows -> table, scatter points at speed and KL divergence, marker
size by memory), a limit changed re-chooses and is saved; a run goes through the worker
thread (progress, running on and off, the new comparison saved), a cancelled one keeps what
was shown. The library's files are read on the worker's thread: the view answers while a
slow disk holds that read. On SmolLM2: the real quality pass with a Q4_0 made from the bundled
Q4_1."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt, QTimer
from pytestqt.qtbot import QtBot

from app.services.library import LibraryEntry, ModelLibrary
from app.services.local_quants import quantize_model
from app.services.quant_compare import CompareJob, Comparison
from app.services.speed_records import SpeedService, file_key
from app.ui.quant_compare_view import QuantCompareView
from app.ui.quant_worker import QuantHost, QuantServices, QuantWorker
from engine.bench.quality_pass import QualityCancelled
from engine.bench.quant_choice import FileMemory, FileSpeed, Thresholds, choose, options_of
from tests.quant_rows import ROWS, quality_result

SPEEDS = {"ref-Q8_0.gguf": 90.0, "m-Q4_1.gguf": 120.0, "m-Q4_0.gguf": 130.0, "m-Q2_K.gguf": 150.0}
MEMORY = {"ref-Q8_0.gguf": 400e6, "m-Q4_1.gguf": 300e6, "m-Q4_0.gguf": 290e6, "m-Q2_K.gguf": 250e6}


def comparison(thresholds: Thresholds) -> Comparison:
    r = quality_result(*ROWS)
    speeds = {f"/m/{n}": FileSpeed(tokens_per_s=v, source="measured") for n, v in SPEEDS.items()}
    memory = {
        f"/m/{n}": FileMemory(total_bytes=int(v), fits=True, verdict_text="fits in RAM only")
        for n, v in MEMORY.items()
    }
    return Comparison(r, choose(options_of(r, speeds, memory), thresholds))


def make_view(
    qtbot: QtBot,
    tmp_path: Path,
    runner: Callable[..., Comparison] | None = None,
    library: ModelLibrary | None = None,
) -> QuantCompareView:
    services = QuantServices(
        library or ModelLibrary(tmp_path / "models", discovery=False),
        SpeedService(tmp_path / "data"),
        tmp_path / "cache",
        tmp_path / "data" / "compare.json",
    )
    worker = QuantWorker(services) if runner is None else QuantWorker(services, runner)
    view = QuantCompareView(QuantHost(worker))
    qtbot.addWidget(view)
    return view


def read_library(qtbot: QtBot, view: QuantCompareView) -> QuantCompareView:
    """The view once its first read of the library has come back from the worker."""
    qtbot.waitUntil(lambda: not view.scanning, timeout=10_000)
    return view


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "compare.json"
    comparison(Thresholds(max_kld=0.05)).save(path)
    return path


@pytest.fixture
def view(qtbot: QtBot, tmp_path: Path, saved: Path) -> Iterator[QuantCompareView]:
    v = make_view(qtbot, tmp_path)
    yield v
    v.shutdown()


def _column(view: QuantCompareView, col: int) -> list[str]:
    return [view.table.item(r, col).text() for r in range(view.table.rowCount())]


def test_the_saved_comparison_shows_as_table_scatter_and_sentence(view: QuantCompareView) -> None:
    assert view.max_kld.value() == pytest.approx(0.05)
    assert view.min_speed.value() == 0 and view.min_speed.text() == "no limit"
    assert _column(view, 0) == [
        "ref-Q8_0.gguf (reference)",
        "m-Q4_1.gguf",
        "m-Q4_0.gguf",
        "m-Q2_K.gguf",
    ]
    assert _column(view, 3) == ["0 (reference)", "0.0120", "0.0300", "0.4000"]
    assert _column(view, 5) == ["90", "120", "130", "150"]
    assert _column(view, 6) == ["measured"] * 4
    assert _column(view, 7) == ["400 MB", "300 MB", "290 MB", "250 MB"]
    assert _column(view, 9) == ["", "", "recommended", "left out"]
    assert view.table.item(2, 0).font().bold() and not view.table.item(1, 0).font().bold()
    assert view.table.item(3, 9).toolTip() == "KL divergence 0.4000 is over 0.05"
    assert "Run m-Q4_0.gguf" in view.sentence.text()
    pts = {p.name: p for p in view.chart.points}
    assert [(pts[n].x, pts[n].y) for n in ("m-Q4_0.gguf", "m-Q2_K.gguf")] == [
        (130.0, 0.03),
        (150.0, 0.4),
    ]
    sizes = [pts[n].size for n in ("m-Q2_K.gguf", "m-Q4_0.gguf", "m-Q4_1.gguf", "ref-Q8_0.gguf")]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]  # more memory, a larger marker
    assert [p.name for p in view.chart.points if p.chosen] == ["m-Q4_0.gguf"]
    assert view.chart.kld_line.isVisible() and view.chart.kld_line.value() == pytest.approx(0.05)
    assert not view.chart.speed_line.isVisible()
    spots = view.chart.scatter.data
    assert sorted(zip(spots["x"], spots["y"], strict=True)) == sorted(
        (p.x, p.y) for p in view.chart.points
    )


def test_limits_change_the_recommendation_and_are_saved(
    view: QuantCompareView, saved: Path
) -> None:
    view.max_kld.setValue(0.02)
    assert "Run m-Q4_1.gguf" in view.sentence.text()
    view.min_speed.setValue(125)
    assert view.sentence.text() == (
        "<b>None of the 4 files qualifies: ref-Q8_0.gguf 90 tokens/s (measured) is under 125; "
        "m-Q4_1.gguf 120 tokens/s (measured) is under 125; m-Q4_0.gguf KL divergence 0.0300 "
        "is over 0.02; m-Q2_K.gguf KL divergence 0.4000 is over 0.02.</b>"
    )
    assert not any(p.chosen for p in view.chart.points)
    assert view.chart.speed_line.isVisible() and view.chart.speed_line.value() == 125
    view.max_kld.setValue(0)  # no limit
    assert "Run m-Q2_K.gguf" in view.sentence.text()
    kept = Comparison.load(saved)
    assert kept.choice.thresholds == Thresholds(max_kld=None, min_tokens_per_s=125)
    assert kept.choice.chosen == "m-Q2_K.gguf"


def test_a_run_goes_through_the_worker_and_is_saved(
    qtbot: QtBot, tmp_path: Path, saved: Path
) -> None:
    seen: list[CompareJob] = []

    def runner(job: CompareJob, *_a: Any, progress: Any, **_kw: Any) -> Comparison:
        seen.append(job)
        progress("candidate m-Q4_0.gguf", 1, 2)
        return comparison(job.thresholds)

    view = read_library(qtbot, make_view(qtbot, tmp_path, runner))
    try:
        assert view.reference.count() == 1  # the bundled model; no other quant of it yet
        assert view.candidates.count() == 0
        assert not view.run()  # nothing to compare with
        assert "at least one candidate" in view.error_label.text()
        view.make["Q2_K"].setChecked(True)
        view.max_kld.setValue(0.5)
        # The worker's own signals come from its thread: the view's say what the page saw.
        with qtbot.waitSignals(
            [view.running_changed, view.running_changed],
            check_params_cbs=[lambda on: on is True, lambda on: on is False],
            order="strict",
            timeout=10_000,
        ):
            assert view.run()
        qtbot.waitUntil(lambda: not view.running)
        assert seen[0].make == ["Q2_K"] and seen[0].thresholds.max_kld == 0.5
        assert view.status.text().startswith("Done")
        assert "Run m-Q2_K.gguf" in view.sentence.text()
        assert Comparison.load(saved).choice.chosen == "m-Q2_K.gguf"
    finally:
        view.shutdown()


def test_a_cancelled_run_keeps_what_was_shown(qtbot: QtBot, tmp_path: Path, saved: Path) -> None:
    def runner(job: CompareJob, *_a: Any, progress: Any, **_kw: Any) -> Comparison:
        raise QualityCancelled("cancelled")

    view = read_library(qtbot, make_view(qtbot, tmp_path, runner))
    try:
        view.make["Q4_0"].setChecked(True)
        assert view.run()
        qtbot.waitUntil(lambda: not view.running, timeout=10_000)
        assert view.status.text().startswith("Cancelled")
        assert "Run m-Q4_0.gguf" in view.sentence.text()
        assert view.run_button.isEnabled() and not view.cancel_button.isEnabled()
    finally:
        view.shutdown()


class SlowDisk(ModelLibrary):
    """A library whose listing waits until `gate` opens, as a slow or sleeping disk does."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, discovery=False)
        self.gate = threading.Event()
        self.reading = threading.Event()
        self.reads = 0

    def entries(self) -> list[LibraryEntry]:
        self.reads += 1
        self.reading.set()
        self.gate.wait(30)
        return super().entries()


def test_the_view_answers_while_a_slow_disk_holds_the_library(
    qtbot: QtBot, tmp_path: Path, saved: Path
) -> None:
    library = SlowDisk(tmp_path / "models")
    view = make_view(qtbot, tmp_path, library=library)  # returns while the read is held
    try:
        qtbot.waitUntil(library.reading.is_set)
        assert view.scanning and view.reference.count() == 0
        assert view.reference.placeholderText() == "Reading the library…"
        assert not view.run_button.isEnabled()
        # The GUI thread goes on: the saved comparison is shown, a limit re-chooses, and
        # events posted now are handled before the read ends.
        assert "Run m-Q4_0.gguf" in view.sentence.text()
        view.max_kld.setValue(0.02)
        assert "Run m-Q4_1.gguf" in view.sentence.text()
        handled: list[bool] = []
        QTimer.singleShot(0, lambda: handled.append(True))
        qtbot.waitUntil(lambda: handled == [True])
        assert view.scanning and not library.gate.is_set()
        view.refresh_library()  # asked again meanwhile: read once more after this one
        with qtbot.waitSignal(view.library_read, timeout=10_000):
            library.gate.set()
        assert library.reads == 2 and not view.scanning
        assert view.reference.count() == 1 and view.run_button.isEnabled()
    finally:
        library.gate.set()
        view.shutdown()


@pytest.mark.slow
def test_smollm2_against_a_q4_0_made_from_it(
    qtbot: QtBot, tmp_path: Path, smollm2_path: Path
) -> None:
    """The real pass on one chunk; the speeds as the chat measured them (so no probe runs)."""
    services_lib = ModelLibrary(tmp_path / "models", discovery=False)
    q4 = quantize_model(services_lib, str(smollm2_path), "Q4_0", allow_requantize=True)
    speed = SpeedService(tmp_path / "data")
    for path, tps in ((smollm2_path, 100.0), (q4.result.output, 125.0)):
        for _ in range(3):
            speed.records.measured(file_key(path.name, path.stat().st_size), tps)
    view = read_library(qtbot, make_view(qtbot, tmp_path))
    try:
        ref = next(i for i in range(view.reference.count()) if "Q4_1" in view.reference.itemText(i))
        view.reference.setCurrentIndex(ref)
        assert [view.candidates.item(i).text()[:20] for i in range(view.candidates.count())]
        assert view.candidates.item(0).checkState() == Qt.CheckState.Checked
        view.chunks.setValue(1)
        view.ctx = 128  # one short chunk: the pass is real, and quick
        view.max_kld.setValue(0)
        view.min_speed.setValue(110)
        assert view.run()
        qtbot.waitUntil(lambda: not view.running, timeout=120_000)
        assert view.status.text().startswith("Done"), view.error_label.text()
        choice = view.comparison.choice if view.comparison else None
        assert choice is not None and len(choice.options) == 2
        ref_opt, cand = choice.options
        assert ref_opt.reference and cand.quantization == "Q4_0" and cand.kld_mean > 0
        assert cand.memory.fits is True and cand.memory.total_bytes
        assert choice.chosen == cand.name  # the smaller file and fast enough
        assert choice.excluded == {ref_opt.name: "100 tokens/s (measured) is under 110"}
        view.min_speed.setValue(0)
        view.max_kld.setValue(cand.kld_mean / 2)
        assert view.comparison is not None and view.comparison.choice.chosen == ref_opt.name
    finally:
        view.shutdown()
