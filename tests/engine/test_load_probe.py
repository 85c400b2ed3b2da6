"""A file's first load is tried in a child process: an abort inside llama.cpp becomes one
line, the file is remembered once it loaded, and an unchanged file is not probed again.

No file is known that passes engine.model.semantics and still aborts llama.cpp, so the
end-to-end tests make the probe child abort through its fault hook (`FAULT_ENV`: a no-alloc
load with the mmap load mode, which trips a real GGML_ASSERT inside llama.cpp). The real
abort of a broken file is shown by giving the child `block_count = 0` past the validation.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFValueType

from engine.errors import EngineError
from engine.host.runtime import Model
from engine.native import load_probe
from engine.native.load_probe import FirstLoads, probe
from engine.native.native_load import FAULT_ENV, NativeLoad
from engine.settings import LoadParams
from tests.fuzz_gguf import ROOT, Corpus

PARAMS = LoadParams(n_ctx=256, n_threads=1, state_cache_mb=0)
ABORT_MESSAGE = re.compile(
    r"llama\.cpp crashed while loading m\.gguf \(SIGABRT\): "
    r"llama-model\.cpp:\d+: GGML_ASSERT\(!ml\.no_alloc\) failed"
)


@pytest.fixture
def copy(smollm2_path: Path, tmp_path: Path) -> Path:
    return Path(shutil.copyfile(smollm2_path, tmp_path / "m.gguf"))


def test_a_real_abort_in_the_child_is_one_line(smollm2_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    Corpus(smollm2_path)._set("llama.block_count", GGUFValueType.UINT32, 0).write(path)
    with pytest.raises(EngineError) as exc:
        probe(NativeLoad(str(path), n_ctx=256))
    assert re.fullmatch(
        r"llama\.cpp crashed while loading m\.gguf \(SIGABRT\): "
        r"llama-model\.cpp:\d+: GGML_ASSERT\(hparams\.n_layer_all > 0 && "
        r"hparams\.n_layer_all <= LLAMA_MAX_LAYERS\) failed",
        str(exc.value),
    )


def test_first_load_is_probed_then_remembered(
    copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = FirstLoads(tmp_path / "cache")
    children: list[NativeLoad] = []
    real = load_probe.run_in_child

    def counting(load: NativeLoad, **kw: object) -> load_probe.ChildResult:
        children.append(load)
        return real(load, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(load_probe, "run_in_child", counting)
    assert not loads.known(copy)
    Model(copy, PARAMS, first_loads=loads).close()
    assert len(children) == 1 and children[0].n_ctx == 256 and children[0].tokenize
    assert loads.known(copy)
    Model(copy, PARAMS, first_loads=loads).close()
    assert len(children) == 1  # unchanged: no second probe
    os.utime(copy, ns=(copy.stat().st_atime_ns, copy.stat().st_mtime_ns + 10**9))
    assert not loads.known(copy)  # touched: tried in a child again
    Model(copy, PARAMS, first_loads=loads).close()
    assert len(children) == 2


def test_an_abort_during_the_first_load_is_refused(
    copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = FirstLoads(tmp_path / "cache")
    monkeypatch.setenv(FAULT_ENV, "abort")
    with pytest.raises(EngineError) as exc:
        Model(copy, PARAMS, first_loads=loads)
    assert ABORT_MESSAGE.fullmatch(str(exc.value)), str(exc.value)
    assert not loads.known(copy)  # never loaded, so it is probed again next time


def test_a_damaged_memory_file_only_costs_a_probe(copy: Path, tmp_path: Path) -> None:
    loads = FirstLoads(tmp_path)
    loads.file.write_text("{not json")
    assert not loads.known(copy)
    loads.remember(copy)
    assert loads.known(copy)


def test_cli_run_says_why_with_exit_code_2(copy: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path]),
        "CANDLEWICK_HOME": str(tmp_path / "home"),
        FAULT_ENV: "abort",
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "run",
            str(copy),
            "hi",
            "--max-tokens",
            "1",
            "--threads",
            "1",
            "--ctx",
            "256",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 2, r.stderr
    line = r.stderr.removeprefix("candlewick: error: ").removesuffix("\n")
    assert ABORT_MESSAGE.fullmatch(line), r.stderr


def _without_repo_root(monkeypatch: pytest.MonkeyPatch, cwd: Path) -> None:
    """This process as an editable install sees it outside the repository: the project is
    importable (through the install's import hook, here: already imported), but neither
    sys.path nor the working folder holds the repository."""
    root = ROOT.resolve()
    kept = [p for p in sys.path if p and Path(p).resolve() != root]
    monkeypatch.setattr(sys, "path", kept)
    monkeypatch.chdir(cwd)


def test_the_child_starts_from_any_working_folder(
    smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "engine").mkdir()  # a folder named like ours in the working folder is not taken
    _without_repo_root(monkeypatch, tmp_path)
    res = load_probe.run_in_child(NativeLoad(str(smollm2_path), n_ctx=256), doing="loading")
    assert res.stage == "ok"


def test_a_child_that_cannot_start_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that dies before llama.cpp ran is our failure, not a crash on the user's file."""
    command = [sys.executable, "-P", "-S", "-m", "engine.native.not_there"]
    monkeypatch.setattr(load_probe, "child_command", lambda: command)
    with pytest.raises(EngineError) as exc:
        load_probe.run_in_child(NativeLoad(str(tmp_path / "m.gguf")), doing="loading")
    message = str(exc.value)
    assert message.startswith("could not start the model-loading helper process (exit code 1): ")
    assert message.endswith("No module named engine.native.not_there")

    monkeypatch.setattr(load_probe, "child_command", lambda: [str(tmp_path / "missing")])
    with pytest.raises(EngineError) as exc:
        load_probe.run_in_child(NativeLoad(str(tmp_path / "m.gguf")), doing="loading")
    assert str(exc.value).startswith(
        "could not start the model-loading helper process: [Errno 2] No such file or directory"
    )


def test_a_child_that_dies_before_llama_cpp_runs_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E.g. the bindings' library that does not load: reported as the child's start-up."""
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path / "nowhere"))
    with pytest.raises(EngineError) as exc:
        load_probe.run_in_child(NativeLoad(str(tmp_path / "m.gguf")), doing="loading")
    assert str(exc.value).startswith(
        "could not start the model-loading helper process (exit code 1): "
    ), str(exc.value)
