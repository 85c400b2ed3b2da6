"""A virtual microphone for the voice tests: a private PulseAudio daemon whose default input
is a null sink's monitor (remapped as an ordinary source), so a WAV played into the sink is
what any program recording from the default input hears.

The daemon is the test's own: its socket, runtime and state folders are in a temporary
folder (nothing of the user's sound setup is touched or needed), it never exits on idle and
loads no other modules (`-n`), and it is stopped when the test ends. As root it runs with a
warning (a per-user daemon, not `--system`): its files are in the private folder all the same.
Qt's PulseAudio backend reads `PULSE_SERVER` when it first connects, so the variable is set
before the process first touches QtMultimedia (tests/app/ui/visual/test_xserver_tier.py
starts the daemon and hands it to the child pytest).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

SINK = "candlewick_feed"
SOURCE = "candlewick_mic"
ENV = "CANDLEWICK_VIRTUAL_MIC"  # set (to the server) where a daemon is running for the tests
CONFIG = f"""
load-module module-null-sink sink_name={SINK} rate=16000 channels=1
load-module module-remap-source master={SINK}.monitor source_name={SOURCE} channels=1
load-module module-native-protocol-unix auth-anonymous=1 socket={{socket}}
set-default-sink {SINK}
set-default-source {SOURCE}
"""


@dataclass
class VirtualMicrophone:
    server: str  # what PULSE_SERVER names

    def play(self, wav: Path) -> None:
        """Play `wav` into the microphone; returns once it has been played."""
        exe = shutil.which("paplay")
        assert exe is not None
        subprocess.run(
            [exe, "--server", self.server, "--device", SINK, str(wav)],
            check=True,
            timeout=120,
            capture_output=True,
        )

    def default_source(self) -> str:
        return _pactl(self.server, "get-default-source").strip()


def _pactl(server: str, *args: str) -> str:
    exe = shutil.which("pactl")
    assert exe is not None
    run = subprocess.run(
        [exe, "--server", server, *args], capture_output=True, text=True, timeout=10
    )
    if run.returncode != 0:
        raise OSError(run.stderr.strip() or f"pactl {' '.join(args)} failed")
    return run.stdout


def missing() -> str | None:
    """What the virtual microphone needs and this machine lacks (None: nothing)."""
    absent = [t for t in ("pulseaudio", "pactl", "paplay") if shutil.which(t) is None]
    if not absent:
        return None
    return (
        f"{', '.join(absent)} not installed (Debian: apt-get install pulseaudio pulseaudio-utils)"
    )


@contextmanager
def start_virtual_microphone() -> Iterator[VirtualMicrophone]:
    """A private PulseAudio daemon with the virtual microphone as its default input. Skips
    when PulseAudio is missing, unless CI is set: CI runs the voice tests (.ci/run installs
    it)."""
    why = missing()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI runs the voice tests")
        pytest.skip(why)
    folder = Path(tempfile.mkdtemp(prefix="candlewick-pulse-"))
    runtime = folder / "run"
    runtime.mkdir(mode=0o700)
    socket = folder / "native"
    config = folder / "default.pa"
    config.write_text(CONFIG.format(socket=socket), encoding="utf-8")
    log = folder / "pulse.log"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(folder),
        "XDG_RUNTIME_DIR": str(runtime),
        "XDG_CONFIG_HOME": str(folder / "config"),
    }
    args = ["-n", "-F", str(config), "--daemonize=no", "--exit-idle-time=-1"]
    args += ["--use-pid-file=no", "--disallow-exit", f"--log-target=file:{log}"]
    exe = shutil.which("pulseaudio")
    assert exe is not None
    proc = subprocess.Popen(
        [exe, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    server = f"unix:{socket}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                mic = VirtualMicrophone(server)
                if mic.default_source() == SOURCE:
                    break
            except (OSError, subprocess.TimeoutExpired):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                pytest.fail(f"PulseAudio did not start: {text}")
            time.sleep(0.1)
        yield mic
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def tier_microphone() -> Iterator[VirtualMicrophone]:
    """The tier's microphone (test_xserver_tier.py starts it for the child pytest and names
    it in ENV), or a daemon of the caller's own when a scenario runs alone under an X server,
    with PULSE_SERVER naming it while it runs (set before Qt first connects)."""
    server = os.environ.get(ENV)
    if server:
        assert os.environ.get("PULSE_SERVER") == server
        yield VirtualMicrophone(server)
        return
    with start_virtual_microphone() as m:
        os.environ["PULSE_SERVER"] = m.server
        try:
            yield m
        finally:
            os.environ.pop("PULSE_SERVER", None)
