"""A streaming chat client for OpenAI-compatible (SSE) and Ollama (NDJSON) servers.

It measures what a user of the server experiences, on the client side, from the stream itself:
when the request was sent, when the first content arrived, when each chunk arrived, when the
answer ended. Nothing here depends on the server being Candlewick: llama-server, Ollama, vLLM,
LM Studio and llama-cpp-python's server all speak one of the two dialects.

Design choices:

- Standard library only (`http.client`), one connection per request, so timings are not
  distorted by a connection pool or an event loop shared with other work. Safe to use from
  several threads at once (each call builds its own connection).
- `chat()` never raises for anything the network or the server does: a refused connection, a
  timeout, an HTTP error or a malformed stream come back as `StreamResult.error` (one line,
  with `error_kind` saying which kind of trouble it was) or `timed_out`. Only a malformed base
  URL raises `ClientError`, at construction.
- `stream()` is the same request as an iterator of text pieces (what a chat window consumes);
  `chat()` is built on it, so the benchmark and the remote chat engine share one implementation.
- Token counts come from the server's `usage` (OpenAI, with `stream_options.include_usage`) or
  `prompt_eval_count`/`eval_count` (Ollama) when the server sends them; otherwise they are
  None and the caller decides how to count (a tokenizer, or the number of chunks).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

Api = Literal["openai", "ollama"]
APIS: tuple[Api, ...] = ("openai", "ollama")
_MAX_ERROR_BODY = 64 * 1024


# What went wrong with a request, for callers that react differently to each:
# connect: no connection (refused, unknown host, TLS); auth: HTTP 401/403; http: another
# non-200 status; server: an error event in the stream; dropped: the connection closed before
# the answer was complete; protocol: the server sent something that is not the dialect.
ErrorKind = Literal["connect", "auth", "http", "server", "dropped", "protocol"]


class ClientError(ValueError):
    """The client was configured wrongly (bad URL, unknown API); `str()` is one line."""


class RequestError(ClientError):
    """A non-streaming request (the model list) failed; `str()` is one line. `kind` is an
    `ErrorKind`, or "timeout"."""

    def __init__(
        self, message: str, kind: ErrorKind | Literal["timeout"], status: int | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


@dataclass
class StreamResult:
    """One streamed request as observed by the client. Times are `time.perf_counter()`."""

    t_start: float
    t_end: float = 0.0
    t_first: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # one per chunk with content
    text: str = ""
    prompt_tokens: int | None = None  # from the server's usage report, when it sent one
    completion_tokens: int | None = None
    finish_reason: str | None = None
    status: int | None = None  # HTTP status; None when no response arrived
    error: str | None = None
    # Set with `error`; with `timed_out`, "connect" says the connection itself timed out.
    error_kind: ErrorKind | None = None
    timed_out: bool = False
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and not self.cancelled

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_times)


PieceCallback = Callable[[str], None]


class StreamingClient:
    """Streams chat completions from one server.

    `base_url` is the server root (`http://127.0.0.1:8080`); for the OpenAI dialect a trailing
    `/v1` is accepted too. `timeout_s` bounds a whole request, `connect_timeout_s` the TCP
    connect, `idle_timeout_s` (optional) the longest the server may stay silent: before the
    first byte of the answer and between chunks. HTTPS verifies the server's certificate
    against the system's CAs, or `ca_file`; `verify_tls=False` turns the check off.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api: Api = "openai",
        api_key: str | None = None,
        model: str | None = None,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 10.0,
        idle_timeout_s: float | None = None,
        verify_tls: bool = True,
        ca_file: str | None = None,
        user_agent: str = "candlewick-bench",
    ) -> None:
        if api not in APIS:
            raise ClientError(f"unknown API {api!r} (choose from {', '.join(APIS)})")
        parts = urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ClientError(f"not an http(s) URL: {base_url!r}")
        try:
            port = parts.port
        except ValueError:
            raise ClientError(f"bad port in URL: {base_url!r}") from None
        if (
            timeout_s <= 0
            or connect_timeout_s <= 0
            or (idle_timeout_s is not None and idle_timeout_s <= 0)
        ):
            raise ClientError("timeouts must be greater than 0")
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            try:
                self._ssl = ssl.create_default_context(cafile=ca_file or None)
            except (OSError, ssl.SSLError) as e:
                raise ClientError(
                    f"cannot read the CA file {ca_file!r}: {getattr(e, 'strerror', None) or e}"
                ) from None
            if not verify_tls:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE
        self.api: Api = api
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.base_path = parts.path.rstrip("/")
        self.api_key = api_key
        self.model = model
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.user_agent = user_agent

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.base_path}"

    # -- paths -----------------------------------------------------------------------------

    def _path(self, endpoint: str) -> str:
        """`endpoint` is relative to /v1 (OpenAI) or /api (Ollama)."""
        prefix = "/api" if self.api == "ollama" else "/v1"
        base = self.base_path
        if base.endswith(prefix):
            base = base[: -len(prefix)]
        return f"{base}{prefix}/{endpoint}"

    def _headers(self) -> dict[str, str]:
        h = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream, application/json",
            "User-Agent": self.user_agent,
        }
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=self._ssl
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    # -- models ----------------------------------------------------------------------------

    def list_models(self) -> list[str]:
        """Model ids the server offers. Raises `RequestError` (one line) when it cannot tell."""
        path = self._path("tags" if self.api == "ollama" else "models")
        conn = self._connect(self.connect_timeout_s)
        phase: Literal["connect", "response"] = "connect"
        try:
            conn.request("GET", path, headers=self._headers())
            phase = "response"
            if conn.sock is not None:
                conn.sock.settimeout(self.idle_timeout_s or self.timeout_s)
            resp = conn.getresponse()
            body = resp.read(_MAX_ERROR_BODY * 16)
            if resp.status != 200:
                raise RequestError(
                    f"{self.url}: HTTP {resp.status}: {_error_message(body)}",
                    "auth" if resp.status in (401, 403) else "http",
                    resp.status,
                )
            data = json.loads(body)
        except RequestError:
            raise
        except TimeoutError:
            if phase == "connect":
                what = f"no connection within {self.connect_timeout_s:g} s"
            else:
                what = f"no answer within {self.idle_timeout_s or self.timeout_s:g} s"
            raise RequestError(f"{self.url}: {what}", "timeout") from None
        except (OSError, http.client.HTTPException) as e:
            raise RequestError(
                f"{self.url}: {_describe_exception(e)}", _failure_kind(e, phase)
            ) from None
        except ValueError:
            raise RequestError(f"{self.url}: the model list is not JSON", "protocol") from None
        finally:
            conn.close()
        items = (
            data.get("models" if self.api == "ollama" else "data")
            if isinstance(data, dict)
            else None
        )
        if not isinstance(items, list):
            raise RequestError(f"{self.url}: unexpected model list", "protocol")
        key = "name" if self.api == "ollama" else "id"
        return [str(m[key]) for m in items if isinstance(m, dict) and key in m]

    # -- chat ------------------------------------------------------------------------------

    def request_body(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
        top_p: float | None = None,
        stop: Sequence[str] = (),
    ) -> dict[str, Any]:
        model = self.model or "default"
        if self.api == "ollama":
            options: dict[str, Any] = {"num_predict": max_tokens, "temperature": temperature}
            if seed is not None:
                options["seed"] = seed
            if top_p is not None:
                options["top_p"] = top_p
            if stop:
                options["stop"] = list(stop)
            return {"model": model, "messages": list(messages), "stream": True, "options": options}
        body: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "stream": True,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream_options": {"include_usage": True},
        }
        if seed is not None:
            body["seed"] = seed
        if top_p is not None:
            body["top_p"] = top_p
        if stop:
            body["stop"] = list(stop)
        return body

    def stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        seed: int | None = None,
        top_p: float | None = None,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
    ) -> ChatStream:
        """One streamed chat request as an iterator of text pieces. Nothing is sent until
        iteration starts; `ChatStream.result` fills in as it goes and is final once the
        iteration ends (never by an exception for server trouble: see `chat()`)."""
        body = self.request_body(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            top_p=top_p,
            stop=stop,
        )
        res = StreamResult(t_start=time.perf_counter())
        return ChatStream(res, self._run(res, json.dumps(body).encode(), cancel))

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        seed: int | None = None,
        on_piece: PieceCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> StreamResult:
        """Send one streamed chat request and time it. Never raises for server trouble."""
        s = self.stream(
            messages, max_tokens=max_tokens, temperature=temperature, seed=seed, cancel=cancel
        )
        for piece in s:
            if on_piece is not None:
                on_piece(piece)
        return s.result

    def _run(self, res: StreamResult, body: bytes, cancel: threading.Event | None) -> Iterator[str]:
        path = self._path("chat" if self.api == "ollama" else "chat/completions")
        res.t_start = time.perf_counter()
        deadline = res.t_start + self.timeout_s
        conn = self._connect(min(self.connect_timeout_s, self.timeout_s))
        finished = threading.Event()
        socks: list[socket.socket] = []
        watcher: threading.Thread | None = None
        phase: Literal["connect", "response"] = "connect"
        if cancel is not None:
            # A stalled stream blocks in recv(); only shutting the socket down wakes it in time.
            watcher = threading.Thread(
                target=_watch_cancel,
                args=(socks, cancel, finished),
                name="stream-cancel",
                daemon=True,
            )
            watcher.start()
        try:
            conn.request("POST", path, body=body, headers=self._headers())
            phase = "response"
            if conn.sock is not None:
                # Kept here: http.client forgets it once a `Connection: close` reply arrives.
                socks.append(conn.sock)
            self._set_timeout(conn, deadline)
            resp = conn.getresponse()
            res.status = resp.status
            if resp.status != 200:
                raw = resp.read(_MAX_ERROR_BODY)
                res.error = f"HTTP {resp.status}: {_error_message(raw)}"
                res.error_kind = "auth" if resp.status in (401, 403) else "http"
                return
            parse = self._parse_ollama if self.api == "ollama" else self._parse_sse
            yield from parse(resp, conn, res, deadline, cancel)
            if (
                res.error is None
                and not res.timed_out
                and not res.cancelled
                and res.finish_reason is None
            ):
                res.error = "the stream ended before the answer was complete"
                res.error_kind = "dropped"
        except TimeoutError:
            res.timed_out = True
            if phase == "connect":
                res.error_kind = "connect"
        except (OSError, http.client.HTTPException) as e:
            res.error = _describe_exception(e)
            res.error_kind = _failure_kind(e, phase)
        finally:
            res.t_end = time.perf_counter()
            finished.set()
            if watcher is not None:
                watcher.join()
            conn.close()
        if cancel is not None and cancel.is_set() and res.finish_reason is None:
            # Whatever the closed socket made of the stream, the caller asked for this.
            res.cancelled, res.timed_out = True, False
            res.error = res.error_kind = None

    def _set_timeout(self, conn: http.client.HTTPConnection, deadline: float) -> None:
        if conn.sock is not None:
            left = max(0.001, deadline - time.perf_counter())
            conn.sock.settimeout(min(left, self.idle_timeout_s or left))

    def _content(self, res: StreamResult, text: str) -> bool:
        if not text:
            return False
        now = time.perf_counter()
        if res.t_first is None:
            res.t_first = now
        res.chunk_times.append(now)
        res.text += text
        return True

    def _lines(
        self,
        resp: http.client.HTTPResponse,
        conn: http.client.HTTPConnection,
        res: StreamResult,
        deadline: float,
        cancel: threading.Event | None,
    ) -> Iterator[str]:
        while True:
            if cancel is not None and cancel.is_set():
                res.cancelled = True
                return
            if time.perf_counter() > deadline:
                res.timed_out = True
                return
            self._set_timeout(conn, deadline)
            line = resp.readline(1 << 20)
            if not line:
                return
            yield line.decode("utf-8", errors="replace").rstrip("\r\n")

    def _fail(self, res: StreamResult, message: str, kind: ErrorKind) -> None:
        res.error, res.error_kind = message, kind

    def _parse_sse(
        self,
        resp: http.client.HTTPResponse,
        conn: http.client.HTTPConnection,
        res: StreamResult,
        deadline: float,
        cancel: threading.Event | None,
    ) -> Iterator[str]:
        event = ""
        for line in self._lines(resp, conn, res, deadline, cancel):
            if not line:
                event = ""
                continue
            if line.startswith(":"):  # SSE comment / keep-alive
                continue
            if line.startswith("event:"):
                event = line[6:].strip()
                continue
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                # Every complete OpenAI answer names its finish reason; a [DONE] without one
                # is an answer cut short (llama-cpp-python's server does this to a running
                # request when another arrives, unless started with --interrupt_requests False).
                if res.finish_reason is None and res.error is None:
                    self._fail(
                        res, "the server ended the answer early (no finish reason)", "dropped"
                    )
                return
            try:
                obj = json.loads(data)
            except ValueError:
                self._fail(res, "the server sent a malformed event", "protocol")
                return
            if not isinstance(obj, dict):
                continue
            if event == "error" or "error" in obj:
                self._fail(res, f"server error: {_error_text(obj.get('error', obj))}", "server")
                return
            usage = obj.get("usage")
            if isinstance(usage, dict):
                res.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
                res.completion_tokens = _int_or_none(usage.get("completion_tokens"))
            for choice in obj.get("choices") or []:
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta") or {}
                if isinstance(delta, dict):
                    # Reasoning models stream their thinking first; it is generated output too.
                    text = (delta.get("reasoning_content") or "") + (delta.get("content") or "")
                    if self._content(res, text):
                        yield text
                if choice.get("finish_reason"):
                    res.finish_reason = str(choice["finish_reason"])

    def _parse_ollama(
        self,
        resp: http.client.HTTPResponse,
        conn: http.client.HTTPConnection,
        res: StreamResult,
        deadline: float,
        cancel: threading.Event | None,
    ) -> Iterator[str]:
        for line in self._lines(resp, conn, res, deadline, cancel):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                self._fail(res, "the server sent a malformed line", "protocol")
                return
            if not isinstance(obj, dict):
                continue
            if "error" in obj:
                self._fail(res, f"server error: {_error_text(obj['error'])}", "server")
                return
            msg = obj.get("message")
            text = ""
            if isinstance(msg, dict):
                text = (msg.get("thinking") or "") + (msg.get("content") or "")
            elif isinstance(obj.get("response"), str):  # /api/generate dialect
                text = obj["response"]
            if self._content(res, text):
                yield text
            if obj.get("done"):
                res.finish_reason = str(obj.get("done_reason") or "stop")
                res.prompt_tokens = _int_or_none(obj.get("prompt_eval_count"))
                res.completion_tokens = _int_or_none(obj.get("eval_count"))
                return


class ChatStream:
    """Text pieces of one streamed answer; `result` is the request as the client saw it."""

    def __init__(self, result: StreamResult, pieces: Iterator[str]) -> None:
        self.result = result
        self._pieces = pieces

    def __iter__(self) -> Iterator[str]:
        return self._pieces

    def close(self) -> None:
        """Stop reading and close the connection (when iteration is abandoned early)."""
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()


def _failure_kind(e: BaseException, phase: Literal["connect", "response"]) -> ErrorKind:
    if phase == "connect" or isinstance(e, ConnectionRefusedError | socket.gaierror | ssl.SSLError):
        return "connect"
    if isinstance(e, http.client.HTTPException) and not isinstance(
        e, http.client.RemoteDisconnected | http.client.IncompleteRead
    ):
        return "protocol"
    return "dropped"


def _watch_cancel(
    socks: list[socket.socket], cancel: threading.Event, finished: threading.Event
) -> None:
    while not finished.wait(0.1):
        if cancel.is_set() and socks:
            with contextlib.suppress(OSError):
                socks[0].shutdown(socket.SHUT_RDWR)
            return


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        for key in ("message", "detail", "error"):
            if key in err:
                return _error_text(err[key])
        return json.dumps(err)[:300]
    return " ".join(str(err).split())[:300]


def _error_message(body: bytes) -> str:
    """The human part of an error response body (OpenAI, Ollama, FastAPI or plain text)."""
    text = body.decode("utf-8", errors="replace").strip()
    with contextlib.suppress(ValueError):
        obj = json.loads(text)
        if isinstance(obj, dict):
            return _error_text(obj.get("error", obj.get("detail", obj)))
    return " ".join(text.split())[:300] or "(empty body)"


def _describe_exception(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (is the server running?)"
    if isinstance(e, socket.gaierror):
        return "host not found"
    if isinstance(
        e, http.client.RemoteDisconnected | ConnectionResetError | http.client.IncompleteRead
    ):
        return "the server closed the connection"
    if isinstance(e, ssl.SSLError):
        return f"TLS error: {e.reason or e}"
    if isinstance(e, http.client.HTTPException):
        return f"bad HTTP response ({type(e).__name__})"
    msg = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(msg).split())
