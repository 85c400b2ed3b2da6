"""Real HTTP servers for the benchmark and client tests.

- `llama_cpp_server`: llama-cpp-python's own OpenAI-compatible server on a real model.
- `candlewick_serve`: `candlewick serve` in a subprocess.
- `FaultServer`: a small real HTTP server that misbehaves on purpose (HTTP errors, error
  events, cut streams, stalls, garbage) and also speaks Ollama's NDJSON dialect.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(port: int, path: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                conn.close()
                return
        conn.close()
        time.sleep(0.2)
    raise RuntimeError(f"server on port {port} did not come up in {timeout:.0f} s")


@contextlib.contextmanager
def _process(cmd: list[str], port: int, ready_path: str, log: Path) -> Iterator[tuple[str, int]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            _wait_http(port, ready_path, proc, timeout=120)
            yield f"http://127.0.0.1:{port}", proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def llama_cpp_server(
    model: Path, log: Path, *, n_ctx: int = 2048, interrupt: bool = True
) -> Iterator[tuple[str, int]]:
    """`interrupt=True` is the server's default: a new request cuts the running answer short."""
    port = free_port()
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "llama_cpp_server.py"),
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        # One thread: llama.cpp's threads spin at a barrier after every op, so on a loaded
        # machine two of them crawl (docs/reliability.md); this reference server does not
        # adapt its thread count as Candlewick's engine does.
        "--n_threads",
        "1",
        "--interrupt_requests",
        str(interrupt),
    ]
    with _process(cmd, port, "/v1/models", log) as server:
        yield server


@contextlib.contextmanager
def candlewick_serve(
    log: Path,
    *,
    parallel: int = 2,
    ctx: int = 1024,
    api_key: str | None = None,
    extra: Sequence[str] = (),
) -> Iterator[tuple[str, int]]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "app.cli",
        "serve",
        "--port",
        str(port),
        "--parallel",
        str(parallel),
        "--ctx",
        str(ctx),
        "--threads",
        "2",
        *extra,
    ]
    if api_key:
        cmd += ["--api-key", api_key]
    with _process(cmd, port, "/health", log) as server:
        yield server


class FaultServer:
    """Serves POST requests according to `mode`; use as a context manager."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.release = threading.Event()  # ends a stalled response
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = json.dumps(
                    {"data": [{"id": "fault-model"}], "models": [{"name": "fault-model"}]}
                ).encode()
                self._send(200, body, "application/json")

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", 0))
                outer.requests.append(json.loads(self.rfile.read(n)))
                getattr(outer, f"_{outer.mode}")(self)

            def _send(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def stream(self, ctype: str, parts: list[bytes]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Connection", "close")
                self.end_headers()
                for p in parts:
                    self.wfile.write(p)
                    self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(
            # shutdown() waits for the loop's next poll: 0.5 s by default, per server
            target=self.httpd.serve_forever,
            name="fault-server",
            kwargs={"poll_interval": 0.02},
        )

    def __enter__(self) -> FaultServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()

    # -- modes -----------------------------------------------------------------------------

    @staticmethod
    def _sse(obj: Any) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    def _chunk(self, text: str) -> bytes:
        return self._sse(
            {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
        )

    def _http500(self, h: Any) -> None:
        h._send(
            500,
            json.dumps({"error": {"message": "model crashed", "type": "server"}}).encode(),
            "application/json",
        )

    def _http503_text(self, h: Any) -> None:
        h._send(503, b"<html><body>Service   Unavailable</body></html>", "text/html")

    def _sse_error(self, h: Any) -> None:
        h.stream(
            "text/event-stream",
            [
                self._chunk("Hel"),
                b"event: error\n",
                self._sse({"error": {"message": "out of memory"}}),
            ],
        )

    def _truncated(self, h: Any) -> None:
        h.stream("text/event-stream", [self._chunk("Hello"), self._chunk(" wor")])

    def _interrupted(self, h: Any) -> None:
        h.stream("text/event-stream", [self._chunk("Hel"), b"data: [DONE]\n\n"])

    def _garbage(self, h: Any) -> None:
        h.stream("text/event-stream", [self._chunk("Hi"), b"data: {not json\n\n"])

    def _stall(self, h: Any) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(self._chunk("first"))
        h.wfile.flush()
        self.release.wait(30)
        h.close_connection = True

    def _openai_usage(self, h: Any) -> None:
        parts = [
            b": keep-alive\n\n",
            self._sse(
                {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
            ),
        ]
        parts += [self._chunk(t) for t in ("One", " two", " three")]
        parts.append(self._sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        parts.append(
            self._sse({"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": 3}})
        )
        parts.append(b"data: [DONE]\n\n")
        h.stream("text/event-stream", parts)

    def _ollama(self, h: Any) -> None:
        lines = [
            {"message": {"role": "assistant", "content": t}, "done": False}
            for t in ("Un", " deux", " trois")
        ]
        lines.append(
            {
                "message": {"role": "assistant", "content": ""},
                "done": True,
                "done_reason": "stop",
                "prompt_eval_count": 21,
                "eval_count": 3,
            }
        )
        h.stream("application/x-ndjson", [json.dumps(x).encode() + b"\n" for x in lines])

    def _ollama_error(self, h: Any) -> None:
        h.stream("application/x-ndjson", [b'{"error": "model \\"x\\" not found"}\n'])
