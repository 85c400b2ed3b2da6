"""The benchmark thread: a QThread whose worker object runs `engine.bench.embedded` on the
model the chat has loaded (found in the engine thread's model host) and renders the charts,
then hands the result back through queued signals. It never touches a widget.

The thread (a `JobHost`) starts on the first run and ends at shutdown. Cancelling is a
`threading.Event` (the harness checks it before every token), not a queued call: the thread
is busy running.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from app.ui.thread_host import JobHost, forget_python_thread
from engine.bench.harness import BenchConfig, Progress
from engine.bench.result import BenchResult
from engine.bench.workloads import Workload
from engine.errors import EngineError, LoadCancelled
from engine.host.host import ModelHost
from engine.model.gguf import GGUFError

log = logging.getLogger("candlewick.ui")


@dataclass(frozen=True)
class BenchRequest:
    model: str  # the loaded model's name in the model host
    workload: Workload
    config: BenchConfig
    title: str = ""  # the model's name for people: the result's (and the charts') target name


@dataclass(frozen=True)
class BenchOutcome:
    result: BenchResult
    png: bytes  # the charts; empty when no level finished


def render_charts(result: BenchResult) -> bytes:
    """The PNG `candlewick bench --plot` writes, as bytes (empty: nothing to plot)."""
    from engine.bench.plot import plot_result

    if not result.levels:
        return b""
    with tempfile.TemporaryDirectory(prefix="candlewick-bench-") as d:
        path = Path(d) / "bench.png"
        plot_result(result, path)
        return path.read_bytes()


class BenchWorker(QObject):
    """Lives in the benchmark thread. Progress arrives from the harness's own threads."""

    loading = Signal(float)  # 0, then 1 once the model's slots are the benchmark's
    progress = Signal(object)  # engine.bench.Progress
    finished = Signal(object)  # BenchOutcome (result.cancelled says if it was cut short)
    cancelled = Signal()  # cancelled before anything was measured (while loading)
    failed = Signal(str)  # one line for the user

    def __init__(self, host: ModelHost | None = None) -> None:
        super().__init__()
        self.host = host or ModelHost()

    @Slot(object, object)
    def run(self, request: BenchRequest, cancel: threading.Event) -> None:
        from engine.bench.embedded import run_loaded_benchmark

        started = [False]

        def on_progress(p: Progress) -> None:
            if not started[0]:
                started[0] = True
                self.loading.emit(1.0)
            self.progress.emit(p)

        try:
            if cancel.is_set():
                raise LoadCancelled("cancelled")
            self.loading.emit(0.0)
            model = self.host.get(request.model)
            result = run_loaded_benchmark(
                model, request.workload, request.config, progress=on_progress, cancel=cancel
            )
            if request.title:
                target = result.target
                target.setdefault("general_name", target.get("name"))
                target["name"] = request.title  # the name the app shows, in the file too
            png = render_charts(result)
        except LoadCancelled:
            self.cancelled.emit()
        except (EngineError, GGUFError, OSError) as e:
            self.failed.emit(f"Benchmark could not run: {e}")
        except MemoryError:
            self.failed.emit("Not enough memory for the benchmark's context")
        except Exception as e:  # a bug: the view must still hear that the run ended
            log.exception("benchmark failed")
            self.failed.emit(f"Benchmark failed: internal error ({type(e).__name__}: {e})")
        else:
            self.finished.emit(BenchOutcome(result, png))
        finally:
            # The harness's thread pool made Python register this Qt thread; the pool is
            # joined, so no ghost entry stays between runs.
            forget_python_thread()


class BenchHost(JobHost[BenchWorker]):
    """GUI-side handle on the benchmark thread: `run(BenchRequest)`."""

    def __init__(self, worker: BenchWorker | None = None, parent: QObject | None = None) -> None:
        worker = worker or BenchWorker()
        super().__init__(worker, "candlewick-bench", worker.run, parent)
