"""The engine thread: one long-lived QThread that owns the chat engine in use: a model loaded
in this process (`EmbeddedEngine` over `engine.host.runtime.Model`) or a remote endpoint
(`RemoteEngine`). Either is a `ChatEngine`, so the signals below, the chat controller and the
performance panel are the same for both.

The GUI never calls the engine. `EngineHost` (GUI thread; a `ThreadHost`, which owns the
thread) emits private request signals that are queued into `EngineWorker` (engine thread);
the worker answers with its own signals, which Qt queues back to the GUI thread. The worker
never touches a widget or an item model, and a remote engine's network I/O happens here,
never on the GUI thread.

Stopping cannot be a queued signal: while a reply is being generated the engine thread is
busy in its loop and would only see the request afterwards. Each request therefore carries a
`threading.Event` that the GUI sets and the loop checks before every token.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from PySide6.QtCore import QObject, Qt, Signal, Slot

from app.services.model_catalog import CHAT_OWNER
from app.ui.thread_host import ThreadHost
from engine.errors import EngineError, LoadCancelled
from engine.host.chat_engine import ChatEngine, ChatRequest, EmbeddedEngine, EmbeddedReply
from engine.host.context_meter import Kind
from engine.host.context_policy import ContextPolicy
from engine.host.context_summary import Summary
from engine.host.host import Loadable, ModelHost
from engine.host.runtime import Model
from engine.media.audio import decode_wav
from engine.media.images import decode_image
from engine.memory.actual import actual_from_log
from engine.model.facts import POOLING_RANK, embedding_pooling, model_facts
from engine.model.gguf import GGUFError, read_gguf
from engine.model.naming import model_slug
from engine.native.load_probe import FirstLoads
from engine.native.projector import Media
from engine.settings import LoadParams, SamplingParams

log = logging.getLogger("candlewick.ui")

# Coalescing interval for token signals: at most ~30 GUI updates a second. Text that moves
# 30 times a second reads as smooth, and each update is GUI-thread time that on 2 cores is
# taken from llama.cpp's decode threads: at 100 tok/s, 60/s kept the window at 90% of raw
# decode and 30/s at 92% (benchmarks/gui_stream.py, docs/benchmarks.md).
TOKEN_INTERVAL_S = 1 / 30


class ModelFactory(Protocol):
    def __call__(
        self,
        path: Path,
        params: LoadParams,
        *,
        progress: Callable[[float], None] | None = ...,
        cancel: threading.Event | None = ...,
    ) -> Model: ...


@dataclass(frozen=True)
class RemoteTarget:
    """A model on a remote endpoint: the saved connection's name and the server's model id."""

    connection: str
    model: str

    def __str__(self) -> str:
        return f"{self.connection} · {self.model}"


@dataclass(frozen=True)
class LoadedModel:
    """What the GUI learns about the engine once it is ready: a model llama.cpp has loaded, or
    a remote endpoint (`remote` set; no file, no layers, the context the server did not
    tell is 0)."""

    path: Path
    name: str  # the one name shown for it (the library's, once the window knows it)
    n_ctx: int
    n_layer: int
    n_gpu_layers: int
    load_s: float
    # Buffer sizes llama.cpp reported while loading: weights / kv / compute / output, bytes.
    actual_bytes: dict[str, int] = field(default_factory=dict)
    # The settings it was loaded with (the benchmark loads the same file the same way).
    params: LoadParams | None = None
    remote: RemoteTarget | None = None
    # Why temperature 0 may still give another answer on another run ('' = it cannot).
    repeat_caveat: str = ""
    # An id for machines: where the model is registered in the engine thread's ModelHost
    # and the Local server's HTTP model id ('' = `name`). It does not change on a rename.
    model_id: str = ""
    # What it reads besides text, through the projector it was loaded with: "image",
    # "audio"; and the sample rate audio is decoded at.
    media: frozenset[str] = frozenset()
    audio_rate: int = 0

    @property
    def host_key(self) -> str:
        """The model's name in the ModelHost (the Local server and benchmark find it so)."""
        return self.model_id or self.name

    @property
    def actual_total(self) -> int:
        return sum(self.actual_bytes.values())

    @property
    def key(self) -> Path | RemoteTarget:
        """What was chosen: the model file, or the remote target."""
        return self.remote if self.remote is not None else self.path


# Builds a remote engine; called in the engine thread.
EngineMaker = Callable[[], ChatEngine]
# An attachment sent with a request, as its file's bytes: (kind "image" | "audio", bytes,
# name). Decoded in the engine thread, where a large picture takes no GUI time.
MediaFile = tuple[str, bytes, str]


def _actual(lines: Sequence[str]) -> dict[str, int]:
    """What llama.cpp reported allocating while it loaded: an independent check of the
    estimate shown before the load."""
    a = actual_from_log(lines)
    out = {
        "weights": a.weights_bytes,
        "kv": a.kv_bytes,
        "compute": a.compute_bytes,
        "output": a.output_bytes,
    }
    return {k: v for k, v in out.items() if v}


def _not_for_chat(path: Path) -> str | None:
    """Why the chat refuses the file at `path` (an embedding model, a reranker), or None."""
    try:
        pooling = embedding_pooling(read_gguf(path))
    except (GGUFError, OSError):  # the load says what is wrong with the file
        return None
    if pooling == POOLING_RANK:
        return (
            f"{path.name} is a reranker: it cannot chat. "
            "The Local server ranks documents with it at /v1/rerank"
        )
    if pooling > 0:
        return (
            f"{path.name} is an embedding model: it cannot chat. "
            "The Local server gives its vectors at /v1/embeddings"
        )
    return None


def _default_factory(
    path: Path,
    params: LoadParams,
    *,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
) -> Model:
    return Model(path, params, progress=progress, cancel=cancel)


def probing_factory(first_loads: FirstLoads) -> ModelFactory:
    """Loads that try a file's first load in a child process (engine.native.load_probe): a file
    that makes llama.cpp abort is refused with a message instead of closing the window."""

    def make(
        path: Path,
        params: LoadParams,
        *,
        progress: Callable[[float], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Model:
        return Model(path, params, progress=progress, cancel=cancel, first_loads=first_loads)

    return make


class EngineWorker(QObject):
    """Lives in the engine thread. Slots run there; signals are queued to the GUI."""

    progress = Signal(float)  # load progress 0..1
    loaded = Signal(object)  # LoadedModel
    load_cancelled = Signal()
    # Every signal about a reply carries its request id (`EngineHost.generate` returns it):
    # a late signal of an abandoned reply can never land in the message shown now.
    started = Signal(int, int)  # request id, prompt tokens of the reply being generated
    tokens = Signal(int, str, int)  # request id, coalesced text, tokens generated so far
    # A reasoning model's thinking block, apart from the answer: coalesced thinking text
    # (request id, text, tokens so far), and once the block closes (request id, tokens
    # generated by then, seconds from the first token).
    reasoning = Signal(int, str, int)
    thought = Signal(int, int, float)
    # The tool calls a reply made (request id, [{"id", "name", "arguments"}], arguments as
    # JSON text), just before its `finished`; only when it made some.
    tool_calls = Signal(int, object)
    finished = Signal(int, object)  # request id, GenerationStats
    failed = Signal(int, str)  # request id (0: not about a reply), one-line message
    unloaded = Signal()
    trimmed = Signal(int)  # old messages left out so the conversation fits the context
    # Request id, ContextMeter: where the prompt sent went, by kind (a model loaded here).
    meter = Signal(int, object)
    # Request id, Summary: turns left out under policy "summarise", summarised anew.
    summarised = Signal(int, object)

    def __init__(
        self,
        model_factory: ModelFactory = _default_factory,
        token_interval_s: float = TOKEN_INTERVAL_S,
        host: ModelHost | None = None,
    ) -> None:
        """`host`: where the loaded model is registered, by its name, for the other clients
        of the same loaded model (the Local server window)."""
        super().__init__()
        self._factory = model_factory
        self._interval = token_interval_s
        self.host = host or ModelHost()
        self.engine: ChatEngine | None = None
        self._model: Model | None = None  # the engine's, when it is a model loaded here

    @property
    def model(self) -> Model | None:
        """The model loaded in this process (None when none is, or the engine is remote)."""
        return self._model

    @Slot(object, object, object)
    def load(self, path: Path, params: LoadParams, cancel: threading.Event) -> None:
        refused = _not_for_chat(Path(path))
        if refused is not None:  # refused before the chat's model goes
            self.failed.emit(0, refused)
            return
        self.close_model()
        last = [-1.0]

        def on_progress(p: float) -> None:
            # llama.cpp reports hundreds of steps; the bar needs a percent at a time.
            if p - last[0] >= 0.01 or p >= 1.0:
                last[0] = p
                self.progress.emit(p)

        claimed = self.host.claim(Path(path), owner=CHAT_OWNER, params=params)
        if claimed is not None:
            # The API loaded this file on demand: the chat takes that model, not a copy.
            self._adopt(Path(path), params, *claimed)
            return
        short = self.host.make_room(Loadable(Path(path).stem, Path(path), params))
        if short is not None:  # the user chose to load it; llama.cpp's own checks decide
            log.info("loading %s anyway: %s", Path(path).name, short)
        try:
            model = self._factory(Path(path), params, progress=on_progress, cancel=cancel)
        except LoadCancelled:
            self.load_cancelled.emit()
            return
        except (EngineError, GGUFError, OSError) as e:
            self.failed.emit(0, f"Could not load {Path(path).name}: {e}")
            return
        except MemoryError:
            self.failed.emit(0, f"Not enough memory to load {Path(path).name}")
            return
        except Exception as e:  # a bug: the GUI must still hear that the load ended
            log.exception("load failed")
            self.failed.emit(
                0, f"Could not load {Path(path).name}: internal error ({type(e).__name__}: {e})"
            )
            return
        if cancel.is_set():  # cancelled after llama.cpp's last progress callback
            model.close()
            self.load_cancelled.emit()
            return
        self._adopt(Path(path), params, None, model)

    def _adopt(self, path: Path, params: LoadParams, host_name: str | None, model: Model) -> None:
        """Chat with `model`: put it in the host (unless it is there as `host_name`) and
        tell the GUI."""
        facts = model_facts(model.gguf)
        name = facts.display_name or path.stem  # the window shows the library's name
        model_id = model_slug(name)
        if host_name is None:
            self.host.add(model_id, model, owner=CHAT_OWNER)
        elif host_name != model_id:
            self.host.add_alias(host_name, model_id)
        self.engine = EmbeddedEngine(model, host_name or model_id)
        self._model = model
        info = model.load_info
        proj = getattr(model, "projector", None)  # test doubles have none
        kinds = {"image": proj.vision, "audio": proj.audio} if proj is not None else {}
        self.loaded.emit(
            LoadedModel(
                path=path,
                name=name,
                model_id=model_id,
                n_ctx=model.n_ctx_seq,  # what one conversation holds
                n_layer=info.n_layer,
                n_gpu_layers=info.n_gpu_layers,
                load_s=info.load_s,
                actual_bytes=_actual(info.log),
                params=params,
                repeat_caveat=model.repeat_caveat,
                media=frozenset(k for k, has in kinds.items() if has),
                audio_rate=proj.audio_rate if proj is not None else 0,
            )
        )

    @Slot(object, object, object)
    def connect_remote(
        self, target: RemoteTarget, make: EngineMaker, cancel: threading.Event
    ) -> None:
        """Use a remote endpoint: frees the local model (as loading another would) and
        answers `loaded` with the target. Whether the server is up shows on the first reply,
        in the chat, where its errors belong."""
        self.close_model()
        t0 = time.perf_counter()
        try:
            engine = make()
        except (EngineError, ValueError, OSError) as e:
            self.failed.emit(0, f"Could not use {target}: {e}")
            return
        except Exception as e:  # a bug: the GUI must still hear that the switch ended
            log.exception("connect failed")
            self.failed.emit(0, f"Could not use {target}: internal error ({type(e).__name__}: {e})")
            return
        if cancel.is_set():
            engine.close()
            self.load_cancelled.emit()
            return
        self.engine = engine
        self.loaded.emit(
            LoadedModel(
                path=Path(),
                name=engine.name,
                n_ctx=engine.n_ctx or 0,
                n_layer=0,
                n_gpu_layers=0,
                load_s=time.perf_counter() - t0,
                remote=target,
                repeat_caveat="the server decides how it computes each answer",
            )
        )

    @Slot(object, object, int, object)
    def generate(
        self,
        request: ChatRequest,
        cancel: threading.Event,
        rid: int = 0,
        files: Sequence[MediaFile] = (),
    ) -> None:
        """Read the reply to `request` (engine.host.chat_engine.ChatRequest) as signals that
        carry `rid`. With a context policy, `trimmed` says how many old messages were left
        out; a reasoning model's thinking comes as `reasoning` and `thought`; the calls of
        the tools offered come as `tool_calls` before `finished`. `files`: the request's
        images and audio, decoded here into its `media` (a file that cannot be read fails
        the reply with its one-line reason)."""
        engine = self.engine
        if engine is None:
            self.failed.emit(rid, "No model is loaded: select one in the library and press Load")
            return
        try:
            if files:
                request = dataclasses.replace(request, media=self._decode(files))
        except EngineError as e:  # MediaError: one line naming the file
            self.failed.emit(rid, str(e))
            return
        try:
            if isinstance(engine, EmbeddedEngine) and request.policy == "summarise":
                # Asked of the same engine as any answer, before it (greedy, its own turn).
                summary = engine.summary_for(request, cancel)
                if summary is not None:
                    request = dataclasses.replace(request, summary=summary)
                    self.summarised.emit(rid, summary)
            reply = engine.reply(request, cancel)
        except (EngineError, GGUFError, ValueError) as e:  # ValueError: ChatTemplateError
            self.failed.emit(rid, str(e))
            return
        except Exception as e:  # a bug: the GUI must still hear that the reply ended
            log.exception("reply failed to start")
            self.failed.emit(rid, f"Internal error: {type(e).__name__}: {e}")
            return
        if reply.dropped_messages:
            self.trimmed.emit(reply.dropped_messages)
        # A remote server tells the prompt's size (if at all) only at the end.
        self.started.emit(rid, reply.prompt_tokens or 0)
        if isinstance(reply, EmbeddedReply):
            # Measured here, not on the GUI thread: it tokenizes every prefix of the prompt.
            try:
                meter = reply.meter(request.kinds, request.tails)
            except EngineError:  # the model went meanwhile: its reply fails on its own
                meter = None
            if meter is not None:
                self.meter.emit(rid, meter)
        # A reasoning model's reply is read apart: thinking, then the answer.
        pending: list[tuple[str, str]] = []  # (kind, text) in order, kinds merged on emit

        def emit_pending(closed: tuple[int, float] | None = None) -> None:
            """Send what is pending; `closed`: the block ended, said before the answer."""
            runs: list[tuple[str, str]] = []
            for kind, text in pending:
                if runs and runs[-1][0] == kind:
                    runs[-1] = (kind, runs[-1][1] + text)
                elif text:
                    runs.append((kind, text))
            pending.clear()
            for kind, text in runs:
                if kind == "content" and closed is not None:
                    self.thought.emit(rid, *closed)
                    closed = None
                signal = self.reasoning if kind == "reasoning" else self.tokens
                signal.emit(rid, text, reply.generated_tokens)
            if closed is not None:
                self.thought.emit(rid, *closed)

        last_emit = -math.inf  # the first piece goes out at once: time to first token shows
        interval = self._interval
        closed_sent = False
        try:
            for parts in reply.parts():
                pending.extend(parts)
                now = time.perf_counter()
                if reply.thought is not None and not closed_sent:
                    # The thinking ends here: its last words, then the block's figures, at
                    # once (the view folds it away as the answer starts).
                    emit_pending(reply.thought)
                    closed_sent = True
                    last_emit = now
                elif pending and now - last_emit >= interval:
                    emit_pending()
                    last_emit = now
        except Exception as e:  # EngineError (a remote one too), or a bug: the reply ended
            emit_pending()
            if not isinstance(e, EngineError):
                log.exception("generation failed")
            self.failed.emit(
                rid,
                str(e)
                if isinstance(e, EngineError)
                else f"Internal error: {type(e).__name__}: {e}",
            )
            return
        emit_pending()
        calls = reply.tool_calls
        if calls:
            self.tool_calls.emit(
                rid, [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]
            )
        self.finished.emit(rid, reply.stats)

    def _decode(self, files: Sequence[MediaFile]) -> list[Media]:
        proj = getattr(self._model, "projector", None)
        rate = proj.audio_rate if proj is not None and proj.audio_rate else 16000
        return [
            decode_image(data, name) if kind == "image" else decode_wav(data, rate, name)
            for kind, data, name in files
        ]

    @Slot()
    def unload(self) -> None:
        self.close_model()
        self.unloaded.emit()

    def close_model(self) -> None:
        engine, self.engine = self.engine, None
        model, self._model = self._model, None
        if engine is None:
            return
        if model is not None:
            if self.host.hand_over(engine.name):
                return  # API requests use it: the host unloads it once they are done
            self.host.remove(engine.name)  # its other clients stop first
        engine.close()


class EngineHost(ThreadHost[EngineWorker]):
    """GUI-side handle: starts the engine thread and forwards requests as queued signals."""

    _load = Signal(object, object, object)
    _connect = Signal(object, object, object)
    _generate = Signal(object, object, int, object)
    _unload = Signal()

    def __init__(self, worker: EngineWorker | None = None, parent: QObject | None = None) -> None:
        super().__init__(worker or EngineWorker(), "candlewick-engine", parent)
        q = Qt.ConnectionType.QueuedConnection
        self._load.connect(self.worker.load, q)
        self._connect.connect(self.worker.connect_remote, q)
        self._generate.connect(self.worker.generate, q)
        self._unload.connect(self.worker.unload, q)
        self._load_cancel: threading.Event | None = None
        self._gen_cancel: threading.Event | None = None
        self._last_id = 0
        self.start()

    def load(self, path: Path, params: LoadParams) -> None:
        self._load_cancel = threading.Event()
        self._load.emit(Path(path), params, self._load_cancel)

    def connect_remote(self, target: RemoteTarget, make: EngineMaker) -> None:
        """Switch to a remote engine; `make` builds it in the engine thread."""
        self._load_cancel = threading.Event()
        self._connect.emit(target, make, self._load_cancel)

    def cancel_load(self) -> None:
        if self._load_cancel is not None:
            self._load_cancel.set()

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: SamplingParams,
        *,
        policy: ContextPolicy | None = None,
        continue_text: str = "",
        continue_thinking: str = "",
        thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] = "auto",
        media: Sequence[MediaFile] = (),
        summary: Summary | None = None,
        kinds: Mapping[int, Kind] | None = None,
        tails: Mapping[int, tuple[Kind, str]] | None = None,
    ) -> int:
        """Start a reply; returns its request id, which every signal about it carries.
        `thinking=False`: a reasoning model is asked not to think (structured output).
        `tools`: OpenAI function tools offered (a model loaded here); calls come as
        `tool_calls`. `media`: the images and audio the messages' markers stand for."""
        self._gen_cancel = threading.Event()
        self._last_id += 1
        request = ChatRequest(  # copies: the GUI's lists may change while the engine reads
            [dict(m) for m in messages],
            sampling,
            policy=policy,
            continue_text=continue_text,
            continue_thinking=continue_thinking,
            thinking=thinking,
            tools=[dict(t) for t in tools or ()],
            tool_choice=tool_choice,
            summary=summary,
            kinds=dict(kinds or {}),
            tails=dict(tails or {}),
        )
        self._generate.emit(request, self._gen_cancel, self._last_id, list(media))
        return self._last_id

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
        self.stop_thread()
        # The thread has ended, so touching the worker from here cannot race with it.
        self.worker.close_model()
