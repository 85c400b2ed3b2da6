"""The engine thread: one long-lived QThread that owns the loaded `engine.runtime.Model`.

The GUI never calls the model. `EngineHost` (GUI thread) emits private request signals that
are queued into `EngineWorker` (engine thread); the worker answers with its own signals, which
Qt queues back to the GUI thread. The worker never touches a widget or an item model.

Stopping cannot be a queued signal: while a reply is being generated the engine thread is
busy in its loop and would only see the request afterwards. Each request therefore carries a
`threading.Event` that the GUI sets and the loop checks before every token.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from engine.context_policy import ContextPolicy, fit_messages
from engine.gguf import GGUFError
from engine.memory import actual_from_log
from engine.runtime import (
    EngineError,
    Generation,
    LoadCancelled,
    LoadParams,
    Model,
    SamplingParams,
)

log = logging.getLogger("candlewick.ui")

# Coalescing interval for token signals: at most ~60 GUI updates a second.
TOKEN_INTERVAL_S = 1 / 60


class ModelFactory(Protocol):
    def __call__(self, path: Path, params: LoadParams, *,
                 progress: Callable[[float], None] | None = ...,
                 cancel: threading.Event | None = ...) -> Model: ...


@dataclass(frozen=True)
class LoadedModel:
    """What the GUI learns about a model once llama.cpp has loaded it."""

    path: Path
    name: str
    n_ctx: int
    n_layer: int
    n_gpu_layers: int
    load_s: float
    # Buffer sizes llama.cpp reported while loading: weights / kv / compute / output, bytes.
    actual_bytes: dict[str, int] = field(default_factory=dict)
    # The settings it was loaded with (the benchmark loads the same file the same way).
    params: LoadParams | None = None

    @property
    def actual_total(self) -> int:
        return sum(self.actual_bytes.values())


def _actual(lines: Sequence[str]) -> dict[str, int]:
    """What llama.cpp reported allocating while it loaded: an independent check of the
    estimate shown before the load."""
    a = actual_from_log(lines)
    out = {"weights": a.weights_bytes, "kv": a.kv_bytes, "compute": a.compute_bytes,
           "output": a.output_bytes}
    return {k: v for k, v in out.items() if v}


def _default_factory(path: Path, params: LoadParams, *,
                     progress: Callable[[float], None] | None = None,
                     cancel: threading.Event | None = None) -> Model:
    return Model(path, params, progress=progress, cancel=cancel)


class EngineWorker(QObject):
    """Lives in the engine thread. Slots run there; signals are queued to the GUI."""

    progress = Signal(float)  # load progress 0..1
    loaded = Signal(object)  # LoadedModel
    load_cancelled = Signal()
    started = Signal(int)  # prompt tokens of the reply being generated
    tokens = Signal(str, int)  # coalesced text, tokens generated so far
    finished = Signal(object)  # GenerationStats
    failed = Signal(str)  # one-line message for the user
    unloaded = Signal()
    trimmed = Signal(int)  # old messages left out so the conversation fits the context

    def __init__(self, model_factory: ModelFactory = _default_factory,
                 token_interval_s: float = TOKEN_INTERVAL_S) -> None:
        super().__init__()
        self._factory = model_factory
        self._interval = token_interval_s
        self.model: Model | None = None

    @Slot(object, object, object)
    def load(self, path: Path, params: LoadParams, cancel: threading.Event) -> None:
        self.close_model()
        last = [-1.0]

        def on_progress(p: float) -> None:
            # llama.cpp reports hundreds of steps; the bar needs a percent at a time.
            if p - last[0] >= 0.01 or p >= 1.0:
                last[0] = p
                self.progress.emit(p)

        try:
            model = self._factory(Path(path), params, progress=on_progress, cancel=cancel)
        except LoadCancelled:
            self.load_cancelled.emit()
            return
        except (EngineError, GGUFError, OSError) as e:
            self.failed.emit(f"Could not load {Path(path).name}: {e}")
            return
        except MemoryError:
            self.failed.emit(f"Not enough memory to load {Path(path).name}")
            return
        except Exception as e:  # a bug: the GUI must still hear that the load ended
            log.exception("load failed")
            self.failed.emit(f"Could not load {Path(path).name}: internal error "
                             f"({type(e).__name__}: {e})")
            return
        if cancel.is_set():  # cancelled after llama.cpp's last progress callback
            model.close()
            self.load_cancelled.emit()
            return
        self.model = model
        info = model.load_info
        self.loaded.emit(LoadedModel(
            path=Path(path),
            name=str(model.gguf.metadata.get("general.name") or Path(path).stem),
            n_ctx=model.n_ctx,
            n_layer=info.n_layer,
            n_gpu_layers=info.n_gpu_layers,
            load_s=info.load_s,
            actual_bytes=_actual(info.log),
            params=params,
        ))

    @Slot(object, object, object, object)
    def generate(self, messages: Sequence[Mapping[str, Any]], sampling: SamplingParams,
                 cancel: threading.Event, options: Mapping[str, Any] | None = None) -> None:
        """`options`: `policy` (a context policy: the conversation is fitted to the context,
        and `trimmed` says how many old messages were left out) and `continue_text` (a cut-off
        answer to continue: the prompt ends with it instead of a fresh assistant turn)."""
        model = self.model
        if model is None:
            self.failed.emit("No model is loaded: select one in the library and press Load")
            return
        options = options or {}
        partial = str(options.get("continue_text") or "")
        try:
            policy: ContextPolicy | None = options.get("policy")
            if policy is not None:
                extra = len(model.tokenize(partial, add_special=False)) if partial else 0
                fit = fit_messages(messages, lambda ms: len(model.chat_tokens(ms)) + extra,
                                   model.n_ctx, reserve=min(sampling.max_tokens,
                                                            model.n_ctx // 2),
                                   policy=policy)
                messages = fit.messages
                if fit.dropped:
                    self.trimmed.emit(fit.dropped)
            if partial:
                prompt = model.chat_tokens(messages) + model.tokenize(
                    partial, add_special=False, parse_special=False)
                gen = Generation(model, prompt, sampling, cancel, time.perf_counter())
            else:
                gen = model.generate(messages, sampling, cancel=cancel)
        except (EngineError, GGUFError, ValueError) as e:  # ValueError: ChatTemplateError
            self.failed.emit(str(e))
            return
        self.started.emit(len(gen.prompt))
        pending: list[str] = []
        last_emit = -math.inf  # the first piece goes out at once: time to first token shows
        interval = self._interval
        toks = gen.tokens
        try:
            for piece in gen:
                pending.append(piece)
                now = time.perf_counter()
                if now - last_emit >= interval:
                    self.tokens.emit("".join(pending), len(toks))
                    pending.clear()
                    last_emit = now
        except Exception as e:  # EngineError, or a bug: either way the reply has ended
            if pending:
                self.tokens.emit("".join(pending), len(toks))
            if not isinstance(e, EngineError):
                log.exception("generation failed")
            self.failed.emit(str(e) if isinstance(e, EngineError)
                             else f"Internal error: {type(e).__name__}: {e}")
            return
        if pending:
            self.tokens.emit("".join(pending), len(toks))
        self.finished.emit(gen.stats)

    @Slot()
    def forget_python_thread(self) -> None:
        """Python registers a dummy `threading.Thread` for a foreign thread the first time
        code there asks for the current thread (logging does) and never removes it. The
        engine thread is about to end, so drop that entry rather than leave a ghost."""
        if isinstance(threading.current_thread(), threading._DummyThread):
            with threading._active_limbo_lock:  # type: ignore[attr-defined]
                threading._active.pop(threading.get_ident(), None)  # type: ignore[attr-defined]

    @Slot()
    def unload(self) -> None:
        self.close_model()
        self.unloaded.emit()

    def close_model(self) -> None:
        if self.model is not None:
            self.model.close()
            self.model = None


class EngineHost(QObject):
    """GUI-side handle: starts the engine thread and forwards requests as queued signals."""

    _load = Signal(object, object, object)
    _generate = Signal(object, object, object, object)
    _unload = Signal()
    _forget = Signal()

    def __init__(self, worker: EngineWorker | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.worker = worker or EngineWorker()
        self.qthread = QThread()
        self.qthread.setObjectName("candlewick-engine")
        self.worker.moveToThread(self.qthread)
        q = Qt.ConnectionType.QueuedConnection
        self._load.connect(self.worker.load, q)
        self._generate.connect(self.worker.generate, q)
        self._unload.connect(self.worker.unload, q)
        self._forget.connect(self.worker.forget_python_thread,
                             Qt.ConnectionType.BlockingQueuedConnection)
        self._load_cancel: threading.Event | None = None
        self._gen_cancel: threading.Event | None = None
        self.qthread.start()

    def load(self, path: Path, params: LoadParams) -> None:
        self._load_cancel = threading.Event()
        self._load.emit(Path(path), params, self._load_cancel)

    def cancel_load(self) -> None:
        if self._load_cancel is not None:
            self._load_cancel.set()

    def generate(self, messages: Sequence[Mapping[str, Any]],
                 sampling: SamplingParams, *, policy: ContextPolicy | None = None,
                 continue_text: str = "") -> None:
        self._gen_cancel = threading.Event()
        self._generate.emit([dict(m) for m in messages], sampling, self._gen_cancel,
                            {"policy": policy, "continue_text": continue_text})

    @Slot()
    def stop(self) -> None:
        """Stop the reply being generated; honoured before the next token."""
        if self._gen_cancel is not None:
            self._gen_cancel.set()

    def unload(self) -> None:
        self._unload.emit()

    def shutdown(self) -> None:
        """Stop any work, end the thread and free the model. Safe to call twice."""
        self.stop()
        self.cancel_load()
        if self.qthread.isRunning():
            self._forget.emit()  # runs in the engine thread once it is free
            self.qthread.quit()
            self.qthread.wait()
        # The thread has ended, so touching the worker from here cannot race with it.
        self.worker.close_model()
