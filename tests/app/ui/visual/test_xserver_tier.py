"""Runs the X-server scenarios (test_chat_pane.py, test_chat_attachments.py,
test_window_layout.py, test_tray_icon.py, test_voice.py, test_read_aloud.py) in a child
pytest on a private Xvfb, with a virtual microphone (a private PulseAudio daemon) as its
default input, and checks that every one of them ran and passed (a child that skipped them
would prove nothing).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.app.ui.visual.virtual_mic import ENV, start_virtual_microphone
from tests.app.ui.visual.xserver import Xvfb, on_xserver

SCENARIOS = [
    Path(__file__).with_name(n)
    for n in (
        "test_chat_pane.py",
        "test_chat_attachments.py",
        "test_window_layout.py",
        "test_tray_icon.py",
        "test_voice.py",
        "test_read_aloud.py",
    )
]
ROOT = Path(__file__).resolve().parents[4]


def scenario_count() -> int:
    return sum(f.read_text(encoding="utf-8").count("\ndef test_") for f in SCENARIOS)


@pytest.mark.skipif(on_xserver(), reason="already on an X server: the scenarios run here")
@pytest.mark.model
@pytest.mark.timeout(900)  # every scenario, two of them answering with real models
def test_chat_pane_on_a_real_x_server(xvfb: Xvfb, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WAYLAND_DISPLAY", "PYTEST_ADDOPTS")}
    env.update(QT_QPA_PLATFORM="xcb", DISPLAY=xvfb.display)
    report = tmp_path / "scenarios.xml"
    with start_virtual_microphone() as mic:
        # Qt's PulseAudio backend connects once per process: the child has it from the start.
        env.update({"PULSE_SERVER": mic.server, ENV: mic.server})
        run = _run_scenarios(env, report, tmp_path)
    out = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, f"the X-server scenarios failed:\n{out}"
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None, out
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": scenario_count(), "failures": 0, "errors": 0, "skipped": 0}, out


def _run_scenarios(
    env: dict[str, str], report: Path, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *(str(f) for f in SCENARIOS),
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            f"--basetemp={tmp_path / 'child'}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
