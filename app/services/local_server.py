"""The desktop app's local server: the chat's model file served over HTTP from a second,
server-sized instance (one sequence per slot), as `candlewick serve` would serve it.

Qt-free. `LocalServer.start()` blocks (it binds the socket, then loads the model) and is meant
to run off the GUI thread; `stop()` may be called from any thread, at any time, more than once.
The weights are memory-mapped from the same file as the chat's copy, so the operating system
keeps one copy of their pages in RAM; the server adds its own KV cache and compute buffers.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import LoadCancelled
from engine.host.runtime import Model
from engine.host.scheduler import SchedulerSnapshot
from engine.native.load_probe import FirstLoads
from engine.server import LoadedModel, ServerConfig, ServerState, ServerThread
from engine.server.request_log import RequestLog
from engine.server.runner import bind_socket
from engine.settings import LoadParams

KEY_ACCOUNT = "local-server-api-key"  # where the key lives in the system keyring
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
        return ServerConfig(host=self.host, port=self.port, api_key=self.api_key or None,
                            model_id=self.model_id, max_queue=self.max_queue,
                            default_max_tokens=min(512, self.ctx_per_slot))

    def load_params(self, base: LoadParams) -> LoadParams:
        """The chat's load settings (GPU layers, KV type, threads...) with the server's context:
        one sequence per slot. No KV snapshots: the server keeps prefixes in its slots."""
        return dataclasses.replace(base, n_ctx=self.ctx_per_slot * self.parallel,
                                   n_seq_max=self.parallel, state_cache_mb=0)


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
    def __init__(self, path: Path, base_params: LoadParams, settings: ServeSettings, *,
                 first_loads: FirstLoads | None = None) -> None:
        """`first_loads`: the app's record of files that loaded before; a file not in it is
        loaded in a child first, so a file that aborts llama.cpp cannot end the app."""
        self.path = Path(path)
        self.settings = settings
        self.first_loads = first_loads
        self.params = settings.load_params(base_params)
        self.params.validate()
        config = settings.config()
        config.validate()
        self.request_log = RequestLog(LOG_ROWS, secret=config.api_key)
        self.state = ServerState(config, request_log=self.request_log)
        self._lock = threading.Lock()
        self._closed = False
        self._thread: ServerThread | None = None
        self._model: Model | None = None
        self._loaded: LoadedModel | None = None
        self.port = 0  # the port it listens on, once bound
        self.url = ""  # where a client on this computer reaches it, once bound

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, progress: Callable[[float], None] | None = None,
              cancel: threading.Event | None = None) -> LocalServer:
        """Bind and serve (/health says "loading"), then load the model. Raises ServerError
        (port taken), LoadCancelled (stopped meanwhile) or EngineError (cannot load)."""
        with self._lock:
            if self._closed:
                raise LoadCancelled("stopped before it started")
            self._thread = ServerThread(self.state)
        try:
            self._thread.start()
            self.port = self._thread.port
            self.url = local_url(self.state.config.host, self.port)
            model = Model(self.path, self.params, progress=progress, cancel=cancel,
                          first_loads=self.first_loads)
        except BaseException:
            self.stop()
            raise
        with self._lock:
            if not self._closed:
                self._model = model
                self._loaded = LoadedModel.build(model, self.settings.model_id,
                                                 max_queue=self.settings.max_queue)
                self.state.set_loaded(self._loaded)
                return self
        model.close()
        raise LoadCancelled("stopped while loading")

    def stop(self) -> None:
        """Cancel what runs, close the socket, free the model. Idempotent, any thread."""
        with self._lock:
            self._closed = True
            thread, loaded, model = self._thread, self._loaded, self._model
            self._thread = self._loaded = self._model = None
        self.state.set_loaded(None)
        if loaded is not None:
            loaded.scheduler.close()  # ends open streams now, not after uvicorn's grace time
        if thread is not None:
            thread.stop()
        if loaded is not None:
            loaded.close()
        if model is not None:
            model.close()

    # -- what the panel shows --------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._loaded is not None

    def snapshot(self) -> SchedulerSnapshot | None:
        loaded = self._loaded
        return loaded.scheduler.snapshot() if loaded is not None else None
