"""Try llama.cpp on a file in a child process first, so that an abort inside it cannot end
the app.

`run_in_child` runs an `engine.native.native_load.NativeLoad` (a load that reads no weights and
allocates nothing) in a child: the memory dry run on builds that can offload, and the
first-load probe. A child killed by a signal becomes a one-line EngineError naming the signal
and llama.cpp's last words ("llama.cpp crashed while loading m.gguf (SIGABRT):
llama-model.cpp:1328: GGML_ASSERT(...) failed").

`FirstLoads` remembers the files that loaded in this process before (by resolved path, size
and modification time, in a JSON file in a folder the caller gives, the app's cache folder):
only the first load of a new or changed file pays for the probe.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import engine
from engine.errors import EngineError
from engine.native.llama_lib import last_error as _last_error
from engine.native.native_load import CHILD_ARG, STARTED, NativeLoad

log = logging.getLogger("candlewick.engine")

PROBE_TIMEOUT_S = 120.0
FIRST_LOADS_FILE = "loaded-models.json"
NO_START = "could not start the model-loading helper process"
MAX_REMEMBERED = 500  # files; the oldest are forgotten (they are probed again, nothing worse)


@dataclass(frozen=True)
class ChildResult:
    stage: str  # "ok", or where llama.cpp refused: "model" or "context"
    log: tuple[str, ...]


def run_in_child(
    load: NativeLoad, *, doing: str, timeout_s: float = PROBE_TIMEOUT_S
) -> ChildResult:
    """Run `load` in a child process. `doing` names the work in a crash message ("sizing",
    "loading"). A refusal by llama.cpp is returned (stage and log); a crash, a hang or a
    child that cannot start raises EngineError."""
    name = Path(load.mmproj or load.path).name
    try:
        r = subprocess.run(
            child_command(),
            input=load.to_json(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=child_env(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EngineError(
            f"llama.cpp did not finish {doing} {name} within {timeout_s:.0f} s"
        ) from None
    except OSError as e:
        raise EngineError(f"{NO_START}: {e}") from None
    if STARTED not in r.stdout.splitlines():  # died before it could run llama.cpp
        raise EngineError(f"{NO_START} ({death(r.returncode)}): {last_words(r.stderr)}")
    if r.returncode != 0:
        raise EngineError(
            f"llama.cpp crashed while {doing} {name} "
            f"({death(r.returncode)}): {last_words(r.stderr)}"
        )
    try:
        out = json.loads(r.stdout.rsplit("\n", 2)[-2])
        return ChildResult(str(out["stage"]), tuple(str(x) for x in out["log"]))
    except (IndexError, ValueError, KeyError, TypeError):
        raise EngineError(
            f"the child process that tried {name} gave no answer: {last_words(r.stderr)}"
        ) from None


def child_command() -> list[str]:
    """How this process starts the load child."""
    return python_child("engine.native.native_load", CHILD_ARG)


def python_child(module: str, frozen_arg: str) -> list[str]:
    """How this process starts a child that runs `module` (the load, quantize and
    speech-to-text children). A frozen app has no interpreter: it starts itself with
    `frozen_arg`, which its entry point hands to that module before importing anything else.
    Otherwise: -S skips site (~15 ms a start; site-packages come in through PYTHONPATH) and
    -P keeps the working folder off sys.path, so a folder there named like one of our
    packages cannot shadow it."""
    if getattr(sys, "frozen", False):
        return [sys.executable, frozen_arg]
    return [sys.executable, "-P", "-S", "-m", module]


def child_env() -> dict[str, str]:
    """The child's environment. -S drops the import hook of an editable install, which is
    the only way this process may find `engine`: the folder that holds the package goes first
    on PYTHONPATH, then this process's own path. GGML_NO_BACKTRACE: on an abort ggml would
    attach gdb for a backtrace (~1 s); the assert line is what the message needs."""
    env = {"GGML_NO_BACKTRACE": "1", **os.environ}
    if not getattr(sys, "frozen", False):  # a bundle's path is its own
        root = str(Path(engine.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([root, *(x for x in sys.path if x)]))
    return env


def death(returncode: int) -> str:
    """'SIGABRT' for a child killed by signal 6, 'exit code 3' otherwise."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def last_words(stderr: str) -> str:
    """The line of a dead child's stderr that says why: an assert, else the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for line in reversed(lines):
        if "GGML_ASSERT" in line or "error" in line.lower():
            return re.sub(r"^\S*/(?=[^/\s]+:\d+: )", "", line)  # the build's folder
    return lines[-1] if lines else "no output"


def probe(load: NativeLoad) -> None:
    """Load `load.path` the way a real load will (no weights read) in a child, with a
    tokenizer round trip; raise EngineError with llama.cpp's reason if it refuses or dies."""
    res = run_in_child(replace(load, tokenize=True), doing="loading")
    if res.stage != "ok":
        what = "load" if res.stage == "model" else "create a context for"
        raise EngineError(
            f"llama.cpp could not {what} {Path(load.path).name}: {_last_error(list(res.log))}"
        )


@dataclass(frozen=True)
class ProjectorSizes:
    """What libmtmd allocated for a projector in the probe: its weights and the compute
    buffer its warm-up reserved (llama.cpp's own log lines)."""

    weights_bytes: int
    compute_bytes: int


_MODEL_SIZE = re.compile(r"model size:\s+([\d.]+) MiB")
_COMPUTE = re.compile(r"compute buffer size\s*=\s*([\d.]+) MiB")


def projector_sizes(lines: list[str] | tuple[str, ...]) -> ProjectorSizes:
    """The sizes a projector's load logged (a vision and an audio encoder add up)."""
    mib = 1 << 20
    weights = sum(float(m.group(1)) for ln in lines if (m := _MODEL_SIZE.search(ln)))
    compute = sum(
        float(m.group(1))
        for ln in lines
        if "reserve_compute_meta" in ln and (m := _COMPUTE.search(ln))
    )
    return ProjectorSizes(round(weights * mib), round(compute * mib))


def probe_projector(model: str | Path, mmproj: str | Path) -> ProjectorSizes:
    """Load `mmproj` for `model` in a child (the model's weights are not read; the
    projector's are, and it runs once); its sizes, or EngineError with libmtmd's reason or
    the crash's."""
    load = NativeLoad(path=str(model), n_ctx=256, n_batch=256, n_ubatch=256, mmproj=str(mmproj))
    res = run_in_child(load, doing="loading the projector")
    if res.stage == "projector":
        raise EngineError(
            f"{Path(mmproj).name} is not a projector for this model: {_last_error(list(res.log))}"
        )
    if res.stage != "ok":
        why = _last_error(list(res.log))
        raise EngineError(f"llama.cpp could not load {Path(model).name}: {why}")
    return projector_sizes(res.log)


class FirstLoads:
    """The files that loaded before, so only a new or changed file is probed first."""

    def __init__(self, folder: Path) -> None:
        self.file = folder / FIRST_LOADS_FILE
        self._lock = threading.Lock()

    @staticmethod
    def _key(path: Path) -> tuple[str, list[int]]:
        p = path.resolve()
        st = p.stat()
        return str(p), [st.st_size, st.st_mtime_ns]

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}  # none yet, or damaged: everything is probed again
        return data if isinstance(data, dict) else {}

    def known(self, path: Path) -> bool:
        try:
            key, stamp = self._key(path)
        except OSError:
            return False
        with self._lock:
            return self._read().get(key) == stamp

    def remember(self, path: Path) -> None:
        """Record a successful load. Failing to write only costs a probe next time."""
        try:
            key, stamp = self._key(path)
            with self._lock:
                data = self._read()
                data.pop(key, None)
                data[key] = stamp  # insertion order = age
                while len(data) > MAX_REMEMBERED:
                    del data[next(iter(data))]
                self._write(data)
        except OSError as e:
            log.warning("could not remember that %s loaded: %s", path, e)

    def _write(self, data: dict[str, Any]) -> None:
        # Written whole and renamed into place: two processes never leave half a file.
        self.file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.file.parent, prefix=".loaded-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, self.file)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def probe_projector_unless_known(self, model: Path, mmproj: Path) -> bool:
        """Probe a projector that never loaded before (for any model); True if probed."""
        if self.known(mmproj):
            return False
        probe_projector(model, mmproj)
        return True

    def probe_unless_known(self, load: NativeLoad) -> bool:
        """Probe a file that never loaded before; True if it was probed."""
        if self.known(Path(load.path)):
            return False
        probe(load)
        return True
