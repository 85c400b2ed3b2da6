"""A frozen app (PyInstaller) has no interpreter to start: the first-load probe starts the app
itself with CHILD_ARG, and the bundle's entry point runs the child before anything else.

The bundle itself is checked by `make dist-check`; here a stand-in executable runs the entry
point script the way the bundle's bootloader does.
"""

from __future__ import annotations

import importlib.util
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.native import load_probe, quantize_process
from engine.native.native_load import CHILD_ARG, NativeLoad
from engine.native.quantize_child import CHILD_ARG as QUANTIZE_CHILD_ARG
from engine.speech import transcriber
from engine.speech.whisper_child import CHILD_ARG as WHISPER_CHILD_ARG

REPO = Path(__file__).resolve().parents[2]
MAIN = REPO / "installers" / "candlewick_main.py"


@pytest.fixture
def frozen_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sys.executable is an app that runs the bundle's entry point; sys.frozen is set."""
    exe = tmp_path / "candlewick"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" "{MAIN}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(exe))
    monkeypatch.chdir(tmp_path)
    return exe


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for the app")
def test_a_frozen_app_starts_itself_as_the_child(
    frozen_app: Path, smollm2_path: Path, tmp_path: Path
) -> None:
    assert load_probe.child_command() == [str(frozen_app), CHILD_ARG]
    res = load_probe.run_in_child(NativeLoad(str(smollm2_path), n_ctx=256), doing="loading")
    assert res.stage == "ok"
    # llama.cpp's refusal comes back as a refusal, not as a failure to start the child
    res = load_probe.run_in_child(NativeLoad(str(tmp_path / "none.gguf")), doing="loading")
    assert res.stage == "model"


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for the app")
def test_a_frozen_child_that_cannot_start_says_so(frozen_app: Path, tmp_path: Path) -> None:
    frozen_app.write_text("#!/bin/sh\necho 'error: the bundle is damaged' >&2\nexit 3\n")
    with pytest.raises(EngineError) as exc:
        load_probe.run_in_child(NativeLoad(str(tmp_path / "m.gguf")), doing="loading")
    assert str(exc.value) == (
        "could not start the model-loading helper process (exit code 3): "
        "error: the bundle is damaged"
    )


def test_the_child_is_handled_before_the_app_is_imported() -> None:
    """The child imports neither Qt nor the app: it costs about what the probe itself does."""
    script = (
        "import runpy, sys\n"
        f"sys.argv = ['candlewick', {CHILD_ARG!r}]\n"
        "import engine.native.native_load as child\n"
        "child.main = lambda: print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'PySide6', 'app', 'numpy', 'llama_cpp'}))\n"
        f"runpy.run_path({str(MAIN)!r}, run_name='__main__')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[]\n"


@pytest.mark.parametrize(
    ("command", "module", "frozen_arg"),
    [
        (load_probe.child_command, "engine.native.native_load", CHILD_ARG),
        (quantize_process.child_command, "engine.native.quantize_child", QUANTIZE_CHILD_ARG),
        (transcriber.child_command, "engine.speech.whisper_child", WHISPER_CHILD_ARG),
    ],
)
def test_each_child_is_its_module_or_the_frozen_app_itself(
    command: Callable[[], list[str]],
    module: str,
    frozen_arg: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The load, quantize and speech-to-text children: this interpreter on the child's
    module, or the frozen app on itself with the argument its entry point dispatches on."""
    assert command() == [sys.executable, "-P", "-S", "-m", module]
    assert importlib.util.find_spec(module) is not None
    app = tmp_path / "candlewick"
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(app))
    assert command() == [str(app), frozen_arg]
