"""The desktop app's local server: the model the chat has loaded, served over HTTP as
`candlewick serve` would serve it, from the same loaded model and its one decode loop.

Qt-free. `LocalServer.start()` binds the socket, then makes room in the model's context for
the server's slots (the context is recreated on the same weights with one sequence per slot
plus the chat's, which stays reserved for the chat: nothing is loaded a second time) and is
meant to run off the GUI thread; `stop()` may be called from any thread, at any time, more
than once, and gives the chat its context back. The server serves the whole app host: the
library's other models load on demand, and it goes on when the chat switches or ejects its
model (a model API requests use stays until they are done).
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.services.model_catalog import CHAT_OWNER
from engine.errors import EngineError, LoadCancelled
from engine.host.host import ModelHost
from engine.host.requests import SchedulerSnapshot
from engine.host.runtime import Model
from engine.server import ServedModel, ServerConfig, ServerState, ServerThread
from engine.server.model_store import ModelStore
from engine.server.request_log import RequestLog
from engine.server.runner import bind_socket
from engine.settings import LoadParams

KEY_ACCOUNT = "local-server-api-key"  # where the key lives in the system keyring
LEASE = "Local server"  # who holds the model's slots while it runs
LOG_ROWS = 500


def new_api_key() -> str:
    """A random key: 32 bytes from the OS generator, URL-safe (43 characters)."""
    return "cw-" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    parallel: int = 4  # slots: requests decoded together
    ctx_per_slot: int = 4096
    max_queue: int = 64
    model_id: str = "default"

    def config(self) -> ServerConfig:
        """The server's config; `validate()` it to get the security rules' one-line refusals."""
        return ServerConfig(
            host=self.host,
            port=self.port,
            api_key=self.api_key or None,
            model_id=self.model_id,
            max_queue=self.max_queue,
            default_max_tokens=min(512, self.ctx_per_slot),
        )

    def load_params(self, base: LoadParams) -> LoadParams:
        """The chat's load settings with the context the server gives the loaded model: one
        sequence per slot plus the chat's, each as long as the longer of the two."""
        per_slot = max(self.ctx_per_slot, base.n_ctx // max(base.n_seq_max, 1))
        return dataclasses.replace(
            base, n_ctx=per_slot * (self.parallel + 1), n_seq_max=self.parallel + 1
        )


def check_port_free(host: str, port: int) -> None:
    """Raises ServerError ("cannot listen on 127.0.0.1:8080: Address already in use") now,
    before a model is loaded for nothing."""
    bind_socket(host, port).close()


def local_url(host: str, port: int) -> str:
    """The URL to use from this computer: a server on all interfaces is reached locally
    through the loopback address."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "::1"
    if ":" in host:
        host = f"[{host.strip('[]')}]"
    return f"http://{host}:{port}"


class LocalServer:
    def __init__(
        self,
        host: ModelHost,
        name: str,
        settings: ServeSettings,
        *,
        title: str = "",
        store: ModelStore | None = None,
    ) -> None:
        """Serve the app's host, starting with the model loaded there as `name` (the
        chat's); `title`: its name for people, in messages (default: `name`); `store`: the
        library's pulls, copies and created models (Ollama's /api/pull...), whose downloads
        the Downloads page shows as they run."""
        self.model_host = host
        self.name = name
        self.title = title or name
        self.settings = settings
        config = settings.config()
        config.validate()
        self.request_log = RequestLog(LOG_ROWS, secret=config.api_key)
        # The app's host: the server finds the chat's model there, under its name, and
        # loads the library's other models into it on demand.
        self.state = ServerState(config, request_log=self.request_log, host=host, store=store)
        # Reentrant: serving the model can reach the host, whose listeners come back here.
        self._lock = threading.RLock()
        self._closed = False
        self._thread: ServerThread | None = None
        self._model: Model | None = None  # the chat's model, with the server's slots
        self._loaded: ServedModel | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self.stopped_because = ""  # why it stopped on its own ('' while running)
        self.note = ""  # what changed while it runs (the chat's model went), for the panel
        self.port = 0  # the port it listens on, once bound
        self.url = ""  # where a client on this computer reaches it, once bound

    @property
    def path(self) -> Path:
        return self._model.path if self._model is not None else Path(self.name)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> LocalServer:
        """Bind and serve (/health says "loading" meanwhile), then give the loaded model
        the server's slots. Raises ServerError (port taken), LoadCancelled (stopped
        meanwhile) or EngineError (the model is not loaded, or its context cannot grow)."""
        with self._lock:
            if self._closed:
                raise LoadCancelled("stopped before it started")
            self._thread = ServerThread(self.state)
        # Listening before the model is looked up: a model that goes after the lookup is
        # then either heard going or found gone below, never served closed.
        unsubscribe = self.model_host.on_change(self._on_host_change)
        try:
            self._thread.start()
            self.port = self._thread.port
            self.url = local_url(self.state.config.host, self.port)
            model = self.model_host.get(self.name)
            self._lease(model)
        except BaseException:
            unsubscribe()
            self.stop()
            raise
        with self._lock:
            # The host says a model is gone before it frees it, and the listener waits for
            # this lock: the model found here is still open.
            still = self._is_loaded(model)
            if not self._closed and still:
                self._serve_chat_model(self.name, model, self.settings.model_id)
                self._unsubscribe = unsubscribe
                return self
        unsubscribe()
        self._give_back(model)
        if not still:
            self.stop()
            raise EngineError(f"{self.title} was unloaded while the server started")
        raise LoadCancelled("stopped while starting")

    def _is_loaded(self, model: Model) -> bool:
        try:
            return self.model_host.get(self.name) is model
        except EngineError:
            return False

    def _lease(self, model: Model) -> None:
        """The server's slots beside the chat's, each as long as the chat's, so the chat
        keeps all of its context."""
        loop = model.loop
        loop.lease(
            LEASE,
            1 + self.settings.parallel,
            max(loop.n_ctx_seq, self.settings.ctx_per_slot),
            reserved_slots=1,
        )

    def _serve_chat_model(self, name: str, model: Model, model_id: str = "") -> None:
        """Serve `model` (leased) as the default model, its answers saying `model_id`
        (default: `name`). Call with the lock held."""
        self._model, self.name = model, name
        self._loaded = ServedModel.build(model, model_id or name, max_queue=self.settings.max_queue)
        self.state.set_loaded(self._loaded)

    def _on_host_change(self, name: str, model: Model | None) -> None:
        """The chat loads, switches or ejects models while the server runs: the server goes
        on. A model the chat loads gets the server's slots and is the default one; the
        model it leaves stays served while API requests use it (the host decides when it
        goes), and requests name any library model, loaded on demand."""
        if not self.running:  # starting: `start` checks its model itself
            return
        if model is None:
            if name != self.name:
                return
            with self._lock:
                loaded, self._loaded, self._model = self._loaded, None, None
            self.note = f"{self.title} was unloaded; requests load library models on demand"
            self.state.set_loaded(None)
            if loaded is not None:
                loaded.close()
            return
        if self.model_host.owner_of(name) != CHAT_OWNER or model is self._model:
            return
        try:
            if model.loop.leased_by != LEASE:  # the server's already, before the chat left it
                self._lease(model)
        except EngineError as e:  # it serves with the slots it has
            self.note = f"{name} is served without extra slots: {e}"
        with self._lock:
            if self._closed:
                self._give_back(model)
                return
            self._serve_chat_model(name, model)  # the model left stays served by the state
            self.title = name
        self.note = ""

    @staticmethod
    def _give_back(model: Model) -> None:
        """The chat's context as it was before the server started."""
        with contextlib.suppress(EngineError):  # the model went meanwhile
            model.loop.release(LEASE)

    def stop(self, *, unloading: bool = False) -> None:
        """End the server's requests, close the socket, give the chat its context back.
        Idempotent, any thread. `unloading`: the model is going; leave its context."""
        with self._lock:
            self._closed = True
            thread, loaded, model = self._thread, self._loaded, self._model
            unsubscribe = self._unsubscribe
            self._thread = self._loaded = self._model = None
            self._unsubscribe = None
        if unsubscribe is not None:
            unsubscribe()
        self.state.set_loaded(None)
        if loaded is not None:
            loaded.cancel_requests()  # ends open streams now, not after uvicorn's grace time
        if thread is not None:
            thread.stop()
        self.state.close()
        if loaded is not None:
            loaded.close()
        if model is not None and not unloading:
            self._give_back(model)

    # -- what the panel shows --------------------------------------------------------------

    @property
    def running(self) -> bool:
        with self._lock:
            return self._thread is not None and self._unsubscribe is not None

    def snapshot(self) -> SchedulerSnapshot | None:
        """The chat's model's slots (None while the chat has no model)."""
        loaded = self._loaded
        return loaded.scheduler.snapshot() if loaded is not None else None
