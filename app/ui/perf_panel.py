"""The live performance panel: the model, TTFT, prompt and generation speed (current and
rolling), context use, process RAM, VRAM per GPU, CPU load (and a line when other processes
take the CPU), and a chart of each reply's tokens/s and of RAM (`app.ui.perf_chart`).

It listens to the engine's signals (cheap: a few attribute writes each) about one reply, the
chat's (`follow`: the controller names it as it starts streaming): a late signal of a reply
the chat abandoned carries another request id and moves nothing. It samples the
process on a timer (400 ms) while it is shown, so it never adds work per token; the chart is
redrawn on that tick too, but at most once a second while a reply streams (see
STREAMING_REDRAW_S). The rules for the rolling rate and for "CPU busy" are in
`app.ui.perf_meter` (no Qt); the clock, the CPU probe and the RAM probe are handed in, so
tests feed their own samples.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import psutil
from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QHideEvent, QShowEvent
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from app.ui.library_model import human_bytes
from app.ui.perf_chart import PerfChart, Reply
from app.ui.perf_meter import (
    ROLLING_S,
    CpuContention,
    CpuProbe,
    RollingRate,
    cpu_busy_text,
    psutil_cpu_probe,
)
from app.ui.steady_label import SteadyLabel
from app.ui.worker import LoadedModel
from engine.host.speculative import acceptance_rate
from engine.host.stats import GenerationStats

TICK_MS = 400
# While a reply streams, the chart is redrawn at most this often (the figures above it still
# follow every tick). A redraw and its paint cost the GUI thread ~1.3 ms even with the axes
# cached, and on 2 cores that time is taken from llama.cpp's decode threads: with a redraw on
# every tick the chart was about a third of the window's GUI-thread work during a reply
# (2 EPYC cores, SmolLM2 at ~65 tok/s, per-thread CPU time).
STREAMING_REDRAW_S = 1.0
# The widest figure a row shows: the panel's width is set for it, not for the "—" at start.
VALUE_SAMPLE = "100% of 16 cores"
# The figures with long values, which wrap; the others are one line and change every tick.
WRAPPED = frozenset({"model", "spec", "vram", "source"})

# (name, used bytes, total bytes) per GPU; an empty list when there is none.
GpuProbe = Callable[[], Sequence[tuple[str, int, int]]]


def no_gpus() -> Sequence[tuple[str, int, int]]:
    return ()


class Figure(QLabel):
    """A row's value that may wrap (the model, the drafts, VRAM, where it was measured): at
    least as wide as VALUE_SAMPLE, so the panel is as wide as the figures it will show from
    the start (not as "—"), and no longer text gets clipped."""

    def minimumSizeHint(self) -> QSize:
        return (
            super()
            .minimumSizeHint()
            .expandedTo(QSize(self.fontMetrics().horizontalAdvance(VALUE_SAMPLE), 0))
        )


class SteadyFigure(SteadyLabel):
    """A one-line value set on every tick (speeds, RAM, CPU, context). A plain label's new
    text laid the whole panel out again and repainted it, the chart too: ~10 ms of GUI-thread
    CPU a tick while a reply streamed, time taken from llama.cpp's decode threads on 2 cores.
    It starts as wide as VALUE_SAMPLE and only grows (app/ui/steady_label.py)."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        sample = self.fontMetrics().horizontalAdvance(VALUE_SAMPLE)
        self.setFixedWidth(max(self.sizeHint().width(), sample))


def measured_text(stats: GenerationStats) -> tuple[str, str]:
    """Where the last reply's figures come from, short and in full: llama.cpp's counters in
    this process, or, for a remote engine, this computer's clock on the arriving stream."""
    if stats.measured_on != "client":
        return "by the engine", "By the engine: llama.cpp's own counters, in this process."
    usage = (
        "token counts from the server's usage report"
        if stats.server_usage
        else "token counts are the chunks received (the server sent no usage report)"
    )
    return "here, from the stream", (
        "On this computer, from the stream: TTFT and tokens/s "
        f"from when the chunks arrived (network included); "
        f"{usage}."
    )


class PerfPanel(QWidget):
    def __init__(
        self,
        gpu_probe: GpuProbe = no_gpus,
        tick_ms: int = TICK_MS,
        parent: QWidget | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        cpu_probe: CpuProbe | None = None,
        n_cores: int | None = None,
        ram_probe: Callable[[], int] | None = None,
    ) -> None:
        """`clock`: seconds (monotonic); `cpu_probe`: this process's and the machine's CPU
        seconds (default: psutil's); `n_cores`: logical cores (default: psutil's count);
        `ram_probe`: this process's resident bytes (default: psutil's)."""
        super().__init__(parent)
        self._gpu_probe = gpu_probe
        self._clock = clock
        self._t0 = clock()  # the chart's time zero: "since start"
        proc = psutil.Process()
        self._ram_probe = ram_probe or (lambda: int(proc.memory_info().rss))
        self._ncpu = n_cores or psutil.cpu_count() or 1
        # CPU load from CPU time between samples (psutil.cpu_percent re-reads the CPU count
        # on every call, which is slow on some VMs).
        self._cpu_probe = cpu_probe or psutil_cpu_probe()
        self.cpu = CpuContention(self._ncpu)
        self.cpu.add(clock(), *self._cpu_probe())
        self.timer = QTimer(self)
        self.timer.setInterval(tick_ms)
        self.timer.timeout.connect(self.tick)

        self.n_ctx = 0
        self.generating = False
        self.prompt_tokens = 0
        self.gen_tokens = 0
        self.ttft_s: float | None = None
        self.prompt_tps: float | None = None
        self.gen_tps: float | None = None  # last finished reply, llama.cpp counters
        self.current_tps = 0.0
        self.rolling = RollingRate(ROLLING_S)
        self._rid: int | None = None  # the reply the figures are about (`follow`)
        self.ticks = 0
        self._t_start = 0.0
        self._t_first: float | None = None  # the reply's first token
        self._last_n = 0
        self._last_t = 0.0

        self.labels: dict[str, QLabel] = {}
        box = QGroupBox("Performance")
        form = QFormLayout(box)
        for key, title in (
            ("model", "Model"),
            ("ttft", "Time to first token"),
            ("pp", "Prompt processing"),
            ("tg", "Generation (now)"),
            ("tg_avg", "Generation (rolling)"),
            ("tg_last", "Generation (last reply)"),
            ("spec", "Speculative decoding"),
            ("ctx", "Context used"),
            ("ram", "Process RAM"),
            ("vram", "VRAM"),
            ("cpu", "CPU load"),
            ("source", "Measured"),
        ):
            label = Figure("—") if key in WRAPPED else SteadyFigure("—")
            label.setAccessibleName(title)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.labels[key] = label
            form.addRow(title, label)
        for key in WRAPPED:
            self.labels[key].setWordWrap(True)
        # Why it may be slow: other processes on the CPU (shown only while they are).
        self.cpu_note = QLabel()
        self.cpu_note.setObjectName("cpuBusy")
        self.cpu_note.setAccessibleName("CPU busy")
        self.cpu_note.setWordWrap(True)
        self.cpu_note.setStyleSheet("color: #b26a00;")  # readable on light and dark
        self.cpu_note.setToolTip(
            "Other programs are using the processor: generation shares it with them and slows down."
        )
        self.cpu_note.hide()
        form.addRow(self.cpu_note)
        self.chart = PerfChart()
        lay = QVBoxLayout(self)
        lay.addWidget(box)
        lay.addWidget(self.chart, 1)

    # -- engine events (GUI thread) --------------------------------------------------------

    def on_loaded(self, info: LoadedModel) -> None:
        self.n_ctx = info.n_ctx
        self.labels["model"].setText(info.name)
        self._show_ctx()

    def on_unloaded(self) -> None:
        self.n_ctx = 0
        self.labels["model"].setText("—")
        self._show_ctx()

    def follow(self, rid: int | None) -> None:
        """Show the figures of reply `rid` from now on, and of no other (None: of none, the
        chat let its reply go). A reply in progress that is not `rid` ends here, without
        figures: its own end may never be shown."""
        if self.generating and rid != self._rid:
            self._end_reply()
        self._rid = rid

    def on_started(self, rid: int, prompt_tokens: int) -> None:
        if rid != self._rid:
            return
        self.generating = True
        self.prompt_tokens = prompt_tokens
        self.gen_tokens = 0
        self.ttft_s = None
        self._t_start = self._last_t = self._clock()
        self._t_first = None
        self._last_n = 0
        self.rolling.start()
        self.chart.reply_started(self._t_start - self._t0)
        self._show_ctx()

    def on_tokens(self, rid: int, _text: str, n_total: int) -> None:
        """Answer or thinking tokens (both are generated): `n_total` so far in the reply."""
        if rid != self._rid:
            return
        if not self.generating:  # its `started` was not seen: its figures from here
            self.on_started(rid, 0)
        now = self._clock()
        if self.ttft_s is None:
            self.ttft_s = now - self._t_start
            self._t_first = self._last_t = now
            self._last_n = n_total
        self.gen_tokens = n_total
        self.rolling.add(now, n_total)

    def on_finished(self, rid: int, stats: GenerationStats) -> None:
        if rid != self._rid:
            return
        self.generating = False
        self.rolling.stop()
        # The chart's point is the footer's figure (drawn at the next tick).
        end = self._clock() - self._t0
        first = end if self._t_first is None else self._t_first - self._t0
        start = self.chart.running_since
        start = first if start is None else start
        self.chart.reply_ended(
            Reply(start, first, end, stats.gen_tps) if stats.gen_tps > 0 else None
        )
        self.gen_tokens = stats.gen_tokens
        self.ttft_s = stats.ttft_s
        self.prompt_tps = stats.prompt_tps or None
        self.gen_tps = stats.gen_tps or None
        self.current_tps = 0.0
        short, full = measured_text(stats)
        self.labels["source"].setText(short)
        self.labels["source"].setToolTip(full)
        self.labels["spec"].setText(self.spec_text(stats))
        self.refresh_labels()

    def spec_text(self, stats: GenerationStats) -> str:
        """Drafted / accepted / acceptance rate, and the gain drafting measured on this model
        and machine (engine.host.draft_gain), which decides whether it drafts at all; "—"
        for a reply that could not draft."""
        rate = acceptance_rate(stats)
        gain = stats.draft_gain
        if rate is None:
            if gain is None:
                return "—"
            text = "nothing drafted"  # the loop found drafting slower here, or no match
        else:
            text = (
                f"{stats.draft_accepted}/{stats.draft_tokens} drafted tokens accepted ({rate:.0%})"
            )
        if gain is not None:
            text += f" · measured gain x{gain:.2f} on this model"
        return text

    def on_failed(self, rid: int, _message: str) -> None:
        if rid == self._rid:
            self._end_reply()

    def _end_reply(self) -> None:
        """The reply shown ended without its figures (it failed, or the chat let it go)."""
        self.generating = False
        self.rolling.stop()
        self.current_tps = 0.0
        self.chart.reply_ended(None)

    # -- sampling --------------------------------------------------------------------------

    def showEvent(self, e: QShowEvent) -> None:
        super().showEvent(e)
        self.timer.start()
        self.chart.redraw(self._clock() - self._t0)

    def hideEvent(self, e: QHideEvent) -> None:
        self.timer.stop()
        super().hideEvent(e)

    def tick(self) -> None:
        now = self._clock()
        if self.generating and self.ttft_s is not None and now > self._last_t:
            self.current_tps = (self.gen_tokens - self._last_n) / (now - self._last_t)
            self._last_n, self._last_t = self.gen_tokens, now
        self.ticks += 1
        rss = self.refresh_labels()
        t = now - self._t0
        self.chart.sample(t, float(rss), self.rolling_tps if self.generating else None)
        if not self.generating or t - self.chart.now >= STREAMING_REDRAW_S:
            self.chart.redraw(t)

    @property
    def rolling_tps(self) -> float | None:
        """Tokens/s over the last few seconds of the reply in progress (or just ended);
        None when nothing has been generated for that long (app.ui.perf_meter)."""
        return self.rolling.rate(self._clock())

    def refresh_labels(self) -> int:
        """Update the figures; returns the process RAM it shows (bytes)."""
        lab = self.labels
        rss = self._ram_probe()
        lab["ttft"].setText(f"{self.ttft_s:.2f} s" if self.ttft_s is not None else "—")
        lab["pp"].setText(f"{self.prompt_tps:.0f} tok/s" if self.prompt_tps else "—")
        lab["tg"].setText(f"{self.current_tps:.1f} tok/s" if self.generating else "idle")
        roll = self.rolling_tps
        lab["tg_avg"].setText(f"{roll:.1f} tok/s" if roll is not None else "—")
        lab["tg_last"].setText(f"{self.gen_tps:.1f} tok/s" if self.gen_tps else "—")
        lab["ram"].setText(human_bytes(rss))
        gpus = list(self._gpu_probe())
        lab["vram"].setText(
            "; ".join(f"{n}: {human_bytes(u)} / {human_bytes(t)}" for n, u, t in gpus)
            if gpus
            else "no GPU in use"
        )
        share = self.cpu.add(self._clock(), *self._cpu_probe())
        if share is not None:
            lab["cpu"].setText(f"{share.own_cores * 100:.0f}% of {share.n_cores} cores")
        busy = cpu_busy_text(share) if share is not None else None
        self.cpu_note.setText(busy or "")
        self.cpu_note.setVisible(busy is not None)
        self._show_ctx()
        return rss

    def _show_ctx(self) -> None:
        used = self.prompt_tokens + self.gen_tokens
        self.labels["ctx"].setText(f"{used:,} / {self.n_ctx:,} tokens" if self.n_ctx else "—")
