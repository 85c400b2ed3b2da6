"""What whisper.cpp itself allocates for a model: the sizes it logs when it loads one and
creates its state (`model size`, `kv self size`, `compute buffer (encode)`, ... in MB of
10^6 bytes), read in a child process from its standard error, as a user sees them. The
reference the memory estimate (engine.memory.whisper) is checked against."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

LOG_LINE = re.compile(
    r"(model size|kv self size|kv cross size|kv pad  size|compute buffer \((\w+)\))\s*=\s*"
    r"([\d.]+) MB"
)


def whisper_cpp_figures(model: Path) -> dict[str, float]:
    """What whisper.cpp logs (MB) when it loads `model` and creates its state: a child
    process, so its log lines are read from its standard error as a user sees them."""
    load = (
        "import sys, _pywhispercpp as pw\n"
        "ctx = pw.whisper_init_from_file_with_params(sys.argv[1], "
        "pw.whisper_context_default_params())\n"
        "sys.exit(0 if ctx is not None else 3)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", load, str(model)], capture_output=True, text=True, timeout=120
    )
    if run.returncode != 0:
        raise RuntimeError(f"whisper.cpp did not load {model.name}: {run.stderr[-2000:]}")
    found = {}
    for m in LOG_LINE.finditer(run.stderr):
        found[m[2] or m[1].replace("  ", " ")] = float(m[3])
    return found
