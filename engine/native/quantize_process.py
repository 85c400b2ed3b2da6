"""Run a quantization in a child process: progress from its log, cancel by killing it.

llama.cpp's `llama_model_quantize` has no progress callback and cannot be stopped, so it runs
in `engine.native.quantize_child` and this side reads the child's log line by line: each
"[  12/ 272] blk.0.attn_k.weight - [...], type = q4_1, converting to q4_0 .. size = ..." line
is a tensor done. Cancelling kills the child. The child is started the way the first-load
probe starts its own (engine.native.load_probe): from any working folder, and as the app
itself with CHILD_ARG in a frozen bundle.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from engine.errors import EngineError
from engine.native.llama_lib import last_error
from engine.native.load_probe import child_env, death, last_words, python_child
from engine.native.quantize_child import CHILD_ARG, STARTED, QuantizeJob

Progress = Callable[[int, int], None]

# llama.cpp's per-tensor line: "[  12/ 272] blk.0.attn_k.weight - [  576,   192,     1,     1]"
TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+\S")
NO_START = "could not start the quantizing helper process"
POLL_S = 0.1  # how often a wait for the child's next line looks at the cancel event


class QuantizeCancelled(EngineError):
    """The quantization was cancelled; nothing was left behind."""


def child_command() -> list[str]:
    """How this process starts the child (see load_probe.python_child for the flags)."""
    return python_child("engine.native.quantize_child", CHILD_ARG)


def tensor_progress(line: str) -> tuple[int, int] | None:
    """(done, total) from llama.cpp's per-tensor line, else None."""
    m = TENSOR_LINE.match(line)
    return (int(m[1]), int(m[2])) if m else None


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def run_quantize(
    job: QuantizeJob,
    *,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> list[str]:
    """Quantize `job` in a child and return llama.cpp's log. Raises QuantizeCancelled when
    `cancel` is set (the child is killed; what it wrote is the caller's to remove), and
    EngineError with llama.cpp's reason when it refuses, or with the signal when it dies."""
    name = Path(job.source).name
    try:
        proc = subprocess.Popen(
            child_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            env=child_env(),
        )
    except OSError as e:
        raise EngineError(f"{NO_START}: {e}") from None
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    err_lines: queue.Queue[str | None] = queue.Queue()
    out_lines: queue.Queue[str | None] = queue.Queue()
    readers = [
        threading.Thread(target=_pump, args=(proc.stderr, err_lines), daemon=True),
        threading.Thread(target=_pump, args=(proc.stdout, out_lines), daemon=True),
    ]
    for r in readers:
        r.start()
    log: list[str] = []
    try:
        try:
            proc.stdin.write(job.to_json())
        except BrokenPipeError:
            pass  # a child that died at once: why is read below
        finally:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        while True:
            if cancel is not None and cancel.is_set():
                raise QuantizeCancelled(f"quantizing {name} was cancelled")
            try:
                line = err_lines.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if line is None:
                break
            log.append(line)
            step = tensor_progress(line)
            if step is not None and progress is not None:
                progress(*step)
        returncode = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for r in readers:
            r.join()
        for stream in (proc.stdout, proc.stderr):
            stream.close()
    out = _drain(out_lines)
    stderr = "\n".join(log)
    if STARTED not in out:
        raise EngineError(f"{NO_START} ({death(returncode)}): {last_words(stderr)}")
    if returncode != 0:
        raise EngineError(
            f"llama.cpp crashed while quantizing {name} ({death(returncode)}): {last_words(stderr)}"
        )
    try:
        rc = int(json.loads(out[-1])["rc"])
    except (IndexError, ValueError, KeyError, TypeError):
        raise EngineError(
            f"the child process that quantized {name} gave no answer: {last_words(stderr)}"
        ) from None
    if rc != 0:
        raise EngineError(f"llama.cpp could not quantize {name}: {failure_reason(log)}")
    return log


FAILED = "failed to quantize: "


def failure_reason(log: list[str]) -> str:
    """llama.cpp's reason from its log: the text after "failed to quantize: " (which may end a
    tensor's line), or, when that only says the model did not load, the reason logged before."""
    for i in range(len(log) - 1, -1, -1):
        at = log[i].find(FAILED)
        if at >= 0:
            why = log[i][at + len(FAILED) :].strip()
            if "failed to load model" not in why:
                return why
            return last_error(log[:i])
    return last_error(log)


def _drain(lines: queue.Queue[str | None]) -> list[str]:
    out: list[str] = []
    while True:
        try:
            line = lines.get_nowait()
        except queue.Empty:
            return out
        if line is not None and line.strip():
            out.append(line)
