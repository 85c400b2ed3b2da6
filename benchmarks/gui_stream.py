"""Decode speed through the GUI path vs raw, and how long the GUI thread ever stalls.

Both paths use the same loaded SmolLM2 (one `Model`, used by one thread at a time) and the same
greedy request, alternating raw and GUI runs so machine noise hits both alike (raw first in
every other round, so a drift over the run favours neither):

* raw: `Model.generate` iterated in a plain loop in this thread, nothing else running;
* GUI: the real main window (offscreen Qt platform, so painting still happens) sends the same
  message through `ChatController` -> `EngineWorker` thread -> coalesced token signals ->
  `ChatModel` -> Markdown chat view, with the performance panel's timer running.

Decode speed is tokens per second between the first and the last token *as the consumer sees
them* (the raw loop, or the GUI thread receiving token signals). Stalls are measured by a 5 ms
precise timer on the GUI thread: every gap between two of its ticks while tokens stream is
recorded; a gap is how long the GUI thread could not react to input.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/gui_stream.py --runs 10 --tokens 128
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PySide6.QtCore import QEventLoop, QObject, Qt, QTimer, Slot
from PySide6.QtWidgets import QApplication

from app.services.library import bundled_default_model
from benchmarks.doc_tables import machine_line
from benchmarks.reply_rate import PROMPT, reply_rate
from engine.host.runtime import Model
from engine.host.stats import GenerationStats
from engine.settings import LoadParams, SamplingParams

PROBE_MS = 5


class Probe(QObject):
    """GUI-thread observer: tick gaps of a precise timer, and token arrival times."""

    def __init__(self) -> None:
        super().__init__()
        self.timer = QTimer(self)
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(PROBE_MS)
        self.timer.timeout.connect(self.tick)
        self.last = 0.0
        self.gaps: list[float] = []
        self.recording = False
        self.first: tuple[float, int] | None = None
        self.last_tok: tuple[float, int] | None = None
        self.stats: GenerationStats | None = None
        self.signals = 0
        # The GUI thread's own CPU time from the first token to the finished signal, and that
        # wall time: what it takes from llama.cpp's threads, hardly moved by other load.
        self.cpu: tuple[float, float] | None = None

    @Slot()
    def tick(self) -> None:
        now = time.perf_counter()
        if self.recording and self.last:
            self.gaps.append(now - self.last)
        self.last = now

    @Slot(int, str, int)
    def on_tokens(self, _rid: int, _text: str, n: int) -> None:
        now = time.perf_counter()
        self.signals += 1
        if self.first is None:
            self.first = (now, n)
            self.recording = True
            self.last = now
            self.cpu = (time.thread_time(), 0.0)
        self.last_tok = (now, n)

    @Slot(int, object)
    def on_finished(self, _rid: int, stats: GenerationStats) -> None:
        self.recording = False
        self.stats = stats
        if self.cpu is not None and self.first is not None:
            self.cpu = (time.thread_time() - self.cpu[0], time.perf_counter() - self.first[0])

    def reset(self) -> None:
        self.first = self.last_tok = None
        self.stats = None
        self.signals = 0
        self.cpu = None


def median_interval(xs: list[float], rounds: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of `xs` (percentiles of resampled medians;
    seeded, so a run's figures can be read again from its printout)."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(rounds))
    return meds[int(rounds * 0.025)], meds[int(rounds * 0.975) - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    load0 = os.getloadavg()[0]  # other processes on the machine skew both paths
    home = tempfile.mkdtemp(prefix="candlewick-bench-")
    os.environ["CANDLEWICK_HOME"] = home
    qapp = QApplication.instance() or QApplication([])
    from app.main import build_window, share_the_interpreter
    from app.ui.worker import EngineWorker

    path = bundled_default_model()
    assert path is not None, "the bundled SmolLM2 is not installed"
    params = LoadParams(n_ctx=2048, n_threads=args.threads)
    model = Model(path, params)

    def factory(
        path: Path,
        params: LoadParams,
        *,
        progress: Callable[[float], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Model:
        return model  # the very same loaded model: identical weights, threads and context

    sampling = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    window = build_window(worker=EngineWorker(factory), sampling=sampling)
    window.resize(1360, 860)
    window.show()
    probe = Probe()
    w = window.engine.worker
    w.tokens.connect(probe.on_tokens)
    w.finished.connect(probe.on_finished)

    def wait_for(cond: Callable[[], bool], timeout_s: float = 300) -> None:
        """Run the real event loop (idle between events) until `cond` holds. It is checked
        when the reply's signals arrive (and once a second), not by a fast timer: a poll
        every 20 ms would be GUI-thread work the app itself does not do."""
        loop = QEventLoop()
        end = time.monotonic() + timeout_s

        def check(*_: object) -> None:
            if cond() or time.monotonic() > end:
                loop.quit()

        slow = QTimer()
        slow.timeout.connect(check)
        slow.start(1000)
        hooks = [w.loaded, w.finished, w.failed, window.controller.busy_changed]
        for hook in hooks:
            hook.connect(check, Qt.ConnectionType.QueuedConnection)
        if not cond():
            loop.exec()
        for hook in hooks:
            hook.disconnect(check)
        slow.stop()

    # Load through the GUI (the factory hands over the loaded model), then one warm-up each.
    window.controller.load(path, params)
    wait_for(lambda: window.controller.loaded is not None)
    reply_rate(model, sampling)
    window.controller.new_chat()
    window.controller.send(PROMPT)
    wait_for(lambda: probe.stats is not None)

    raw: list[float] = []
    gui: list[float] = []
    engine_side: list[float] = []
    signal_rates: list[float] = []
    all_gaps: list[float] = []
    base_gaps: list[float] = []

    def gui_run(*, timed: bool) -> tuple[float, float, float, int]:
        """One reply through the window: (t/s as the GUI thread saw it, engine-side t/s,
        token signals/s, tokens). `timed` runs the stall probe's 5 ms timer; the speed
        runs go without it, since 200 wake-ups a second of the GUI thread are work the app
        does not do (on 2 cores it cost the GUI path ~3% of its speed)."""
        model.reset_cache()
        window.controller.new_chat()
        probe.reset()
        probe.gaps = []
        if timed:
            probe.timer.start()
        window.controller.send(PROMPT)
        wait_for(lambda: probe.stats is not None and not window.controller.busy)
        probe.timer.stop()
        assert probe.first and probe.last_tok and probe.stats
        (t0, n0), (t1, n1) = probe.first, probe.last_tok
        return (n1 - n0) / (t1 - t0), probe.stats.gen_tps_wall, probe.signals / (t1 - t0), n1

    gui_cpu: list[float] = []  # GUI-thread CPU, share of one core while the reply streamed

    def raw_run() -> tuple[float, int]:
        # Each path with the interpreter as it runs there: raw with Python's defaults, the
        # GUI runs as the app sets it up (app.main.share_the_interpreter).
        sys.setswitchinterval(default_switch)
        model.reset_cache()
        rate = reply_rate(model, sampling)
        share_the_interpreter()
        return rate

    default_switch = sys.getswitchinterval()
    for i in range(args.runs):
        # Raw first in even rounds, the GUI first in odd ones: a machine that speeds up or
        # slows down over the run then favours neither path.
        if i % 2:
            g, engine_tps, signal_rate, n1 = gui_run(timed=False)
            r, n_raw = raw_run()
        else:
            r, n_raw = raw_run()
            g, engine_tps, signal_rate, n1 = gui_run(timed=False)
        raw.append(r)
        gui.append(g)
        engine_side.append(engine_tps)
        signal_rates.append(signal_rate)
        assert probe.cpu is not None
        gui_cpu.append(probe.cpu[0] / probe.cpu[1])
        # The stalls: the same reply again, with the probe's timer running.
        gui_run(timed=True)
        all_gaps.extend(probe.gaps)
        # Reference for the stall numbers: the same decode in a plain thread with the GUI
        # idle (no token signals, no view updates). Gaps here are what the machine and the
        # decode threads alone cost the GUI thread.
        model.reset_cache()
        probe.gaps = []
        probe.recording, probe.last = True, 0.0
        probe.timer.start()
        bg = threading.Thread(target=reply_rate, args=(model, sampling), name="bench-raw")
        bg.start()
        while bg.is_alive():
            qapp.processEvents(QEventLoop.ProcessEventsFlag.WaitForMoreEvents, 50)
        bg.join()
        probe.timer.stop()
        probe.recording = False
        base_gaps.extend(probe.gaps)
        if n1 != n_raw:
            print(f"note: GUI run produced {n1} tokens, raw {n_raw}", file=sys.stderr)

    probe.timer.stop()
    window.close()
    window.shutdown()
    qapp.processEvents()

    gaps_ms = sorted(g * 1000 for g in all_gaps)
    p99 = gaps_ms[min(len(gaps_ms) - 1, int(len(gaps_ms) * 0.99))]
    base_ms = sorted(g * 1000 for g in base_gaps)
    base_p99 = base_ms[min(len(base_ms) - 1, int(len(base_ms) * 0.99))]
    med_raw, med_gui = statistics.median(raw), statistics.median(gui)
    # Each GUI run is compared with the raw run beside it: noise from other processes
    # changes slowly, so adjacent pairs see nearly the same machine.
    ratios = [g / r for g, r in zip(gui, raw, strict=True)]
    low, high = median_interval(ratios)
    print(
        "| runs | tokens | raw decode t/s (median) | GUI path t/s (median) | "
        "GUI/raw (median of pairs) | token signals/s | GUI-thread gap p50 / p99 / max (ms) |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {args.runs} | {args.tokens} | {med_raw:.1f} | {med_gui:.1f} | "
        f"{statistics.median(ratios) * 100:.1f}% | {statistics.median(signal_rates):.0f} | "
        f"{statistics.median(gaps_ms):.1f} / {p99:.1f} / {gaps_ms[-1]:.1f} |"
    )
    print(f"pair ratios: {[f'{x * 100:.0f}%' for x in ratios]}")
    print(
        f"median of pairs, 95% bootstrap interval: {low * 100:.1f}% .. {high * 100:.1f}%; "
        f"GUI-thread CPU while a reply streams: {statistics.median(gui_cpu) * 100:.1f}% of "
        f"one core (median; runs {[f'{x * 100:.1f}' for x in gui_cpu]})"
    )
    print(
        f"reference, same decode in a plain thread with the GUI idle: GUI-thread gap p50 / "
        f"p99 / max {statistics.median(base_ms):.1f} / {base_p99:.1f} / {base_ms[-1]:.1f} ms"
    )
    print(f"raw runs: {[round(x, 1) for x in raw]}")
    print(
        f"GUI runs: {[round(x, 1) for x in gui]}  (engine-side wall t/s: "
        f"{[round(x, 1) for x in engine_side]})"
    )
    print(
        f"probe gaps recorded: {len(gaps_ms)} (timer interval {PROBE_MS} ms); "
        f"load average at start {load0:.1f}, at end {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    print(machine_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
