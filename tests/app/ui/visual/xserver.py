"""Xvfb for the X-server tier, and whether this process already draws on an X server."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

SCREEN = "1600x1000x24"


def on_xserver() -> bool:
    return os.environ.get("QT_QPA_PLATFORM") == "xcb"


@dataclass
class Xvfb:
    display: str
    log: Path


@contextmanager
def start_xvfb() -> Iterator[Xvfb]:
    """A private Xvfb on a free display (it picks one and writes it to a pipe). Skips when
    Xvfb is missing, unless CI is set: CI must run this tier."""
    exe = shutil.which("Xvfb")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("Xvfb is not installed; CI runs the X-server tier (.ci/run installs it)")
        pytest.skip("Xvfb is not installed (Debian: apt-get install xvfb libxcb-cursor0)")
    log = Path(tempfile.mkstemp(prefix="xvfb-", suffix=".log")[1])
    r, w = os.pipe()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [exe, "-displayfd", str(w), "-screen", "0", SCREEN, "-nolisten", "tcp"],
            pass_fds=(w,),
            stdout=out,
            stderr=out,
        )
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 20)
        number = os.read(r, 32).decode().strip() if ready else ""
        if not number:
            pytest.fail(f"Xvfb did not start: {log.read_text(errors='replace')[-2000:]}")
        yield Xvfb(f":{number}", log)
    finally:
        os.close(r)
        proc.terminate()
        proc.wait(10)
        log.unlink(missing_ok=True)
