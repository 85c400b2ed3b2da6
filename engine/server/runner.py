"""Run the server on a background thread (tests, the desktop app) or in the foreground (CLI)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn

from engine.server.app import create_app
from engine.server.config import ServerError
from engine.server.engine_state import ServerState


def _uvicorn_config(state: ServerState, *, access_log: bool) -> uvicorn.Config:
    cfg = state.config
    cfg.validate()
    return uvicorn.Config(
        create_app(state),
        host=cfg.host,
        port=cfg.port,
        log_config=None,
        access_log=access_log,
        lifespan="off",
        ws="none",
        # uvicorn's "auto": httptools and uvloop where installed (C parsers and a libuv loop
        # take less CPU per streamed chunk from the cores llama.cpp decodes on), else the
        # pure-Python h11 and asyncio (uvloop has no Windows build).
        http="auto",
        loop="auto",
        server_header=False,
        timeout_graceful_shutdown=5,
    )


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind here, not inside uvicorn, so a busy port is a clear error instead of an exit."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ServerError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


class ServerThread:
    """uvicorn on its own thread. `start()` returns once the socket is listening."""

    def __init__(self, state: ServerState, *, access_log: bool = False) -> None:
        self.state = state
        self._server = uvicorn.Server(_uvicorn_config(state, access_log=access_log))
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, timeout: float = 30.0) -> ServerThread:
        cfg = self.state.config
        self._sock = bind_socket(cfg.host, cfg.port)

        def run() -> None:
            try:
                asyncio.run(self._server.serve(sockets=[self._sock]))
            except BaseException as e:  # reported by start()
                self._error = e

        self._thread = threading.Thread(target=run, name="candlewick-server", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                self.stop()
                raise ServerError(
                    f"the server could not start on {self.state.config.host}:"
                    f"{self.state.config.port} ({self._error or 'timed out'})"
                )
            time.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        host = self.state.config.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def stop(self, timeout: float = 60.0) -> None:
        """Let uvicorn finish its requests, then make it exit, waiting `timeout` for each:
        a limit, not a speed (on a machine whose cores are busy its loop may need seconds
        to run again), so that the thread is gone when this returns."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(
    state: ServerState, *, sock: socket.socket | None = None, access_log: bool = True
) -> None:
    """Serve on the calling thread until Ctrl+C / SIGTERM (uvicorn handles the signals)."""
    config = _uvicorn_config(state, access_log=access_log)
    if sock is None:
        sock = bind_socket(state.config.host, state.config.port)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
