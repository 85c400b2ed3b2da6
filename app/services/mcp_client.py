"""A blocking client for MCP servers, for the GUI's worker threads, over the async `mcp` SDK.

`McpHub` runs one asyncio loop on its own daemon thread ("candlewick-mcp") and keeps one
session per configured server, started on first use. The blocking methods submit a coroutine
to that loop and wait for it, watching the caller's cancel event and deadline, so a stuck
server never blocks a worker past what it asked for. Progress notifications are queued and
handed to `on_progress` on the calling thread.

Each session lives in one task of the loop (anyio's task groups and cancel scopes must be left
by the task that entered them); calls run as other tasks over that session. A session whose
transport ends (the server process exited, the HTTP server went away) is dropped: the call
that was waiting fails with one line, and the next use starts a fresh one.

Nothing here logs an environment value or a token; error text is scrubbed of both.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import json
import logging
import os
import queue
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any, TypeVar, cast

import anyio
import httpx2
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED

from app.services.mcp_config import HttpTransport, McpServer, StdioTransport, account
from app.services.secrets import SecretStore

log = logging.getLogger("candlewick.mcp")

THREAD_NAME = "candlewick-mcp"
DEFAULT_MAX_RESULT_BYTES = 64 * 1024
DEFAULT_CALL_TIMEOUT_S = 120.0
DEFAULT_START_TIMEOUT_S = 30.0
_POLL_S = 0.05  # how often a waiting caller looks at its cancel event: bounds cancel latency
_UNWIND_S = 1.0  # how long a cancelled call may take to send its courtesy cancel
_STOP_S = 8.0  # the SDK's stdio shutdown: stdin close, 2 s, SIGTERM, 2 s, SIGKILL
_STDERR_TAIL = 4096

ProgressFn = Callable[[float, float | None, str | None], None]
_T = TypeVar("_T")


class McpClientError(Exception):
    """A tool call or listing that did not happen; `str()` is one line for the person."""


class ToolServerError(McpClientError):
    """The server could not be started, stopped during the call, or refused the request."""


class ToolCancelledError(McpClientError):
    """The caller's cancel event was set."""


class ToolTimeoutError(McpClientError):
    """The call ran past its `timeout_s`."""


@dataclass(frozen=True)
class ToolInfo:
    name: str
    description: str
    input_schema: dict[str, Any] = field(hash=False)


@dataclass(frozen=True)
class ToolResult:
    text: str  # the text content joined; other content described in one line each
    is_error: bool  # the tool reported a failure (the model should see it)
    truncated: bool
    duration_s: float


class McpHub:
    """The MCP sessions of the app. `servers`: the configured servers (see `configure`);
    `secrets`: where HTTP servers' bearer tokens are (default: the system keyring)."""

    def __init__(
        self,
        servers: Iterable[McpServer] = (),
        *,
        secrets: SecretStore | None = None,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        self._secrets = secrets or SecretStore()
        self.max_result_bytes = max_result_bytes
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._servers: dict[str, McpServer] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # Touched only on the loop's thread:
        self._conns: dict[str, _Connection] = {}
        self._conn_locks: dict[str, asyncio.Lock] = {}
        self.configure(servers)

    # -- configuration -----------------------------------------------------------------------

    def configure(self, servers: Iterable[McpServer]) -> None:
        """Use these servers from now on. A running session whose server was removed, disabled
        or changed is stopped (in the background); the others keep running."""
        new = {s.name: s for s in servers}
        with self._lock:
            self._servers = new
            loop = self._loop
        if loop is not None:
            asyncio.run_coroutine_threadsafe(self._prune(), loop)

    def server_names(self) -> list[str]:
        with self._lock:
            return list(self._servers)

    def is_running(self, server_name: str) -> bool:
        """Whether a session with this server is up (for a status light; no I/O)."""
        conn = self._conns.get(server_name)
        return conn is not None and conn.session is not None and not conn.ended.is_set()

    # -- the blocking API ----------------------------------------------------------------------

    def list_tools(
        self,
        server_name: str,
        *,
        refresh: bool = False,
        cancel: threading.Event | None = None,
        timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> list[ToolInfo]:
        """The server's tools, starting it if needed. Cached per session unless `refresh`."""
        server, token = self._lookup(server_name)
        return self._wait(
            self._list_tools(server, token, refresh),
            cancel=cancel,
            timeout_s=timeout_s,
            what=f"listing the tools of '{server_name}'",
        )

    def call_tool(
        self,
        server_name: str,
        tool: str,
        arguments: dict[str, Any] | None = None,
        *,
        on_progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        max_result_bytes: int | None = None,
    ) -> ToolResult:
        """Run one tool and return its result (`is_error` when the tool itself failed).

        `on_progress(progress, total, message)` is called on this thread for each progress
        notification. Raises `ToolCancelledError` soon after `cancel` is set,
        `ToolTimeoutError` after `timeout_s`, `ToolServerError` when the server cannot be
        started or stops; the server is told to stop work on a cancelled or timed-out call."""
        server, token = self._lookup(server_name)
        progress: queue.SimpleQueue[tuple[float, float | None, str | None]] = queue.SimpleQueue()
        started = time.monotonic()
        raw = self._wait(
            self._call_tool(server, token, tool, arguments or {}, progress),
            cancel=cancel,
            timeout_s=timeout_s,
            progress=progress,
            on_progress=on_progress,
            what=f"'{tool}' on '{server_name}'",
        )
        limit = self.max_result_bytes if max_result_bytes is None else max_result_bytes
        text, truncated = _truncate(_result_text(raw), limit)
        return ToolResult(text, bool(raw.is_error), truncated, time.monotonic() - started)

    def stop(self, server_name: str) -> None:
        """Stop one server's session (it starts again on next use)."""
        loop = self._loop
        if loop is not None:
            asyncio.run_coroutine_threadsafe(self._drop(server_name), loop).result(_STOP_S + 3)

    def close(self) -> None:
        """Stop every session and the loop thread; waits for both. Safe to call twice."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(_STOP_S + 5)
        except Exception as e:  # a stuck shutdown must not keep the app from quitting
            log.warning("MCP shutdown did not finish cleanly: %s", type(e).__name__)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    def __enter__(self) -> McpHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- waiting from a worker thread ----------------------------------------------------------

    def _lookup(self, name: str) -> tuple[McpServer, str | None]:
        with self._lock:
            server = self._servers.get(name)
        if server is None:
            raise McpClientError(f"no MCP server named '{name}'")
        if not server.enabled:
            raise McpClientError(f"the MCP server '{name}' is turned off")
        # The keyring is read here, on the caller's thread, never on the loop's.
        token = (
            self._secrets.get(account(name))
            if isinstance(server.transport, HttpTransport)
            else None
        )
        return server, token

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise McpClientError("the MCP client was closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=_run_loop, args=(loop,), name=THREAD_NAME, daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _wait(
        self,
        coro: Coroutine[Any, Any, _T],
        *,
        cancel: threading.Event | None,
        timeout_s: float,
        what: str,
        progress: queue.SimpleQueue[tuple[float, float | None, str | None]] | None = None,
        on_progress: ProgressFn | None = None,
    ) -> _T:
        try:
            loop = self._ensure_loop()
        except BaseException:
            coro.close()
            raise
        finished = threading.Event()
        fut = asyncio.run_coroutine_threadsafe(_signal_when_done(coro, finished), loop)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                concurrent.futures.wait([fut], timeout=_POLL_S)
                _deliver(progress, on_progress)
                if fut.done():
                    try:
                        return fut.result()
                    except concurrent.futures.CancelledError:  # close() cancelled it
                        raise McpClientError("the MCP client was closed") from None
                if cancel is not None and cancel.is_set():
                    raise ToolCancelledError(f"cancelled: {what}")
                if time.monotonic() >= deadline:
                    raise ToolTimeoutError(f"timed out after {timeout_s:g} s: {what}")
        except BaseException:
            # Cancelled, timed out, or on_progress raised: the call must not run on unseen.
            if not fut.done():
                fut.cancel()
                finished.wait(_UNWIND_S)  # the task sends the server a courtesy cancel
            raise

    # -- on the loop ---------------------------------------------------------------------------

    async def _list_tools(
        self, server: McpServer, token: str | None, refresh: bool
    ) -> list[ToolInfo]:
        conn = await self._connection(server, token)
        if conn.tools is not None and not refresh:
            return conn.tools
        tools: list[ToolInfo] = []
        cursor: str | None = None
        for _ in range(100):  # a server that pages forever must not hang us
            listing = await self._request(conn, partial(_list_page, cursor=cursor))
            tools += [
                ToolInfo(t.name, t.description or "", dict(t.input_schema)) for t in listing.tools
            ]
            cursor = listing.next_cursor
            if not cursor:
                break
        conn.tools = tools
        return tools

    async def _call_tool(
        self,
        server: McpServer,
        token: str | None,
        tool: str,
        arguments: dict[str, Any],
        events: queue.SimpleQueue[tuple[float, float | None, str | None]],
    ) -> types.CallToolResult:
        conn = await self._connection(server, token)

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            events.put((progress, total, message))

        return await self._request(
            conn, lambda s: s.call_tool(tool, arguments, progress_callback=on_progress)
        )

    async def _request(
        self, conn: _Connection, call: Callable[[ClientSession], Coroutine[Any, Any, _T]]
    ) -> _T:
        """Await one request; turn what went wrong into one line, and drop a session whose
        connection is gone so that the next use starts afresh."""
        name = conn.server.name
        try:
            return await call(conn.live())
        except MCPError as e:
            if e.code != CONNECTION_CLOSED and not conn.ended.is_set():
                # The server answered with an error: the session itself is fine.
                raise ToolServerError(
                    conn.redact(f"MCP server '{name}' refused the request: {e.message}")
                ) from None
            reason = conn.end_reason() or e.message
        except (
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            httpx2.HTTPError,
            OSError,
        ) as e:
            reason = conn.end_reason() or _one_line(e)
        except Exception as e:  # a malformed result and the like: the session may be fine
            raise ToolServerError(conn.redact(f"MCP server '{name}': {_one_line(e)}")) from None
        await self._drop(name, conn)
        raise ToolServerError(conn.redact(f"MCP server '{name}' stopped: {reason}"))

    async def _connection(self, server: McpServer, token: str | None) -> _Connection:
        lock = self._conn_locks.setdefault(server.name, asyncio.Lock())
        async with lock:
            conn = self._conns.get(server.name)
            if conn is not None and (
                conn.ended.is_set() or conn.server != server or conn.token != token
            ):
                await self._drop(server.name, conn)
                conn = None
            if conn is None:
                conn = _Connection(server, token, self.start_timeout_s)
                self._conns[server.name] = conn
                conn.launch()
            try:
                # Shielded: a cancelled first call leaves the start-up running for the next.
                await asyncio.shield(conn.ready)
            except asyncio.CancelledError:
                raise
            except BaseException as e:
                message = conn.redact(
                    f"MCP server '{server.name}' could not start: {conn.start_error(e)}"
                )
                await self._drop(server.name, conn)
                raise ToolServerError(message) from None
            return conn

    async def _drop(self, name: str, conn: _Connection | None = None) -> None:
        current = self._conns.get(name)
        if current is not None and (conn is None or current is conn):
            del self._conns[name]
        if conn is not None or current is not None:
            await cast(_Connection, conn or current).stop()

    async def _prune(self) -> None:
        with self._lock:
            servers = dict(self._servers)
        for name, conn in list(self._conns.items()):
            if servers.get(name) != conn.server or not conn.server.enabled:
                await self._drop(name, conn)

    async def _shutdown(self) -> None:
        conns = list(self._conns.values())
        self._conns.clear()
        await asyncio.gather(*(c.stop() for c in conns), return_exceptions=True)
        me = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not me]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)


class _Connection:
    """One session with one server, owned by its runner task."""

    def __init__(self, server: McpServer, token: str | None, start_timeout_s: float) -> None:
        self.server = server
        self.token = token
        self.start_timeout_s = start_timeout_s
        self.session: ClientSession | None = None
        self.tools: list[ToolInfo] | None = None
        self.ended = anyio.Event()  # set to stop the session, or when its transport ends
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._end_reason: str | None = None
        self._http_status: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._stderr: IO[bytes] | None = None
        # Text that must never reach a message: env values and the token.
        t = server.transport
        values = list(t.env.values()) if isinstance(t, StdioTransport) else []
        self._secrets = sorted(
            (v for v in [*values, token or ""] if len(v) >= 4), key=len, reverse=True
        )

    def launch(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"mcp:{self.server.name}"
        )

    def live(self) -> ClientSession:
        if self.session is None or self.ended.is_set():
            raise MCPError(CONNECTION_CLOSED, "the session ended")
        return self.session

    def end_reason(self) -> str | None:
        return self._end_reason

    def redact(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    async def stop(self) -> None:
        self.ended.set()
        task = self._task
        if task is not None and not self.ready.done():
            task.cancel()  # still starting (perhaps hung): no clean session to close
        if task is not None and not task.done():
            done, _ = await asyncio.wait({task}, timeout=_STOP_S)
            if not done:
                task.cancel()
                await asyncio.wait({task}, timeout=2)
        if self._stderr is not None:
            self._stderr.close()
        if not self.ready.done():
            self.ready.cancel()
        elif not self.ready.cancelled():
            self.ready.exception()  # retrieved: no "exception was never retrieved" at GC

    # -- the runner ----------------------------------------------------------------------------

    async def _run(self) -> None:
        name = self.server.name
        log.info("starting MCP server '%s' (%s)", name, self.server.transport.kind)
        try:
            async with self._transport() as (read, write), anyio.create_task_group() as tg:
                # The session reads through a relay, so that the end of the transport (the
                # process exited) is seen here and the session is dropped at once.
                relay_send, relay_receive = anyio.create_memory_object_stream[
                    SessionMessage | Exception
                ](0)
                tg.start_soon(self._relay, read, relay_send)
                async with ClientSession(relay_receive, write) as session:
                    with anyio.fail_after(self.start_timeout_s):
                        await session.initialize()
                    self.session = session
                    self.ready.set_result(None)
                    log.info("MCP server '%s' is ready", name)
                    await self.ended.wait()
                tg.cancel_scope.cancel()
        except Exception as e:
            leaf = _leaf(e)
            if not self.ready.done():
                self.ready.set_exception(leaf)
            else:
                self._end_reason = self._end_reason or self._describe(leaf)
                log.warning(
                    "MCP server '%s' session failed: %s", name, self.redact(self._describe(leaf))
                )
        finally:
            self.ended.set()
            self.session = None
            if not self.ready.done():
                self.ready.set_exception(ConnectionError("the session ended during start-up"))
            log.info("MCP server '%s' stopped", name)

    async def _relay(self, read: Any, send: MemoryObjectSendStream[Any]) -> None:
        try:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                async for item in read:
                    await send.send(item)
            if not self.ended.is_set():  # the transport ended by itself: say why first
                self._end_reason = self._exited()
                self.ended.set()
        finally:
            send.close()

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[Any, Any]]:
        t = self.server.transport
        if isinstance(t, StdioTransport):
            if t.cwd and not Path(t.cwd).is_dir():
                raise _StartError(f"working folder not found: {t.cwd}")
            params = StdioServerParameters(
                command=t.command, args=list(t.args), env=dict(t.env) or None, cwd=t.cwd
            )
            # The server's stderr goes to a private file: its last line explains an exit. It
            # stays open until stop(), after the transport: the explanation comes later.
            self._stderr = tempfile.TemporaryFile(prefix="candlewick-mcp-")  # noqa: SIM115
            async with stdio_client(params, errlog=cast(Any, self._stderr)) as streams:
                yield streams
        else:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            client = httpx2.AsyncClient(
                headers=headers,
                timeout=httpx2.Timeout(30.0, read=300.0),
                event_hooks={"response": [self._note_status]},
            )
            async with client, streamable_http_client(t.url, http_client=client) as streams:
                yield streams

    async def _note_status(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self._http_status = response.status_code

    # -- explaining failures -------------------------------------------------------------------

    def start_error(self, exc: BaseException) -> str:
        return self._describe(_leaf(exc), starting=True)

    def _describe(self, exc: BaseException, *, starting: bool = False) -> str:
        t = self.server.transport
        if isinstance(exc, _StartError):
            return str(exc)
        if isinstance(exc, FileNotFoundError) and isinstance(t, StdioTransport):
            return f"command not found: {t.command}"
        if isinstance(exc, PermissionError) and isinstance(t, StdioTransport):
            return f"cannot run {t.command}: permission denied"
        if isinstance(exc, TimeoutError):
            return f"no answer to the MCP handshake within {self.start_timeout_s:g} s"
        if self._http_status is not None:
            hint = " (check the server's token)" if self._http_status in (401, 403) else ""
            return f"HTTP {self._http_status}{hint}"
        if isinstance(exc, httpx2.ConnectError) and isinstance(t, HttpTransport):
            return f"cannot connect to {t.url}"
        if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED and starting:
            return self._exited()
        return _one_line(exc)

    def _exited(self) -> str:
        if isinstance(self.server.transport, HttpTransport):
            return "the connection closed"
        last = self._stderr_tail()
        return "the server process exited" + (f" ({last})" if last else "")

    def _stderr_tail(self) -> str:
        f = self._stderr
        if f is None or f.closed or not hasattr(os, "pread"):  # no pread on Windows
            return ""
        try:
            fd = f.fileno()
            size = os.fstat(fd).st_size
            # pread: the child shares the file offset, so seeking would move its writes.
            tail = os.pread(fd, _STDERR_TAIL, max(0, size - _STDERR_TAIL))
        except OSError:
            return ""
        lines = [ln.strip() for ln in tail.decode("utf-8", "replace").splitlines()]
        last = next((ln for ln in reversed(lines) if ln), "")
        return last[:300]


class _StartError(Exception):
    pass


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


async def _signal_when_done(coro: Coroutine[Any, Any, _T], done: threading.Event) -> _T:
    try:
        return await coro
    finally:
        done.set()


async def _list_page(session: ClientSession, cursor: str | None) -> types.ListToolsResult:
    params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
    return await session.list_tools(params=params)


def _deliver(
    progress: queue.SimpleQueue[tuple[float, float | None, str | None]] | None,
    on_progress: ProgressFn | None,
) -> None:
    if progress is None:
        return
    while True:
        try:
            item = progress.get_nowait()
        except queue.Empty:
            return
        if on_progress is not None:
            on_progress(*item)


def _leaf(exc: BaseException) -> BaseException:
    """The exception inside anyio's task-group wrappers that says what went wrong."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    if n < 1024 * 1024:
        return f"{round(n / 1024)} KB"
    return f"{n / (1024 * 1024):.1f} MB"


def _b64_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except ValueError:
        return len(data) * 3 // 4


def _result_text(result: types.CallToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            parts.append(f"[{block.type}, {_size(_b64_size(block.data))}]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource link: {block.uri}]")
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            if isinstance(res, types.TextResourceContents):
                parts.append(res.text)
            else:
                parts.append(f"[resource {res.uri}, {_size(_b64_size(res.blob))}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _truncate(text: str, limit: int) -> tuple[str, bool]:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, False
    head = data[:limit].decode("utf-8", "ignore")  # never split a character
    note = f"\n[result truncated: {_size(len(data))}, showing the first {_size(limit)}]"
    return head + note, True


__all__ = [
    "DEFAULT_MAX_RESULT_BYTES",
    "McpClientError",
    "McpHub",
    "ProgressFn",
    "ToolCancelledError",
    "ToolInfo",
    "ToolResult",
    "ToolServerError",
    "ToolTimeoutError",
]
