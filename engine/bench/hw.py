"""The machine side of the benchmark: memory read bandwidth, peak memory of a process, and the
hardware/software context recorded with every result."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

MiB = 1 << 20


def measure_read_bandwidth(
    size_bytes: int = 512 * MiB, *, threads: int | None = None, repeats: int = 5
) -> float:
    """Memory read bandwidth in bytes/s: the best of `repeats` passes that sum a buffer much
    larger than the CPU caches, on one thread and split over `threads` (default: all logical
    CPUs; numpy releases the GIL while it sums).

    Decode reads every weight once per token with all cores, so this is the number the decode
    roofline divides by. Summing int64 keeps the arithmetic cheap enough that memory, not the
    ALUs, is the limit.
    """
    import numpy as np

    n_max = max(1, threads or os.cpu_count() or 1)
    buf = np.ones(max(n_max, size_bytes // 8), dtype=np.int64)  # written: pages are real
    best = 0.0
    # One core alone may already saturate the memory bus; more threads may only contend.
    for n_threads in sorted({1, n_max}):
        parts = np.array_split(buf, n_threads)
        with ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix="bench-bw") as pool:
            for _ in range(max(1, repeats)):
                t0 = time.perf_counter()
                list(pool.map(np.sum, parts))
                dt = time.perf_counter() - t0
                if dt > 0:
                    best = max(best, buf.nbytes / dt)
    return best


@dataclass
class MemoryPeak:
    ram_bytes: int | None = None
    vram_bytes: int | None = None


class PeakSampler:
    """Samples a process's resident memory (and GPU memory when NVML can tell) on a thread.

    `pid=None` samples this process. Child processes are included (a server may fork
    workers). Use as a context manager; `peak` holds the maxima seen.
    """

    def __init__(self, pid: int | None = None, interval_s: float = 0.05) -> None:
        self.pid = pid or os.getpid()
        self.interval_s = interval_s
        self.peak = MemoryPeak()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._vram: Callable[[int], int | None] = _nvml_reader()

    def sample(self) -> None:
        import psutil

        try:
            proc = psutil.Process(self.pid)
            rss = proc.memory_info().rss
            for child in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    rss += child.memory_info().rss
        except psutil.Error:
            return
        if self.peak.ram_bytes is None or rss > self.peak.ram_bytes:
            self.peak.ram_bytes = int(rss)
        vram = self._vram(self.pid)
        if vram is not None and (self.peak.vram_bytes is None or vram > self.peak.vram_bytes):
            self.peak.vram_bytes = vram

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> PeakSampler:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()


def _nvml_reader() -> Callable[[int], int | None]:
    """GPU memory used by a pid via NVML; a reader returning None when NVML is unavailable."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:
        return lambda _pid: None

    def read(pid: int) -> int | None:
        total = 0
        found = False
        for h in handles:
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:
                continue
            for p in procs:
                if p.pid == pid and p.usedGpuMemory is not None:
                    total += int(p.usedGpuMemory)
                    found = True
        return total if found else None

    return read


def cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    if sys.platform == "darwin":
        with contextlib.suppress(Exception):
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            if out.stdout.strip():
                return out.stdout.strip()
    return platform.processor() or platform.machine()


def machine_context() -> dict[str, Any]:
    """CPU, cores, RAM, GPUs and the llama.cpp build: what a result needs to be comparable."""
    import psutil

    ctx: dict[str, Any] = {
        "cpu": cpu_name(),
        "cores_physical": psutil.cpu_count(logical=False),
        "cores_logical": psutil.cpu_count(logical=True),
        "ram_bytes": int(psutil.virtual_memory().total),
        "os": platform.platform(),
        "python": platform.python_version(),
        # Other work on the machine slows every number; a result should say how busy it was.
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    try:
        from importlib.metadata import version

        ctx["llama_cpp_python"] = version("llama-cpp-python")
    except Exception:
        ctx["llama_cpp_python"] = None
    try:
        from engine.native import llama_lib

        ctx["llama_cpp_system_info"] = llama_lib.system_info()
        ctx["gpu_offload"] = llama_lib.supports_gpu_offload()
    except Exception as e:  # the context must never stop a benchmark
        ctx["llama_cpp_system_info"] = f"unavailable: {e}"
    ctx["gpus"] = _gpus()
    return ctx


def _gpus() -> list[dict[str, Any]]:
    try:
        from engine.memory import hardware

        hw = hardware.detect()
        return [g.to_dict() for g in hw.gpus]
    except Exception:
        return []
