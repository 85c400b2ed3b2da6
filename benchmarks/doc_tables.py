"""Generated tables in the docs: a benchmark's `--write` replaces the text between two markers."""

from __future__ import annotations

from pathlib import Path


def replace_between(doc: Path, start: str, end: str, text: str) -> None:
    """Every generated table ends with the machine it was measured on (`machine_line`)."""
    if "Measured on:" not in text:
        text = f"{text}\n\n{machine_line()}"
    page = doc.read_text("utf-8")
    head, rest = page.split(start, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{start}\n{text}\n{end}{tail}", "utf-8")


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it ('AMD EPYC', 'Intel Xeon ...')."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_line() -> str:
    """Which machine a result comes from: the CPU, the cores, and the SIMD features this
    llama.cpp build uses on it (they decide its kernels and weight copies)."""
    import os
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from engine.memory import cpu_kernels
    from engine.native import llama_lib

    lanes = "; graph lanes" if llama_lib.graph_lanes() else ""  # a build patch, not a CPU feature
    return (
        f"Measured on: {cpu_model()}, {os.cpu_count()} cores; llama.cpp CPU features: "
        f"{cpu_kernels.detect().summary}{lanes}."
    )
