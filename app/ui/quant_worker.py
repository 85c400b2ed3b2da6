"""The Compare quants thread: a QThread whose worker makes the asked quants, scores every
candidate against the reference (`app.services.quant_compare.run_comparison`) and hands the
comparison back through queued signals. It also reads the library's files for the tab's lists
(`scan_library`: a header a file), so a slow disk never stalls the window. It never touches
a widget.

Cancelling is a `threading.Event` checked between chunks and tensors (the thread is busy
running, so a queued call would wait for the end)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal, Slot

from app.services.library import LibraryError, ModelLibrary
from app.services.quant_compare import (
    CompareJob,
    Comparison,
    LibraryScan,
    run_comparison,
    scan_library,
)
from app.services.speed_records import SpeedService
from app.ui.thread_host import JobHost
from engine.bench.quality_pass import QualityCancelled
from engine.bench.result import BenchError
from engine.errors import EngineError, LoadCancelled
from engine.model.gguf import GGUFError
from engine.model.quant_types import QuantizeError
from engine.native.load_probe import FirstLoads
from engine.native.quantize_process import QuantizeCancelled

log = logging.getLogger("candlewick.ui")

Runner = Callable[..., Comparison]


@dataclass(frozen=True)
class QuantServices:
    """What a comparison needs: the library, the speed records and predictions, the folder
    of kept reference scores, and where the last comparison is saved."""

    library: ModelLibrary
    speed: SpeedService
    cache_dir: Path
    saved: Path
    first_loads: FirstLoads | None = None  # the app's: first loads tried in a child


class QuantWorker(QObject):
    progress = Signal(str, int, int)  # phase, done, total
    finished = Signal(object)  # Comparison (saved)
    cancelled = Signal()
    failed = Signal(str)  # one line for the user
    scanned = Signal(object)  # LibraryScan

    def __init__(self, services: QuantServices, runner: Runner = run_comparison) -> None:
        super().__init__()
        self.services = services
        self.runner = runner

    @Slot()
    def scan(self) -> None:
        try:
            found = scan_library(self.services.library)
        except Exception as e:  # a bug: the view must still hear that the read ended
            log.exception("reading the library for Compare quants failed")
            found = LibraryScan(error=f"The library could not be read: internal error ({e})")
        self.scanned.emit(found)

    @Slot(object, object)
    def run(self, job: CompareJob, cancel: threading.Event) -> None:
        s = self.services
        try:
            if cancel.is_set():
                raise LoadCancelled("cancelled")
            comparison = self.runner(
                job,
                s.library,
                s.speed,
                s.cache_dir,
                progress=lambda phase, done, total: self.progress.emit(phase, done, total),
                cancel=cancel,
                first_loads=s.first_loads,
            )
            comparison.save(s.saved)
        except (LoadCancelled, QuantizeCancelled, QualityCancelled):
            self.cancelled.emit()
        except (EngineError, GGUFError, BenchError, QuantizeError, LibraryError, OSError) as e:
            if cancel.is_set():
                self.cancelled.emit()
            else:
                self.failed.emit(f"Comparison could not run: {e}")
        except MemoryError:
            self.failed.emit("Not enough memory to score the files")
        except Exception as e:  # a bug: the view must still hear that the run ended
            log.exception("quant comparison failed")
            self.failed.emit(f"Comparison failed: internal error ({type(e).__name__}: {e})")
        else:
            self.finished.emit(comparison)


class QuantHost(JobHost[QuantWorker]):
    """GUI-side handle on the Compare quants thread: `run(CompareJob)`, and `scan()` the
    library (its answer, `worker.scanned`, comes after any run in progress)."""

    _scan = Signal()

    def __init__(self, worker: QuantWorker, parent: QObject | None = None) -> None:
        super().__init__(worker, "candlewick-quants", worker.run, parent)
        self._scan.connect(worker.scan, Qt.ConnectionType.QueuedConnection)

    def scan(self) -> None:
        self.start()
        self._scan.emit()
