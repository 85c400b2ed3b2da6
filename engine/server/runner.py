"""Run the server on a background thread (tests, the desktop app) or in the foreground (CLI)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import uvicorn

from engine.server.app import create_app
from engine.server.config import ServerError
from engine.server.engine_state import ServerState


def _uvicorn_config(state: ServerState, *, access_log: bool) -> uvicorn.Config:
    cfg = state.config
    cfg.validate()
    return uvicorn.Config(
        create_app(state), host=cfg.host, port=cfg.port, log_config=None,
        access_log=access_log, lifespan="off", ws="none", http="h11", loop="asyncio",
        server_header=False, timeout_graceful_shutdown=5,
    )


class ServerThread:
    """uvicorn on its own thread. `start()` returns once the socket is listening."""

    def __init__(self, state: ServerState, *, access_log: bool = False) -> None:
        self.state = state
        self._server = uvicorn.Server(_uvicorn_config(state, access_log=access_log))
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, timeout: float = 30.0) -> ServerThread:
        def run() -> None:
            try:
                asyncio.run(self._server.serve())
            except BaseException as e:  # reported by start()
                self._error = e

        self._thread = threading.Thread(target=run, name="candlewick-server", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                self.stop()
                raise ServerError(f"the server could not start on {self.state.config.host}:"
                                  f"{self.state.config.port} ({self._error or 'timed out'})")
            time.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        servers: list[Any] = getattr(self._server, "servers", [])
        for s in servers:
            for sock in s.sockets:
                return int(sock.getsockname()[1])
        return self.state.config.port

    @property
    def url(self) -> str:
        host = self.state.config.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(state: ServerState, *, access_log: bool = True) -> None:
    """Serve on the calling thread until Ctrl+C / SIGTERM (uvicorn handles the signals)."""
    uvicorn.Server(_uvicorn_config(state, access_log=access_log)).run()
