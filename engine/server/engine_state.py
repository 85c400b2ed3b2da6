"""What the HTTP layer serves: a loaded model (its one decode loop, shared with the desktop
chat when the app serves it) and its embedder, or why not yet."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from engine.decoding.reasoning import thinking_markers
from engine.decoding.thinking_budget import BudgetKeeper, ThinkingBudget
from engine.errors import EngineError
from engine.host.host import UNSET, Lease, ModelHost, ModelNotFound, NoRoom, Unset
from engine.host.requests import Event, Finished, Request
from engine.host.runtime import Model
from engine.host.scheduler import Scheduler
from engine.media.prompt import MediaPrompt
from engine.model.facts import POOLING_RANK, ModelFacts, embedding_pooling, model_facts
from engine.server.config import ServerConfig
from engine.server.embeddings import Embedder
from engine.server.errors import ApiError
from engine.server.metrics import Metrics
from engine.server.model_store import ModelStore, NamedModel
from engine.server.request_log import RequestLog, current_record
from engine.settings import SamplingParams


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (links resolved)."""
    if a == b:
        return True
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def file_digest(path: Path) -> str:
    """A stable id for a file (path, size, mtime), not a hash of its bytes."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class ServedModel:
    """A model being served: the HTTP side's handle on it. `close()` ends the server's own
    requests and frees the embedder; the model and its loop belong to whoever loaded it (the
    app's chat may go on using them)."""

    model: Model
    scheduler: Scheduler
    model_id: str
    embedder: Embedder | None = None
    facts: ModelFacts | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    # The server's requests in flight: stopping the server ends these, not the chat's.
    requests: weakref.WeakSet[Request] = field(default_factory=weakref.WeakSet)
    # Where a request's images and audio are decoded (a photo takes a while): with a projector.
    media_executor: ThreadPoolExecutor | None = None

    @classmethod
    def build(
        cls, model: Model, model_id: str, *, max_queue: int = 64, embeddings: bool = True
    ) -> ServedModel:
        sched = model.loop
        sched.max_queue = max_queue
        facts = None
        with contextlib.suppress(Exception):  # facts are informational only
            facts = model_facts(model.gguf)
        created = int(model.path.stat().st_mtime) if model.path.exists() else int(time.time())
        embedder = Embedder(model) if embeddings else None
        media = None
        if getattr(model, "projector", None) is not None:
            media = ThreadPoolExecutor(1, thread_name_prefix="candlewick-media")
            media.submit(lambda: None).result()  # its thread starts now, not in a request
        return cls(model, sched, model_id, embedder, facts, created, media_executor=media)

    @property
    def digest(self) -> str:
        return file_digest(self.model.path)

    def settings(self) -> dict[str, Any]:
        """What the model was loaded with (shown on /health, /v1/models and at startup)."""
        p = self.model.params
        info = self.model.load_info
        return {
            "slots": self.scheduler.n_slots,
            "ctx_per_slot": self.scheduler.n_ctx_seq,
            "kv_type_k": p.type_k,
            "kv_type_v": p.type_v,
            # What llama.cpp did when it created the context ('auto' resolved).
            "flash_attn": "on" if self.model.flash_attn_on else "off",
            "speculative": p.speculative.mode if p.speculative is not None else "off",
            "flash_attn_requested": p.flash_attn,
            "kv_cache_mib": round(self.model.memory_actual.kv_bytes / 2**20, 2),
            "threads": info.n_threads,
            "gpu_layers": info.n_gpu_layers,
        }

    def cancel_requests(self) -> None:
        """End the server's requests now (their streams close), not after uvicorn's grace
        time; other clients' requests to the same model go on."""
        for req in list(self.requests):
            req.cancel()
        for req in list(self.requests):
            req.done.wait(5.0)

    def close(self) -> None:
        self.cancel_requests()
        if self.embedder is not None:
            self.embedder.close()
        if self.media_executor is not None:
            self.media_executor.shutdown(wait=True, cancel_futures=True)


# The leases a request holds on models, released when its answer has been sent (streamed
# answers included): set per request by the app's middleware.
request_leases: contextvars.ContextVar[list[Lease] | None] = contextvars.ContextVar(
    "request_leases", default=None
)


SERVER_OWNER = "server"  # the host's owner of a model `set_loaded` put there


@dataclass(eq=False)
class _Served:
    """What a state keeps about one model, on the host's entry (the host is the one
    registry): its `ServedModel`, and whether the state closes it when the model goes or the
    state closes (`ours`) or `set_loaded`'s caller does. `retired`: handles it built that a
    given one replaced while requests may still read them, closed with this one."""

    served: ServedModel
    ours: bool
    retired: list[ServedModel] = field(default_factory=list)

    def close(self) -> None:
        for loaded in self.retired:
            loaded.close()
        if self.ours:
            self.served.close()


class ServerState:
    """Shared by all routes: the config, and the models served, from `host` (which may load
    more on demand). `set_loaded` serves a model the caller loaded and keeps. What the state
    keeps per model lives on the host's entry, so it goes when the host unloads the model."""

    def __init__(
        self,
        config: ServerConfig,
        metrics: Metrics | None = None,
        request_log: RequestLog | None = None,
        host: ModelHost | None = None,
        store: ModelStore | None = None,
    ) -> None:
        self.config = config
        # The library's pulls, copies and created models (engine.server.model_store); None:
        # this server does not manage models.
        self.store = store
        self.metrics = metrics or Metrics()
        self.request_log = request_log  # None: nobody watches individual requests
        self.host = host if host is not None else ModelHost()
        self.load_error: str | None = None
        # True while the model named at start loads: /health says "loading" until it is in.
        self.starting = False
        self.started = time.time()
        # One set_loaded at a time; reentrant: the host's listeners may call it back.
        self._lock = threading.RLock()
        # What routes started besides the models (the speech-to-text process), closed last.
        self.on_close: list[Callable[[], None]] = []

    # -- the models ------------------------------------------------------------------------

    def set_loaded(self, loaded: ServedModel | None) -> None:
        """Serve `loaded` (the caller loaded it and frees it), or stop serving it (None).
        One replaced while its model is still in the host is the state's from then on."""
        with self._lock:
            old = self._given()
            if old is not None:
                name, was = old
                if self.host.owner_of(name) == SERVER_OWNER:  # set_loaded put it there
                    self.host.remove(name)
                else:
                    # Still in the host (the chat left it to the API's requests): served
                    # on, and closed by this state when the host unloads it.
                    was.ours = True
            if loaded is not None:
                self._give(loaded)

    def _give(self, loaded: ServedModel) -> None:
        name = next(
            (
                h.name
                for h in self.host.hosted()
                if h.path == loaded.model.path and self._is(h.name, loaded.model)
            ),
            None,
        )
        if name is None:
            self.host.add(
                loaded.model_id, loaded.model, owner=SERVER_OWNER, aliases=[loaded.model_id]
            )
            name = loaded.model_id
        elif name != loaded.model_id:
            self.host.add_alias(name, loaded.model_id)
        given = _Served(loaded, ours=False)
        old = cast(_Served | None, self.host.attachments.set(name, self, given))
        if old is not None:  # requests may still read what the state built: closed later
            given.retired = [*old.retired, *([old.served] if old.ours else [])]

    def _given(self) -> tuple[str, _Served] | None:
        """The model `set_loaded` serves, by its name in the host."""
        return next(((n, a) for n, a in self._kept() if not a.ours), None)

    def _kept(self) -> list[tuple[str, _Served]]:
        return [(n, cast(_Served, a)) for n, a in self.host.attachments.of(self)]

    def _is(self, name: str, model: Model) -> bool:
        try:
            return self.host.get(name) is model
        except EngineError:
            return False

    @property
    def loaded(self) -> ServedModel | None:
        """The default model when it is loaded: the one `set_loaded` serves, else the one
        named in the config, else the only one loaded."""
        given = self._given()
        if given is not None:
            return given[1].served
        names = self.host.names()
        want = next((n for n in names if n == self.config.model_id), None)
        if want is None and len(names) == 1:
            want = names[0]
        if want is None:
            return None
        with contextlib.suppress(EngineError):
            return self._serve(want)
        return None

    def served(self) -> list[ServedModel]:
        """Every loaded model, as the server serves it."""
        out = []
        for name in self.host.names():
            with contextlib.suppress(EngineError):
                out.append(self._serve(name))
        return out

    def _serve(self, name: str) -> ServedModel:
        """The state's handle on the loaded model `name`, built the first time."""

        def build(name: str, model: Model) -> _Served:
            loaded = ServedModel.build(
                model, name, max_queue=self.config.max_queue, embeddings=self.config.embeddings
            )
            return _Served(loaded, ours=True)

        return self.host.attachments.get(name, self, build).served

    def named(self, name: str | None) -> NamedModel | None:
        """The store's named model `name` (pulled, copied or created), or None."""
        if self.store is None or not name:
            return None
        return self.store.named(name)

    def name_of_file(self, named: NamedModel) -> str:
        """The host's name for a named model's file."""
        for spec in self.host.known():
            if same_file(spec.path, named.path):
                return spec.name
        raise ApiError(404, f"the file of {named.name} is gone ({named.path.name})", param="model")

    async def acquire(
        self,
        name: str | None,
        *,
        keep_s: float | Unset | None = UNSET,
        generate: bool = True,
        recipes: bool = False,
    ) -> ServedModel:
        """The model a request names (None or '': the default), loaded on demand; held until
        the request's answer has been sent. An unknown name is a 404 listing the known ones;
        a load that cannot fit is a 503 with the reason. `generate`: the request wants text,
        which an embedding model cannot give (a 400 naming the model). A named model loads
        its file; one made by /api/create only where the route applies its recipe
        (`recipes`), or its answers would not be that model's."""
        name = name or self.config.model_id
        named = self.named(name)
        if named is not None:
            if named.has_recipe and not recipes:
                raise ApiError(
                    400,
                    f"model {name!r} was made with /api/create: ask it through /api/chat or "
                    "/api/generate, which apply its system prompt and parameters",
                    param="model",
                )
            name = await asyncio.to_thread(self.name_of_file, named)
        leases = request_leases.get()
        try:
            lease = self.host.acquire_ready(name, keep_s=keep_s)
            if lease is None:  # to be loaded (or being loaded): wait off the event loop
                lease = await asyncio.to_thread(
                    self.host.acquire, name, keep_s=keep_s, timeout_s=self.config.request_timeout_s
                )
        except ModelNotFound as e:
            if not e.names:
                raise self.unavailable() from None
            raise ApiError(404, str(e), code="model_not_found", param="model") from None
        except NoRoom as e:
            raise ApiError(503, str(e), code="insufficient_memory") from None
        except EngineError as e:
            raise ApiError(503, str(e), code="model_load_failed") from None
        if generate and lease.model.embedding_only:
            lease.release()
            answers = (
                "a reranking model: it answers /v1/rerank"
                if embedding_pooling(lease.model.gguf) == POOLING_RANK
                else "an embedding model: it answers /v1/embeddings and /api/embed"
            )
            raise ApiError(
                400,
                f"model {lease.name!r} is {answers}, not text generation",
                code="model_not_supported",
                param="model",
            )
        if leases is not None:
            leases.append(lease)
        else:  # outside a request (tests): hold it no longer than the call
            lease.release()
        return self._serve(lease.name)

    def unavailable(self) -> ApiError:
        """Why there is nothing to serve yet: the model is loading, or failed to."""
        if self.load_error:
            return ApiError(503, self.load_error)
        return ApiError(
            503, "the model is still loading; retry shortly", headers={"Retry-After": "2"}
        )

    def close(self) -> None:
        """Close what the state built; one `set_loaded` gave stays its caller's."""
        for kept in self.host.attachments.drop(self):
            kept.close()
        for close in self.on_close:
            close()


class _LoopInbox:
    """Scheduler events on their way into one event loop, one wake-up per burst.

    A decode step emits a piece for every streaming request; waking the loop once per step
    instead of once per piece saves a self-pipe write and a loop iteration per stream (16 per
    step at 16 concurrent streams), work that competes with llama.cpp's threads for the CPU."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[Event], Event]] = []

    def put(self, q: asyncio.Queue[Event], ev: Event) -> None:
        with self._lock:
            self._pending.append((q, ev))
            if len(self._pending) > 1:
                return  # a drain is already scheduled and will take this one too
        with contextlib.suppress(RuntimeError):  # loop already closed: nobody listens
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._pending = self._pending, []
        for q, ev in items:
            q.put_nowait(ev)


_inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopInbox] = (
    weakref.WeakKeyDictionary()
)
_inboxes_lock = threading.Lock()


def _inbox(loop: asyncio.AbstractEventLoop) -> _LoopInbox:
    with _inboxes_lock:
        box = _inboxes.get(loop)
        if box is None:
            box = _inboxes[loop] = _LoopInbox(loop)
        return box


def budget_keeper(model: Model, budget: ThinkingBudget) -> BudgetKeeper:
    """A request's reasoning budget with the tokens of its close for this vocabulary."""
    close = model.tokenize(budget.forced_text, add_special=False, parse_special=True)
    return BudgetKeeper(budget, close)


class AsyncGeneration:
    """One scheduler request seen from the event loop: an async stream of its events.

    Leaving the iteration early (client gone, handler cancelled) cancels the request, which
    frees its slot and KV cells before the next decode step."""

    def __init__(
        self,
        loaded: ServedModel,
        prompt: list[int],
        sampling: SamplingParams,
        *,
        stream: bool,
        timeout_s: float,
        metrics: Metrics,
        media: MediaPrompt | None = None,
        logprobs: int | None = None,
        lora: dict[int, float] | None = None,
        thinking: ThinkingBudget | None = None,
    ) -> None:
        inbox = _inbox(asyncio.get_running_loop())
        self._q: asyncio.Queue[Event] = asyncio.Queue()
        self._metrics = metrics
        self._record = current_record.get()
        q = self._q

        def on_event(ev: Event) -> None:
            inbox.put(q, ev)

        try:
            self.request: Request = loaded.scheduler.submit(
                prompt,
                sampling,
                on_event,
                stream=stream,
                timeout_s=timeout_s,
                media=media,
                logprobs=logprobs,
                lora=lora,
                thinking=None if thinking is None else budget_keeper(loaded.model, thinking),
            )
        except BaseException:
            if media is not None:
                media.close()  # never queued: nothing else frees its chunks
            raise
        loaded.requests.add(self.request)

    async def events(self) -> AsyncIterator[Event]:
        try:
            while True:
                ev = await self._q.get()
                if isinstance(ev, Finished):
                    st = ev.stats
                    if self._record is not None:
                        self._record.add_tokens(st.prompt_tokens, st.gen_tokens)
                    if st.stop_reason not in ("cancelled", "error"):
                        self._metrics.generation_done(
                            st.prompt_tokens, st.cached_tokens, st.gen_tokens, st.ttft_s, st.total_s
                        )
                    yield ev
                    return
                yield ev
        finally:
            if not self.request.done.is_set():
                self.request.cancel()

    async def result(self) -> Finished:
        async for ev in self.events():
            if isinstance(ev, Finished):
                return ev
        raise RuntimeError("generation ended without a result")  # pragma: no cover

    def cancel(self) -> None:
        self.request.cancel()


def details(loaded: ServedModel) -> dict[str, Any]:
    return facts_details(loaded.facts)


def facts_details(f: ModelFacts | None) -> dict[str, Any]:
    """Ollama's `details` of a model, from its file's facts."""
    return {
        "parent_model": "",
        "format": "gguf",
        "family": f.architecture if f else "",
        "families": [f.architecture] if f else [],
        "parameter_size": f.params_label if f else "",
        "quantization_level": f.quantization if f else "",
    }


def capabilities(
    template: str | None,
    embeds: bool,
    *,
    embedding_only: bool = False,
    reranker: bool = False,
    media: Sequence[str] = (),
) -> list[str]:
    """As Ollama names them. Every text generator can call tools: one whose template has no
    tool support gets the generic format (engine.server.chat_reply). An embedding model
    only embeds; a reranker does neither (Ollama has no name for what it does). `media`:
    what its projector reads ("vision", "audio"; a model not loaded has none yet)."""
    if reranker:
        return []
    if embedding_only:
        return ["embedding"] if embeds else []
    caps = ["completion", *media, "tools"]
    if thinking_markers(template) is not None:
        caps.append("thinking")
    if embeds:
        caps.append("embedding")
    return caps


def served_capabilities(loaded: ServedModel) -> list[str]:
    """A loaded model's capabilities, its projector's included."""
    f = loaded.facts
    return capabilities(
        loaded.model.template.source,
        loaded.embedder is not None,
        embedding_only=bool(f and f.embedding_only),
        reranker=bool(f and f.is_reranker),
        media=media_capabilities(loaded),
    )


def media_capabilities(loaded: ServedModel) -> list[str]:
    """What the served model's projector reads, as Ollama names it: "vision", "audio"."""
    proj = getattr(loaded.model, "projector", None)  # (a stand-in model may have none)
    if proj is None:
        return []
    return [name for name, has in (("vision", proj.vision), ("audio", proj.audio)) if has]
