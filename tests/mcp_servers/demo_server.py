"""A small MCP server for the client tests, on the official SDK's server side.

    python tests/mcp_servers/demo_server.py                  # stdio
    python tests/mcp_servers/demo_server.py --http PORT [--token T]

With --token, HTTP requests without "Authorization: Bearer T" get a 401, which proves the client
sends the token from the keyring. Tools cover the client's paths: plain results, progress, slow
calls to cancel, huge results, a tool error and a crash of the whole process.
"""

from __future__ import annotations

import argparse
import base64
import os
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("candlewick-demo", log_level="WARNING")

# A 1x1 PNG: a non-text content block the client must describe instead of dumping.
_PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def read_note(name: str) -> str:
    """Read a note by name."""
    return f"note {name}: remember the milk"


@server.tool()
def env_value(name: str) -> str:
    """The value of an environment variable of this server process ("" when unset)."""
    return os.environ.get(name, "")


@server.tool()
def pid() -> int:
    """This server's process id: tells a restarted server from the same one."""
    return os.getpid()


@server.tool()
def cwd() -> str:
    """This server's working directory."""
    return str(Path.cwd())


@server.tool()
async def slow(seconds: float, ctx: Context) -> str:
    """Sleep `seconds`, reporting progress ten times a second."""
    steps = max(1, int(seconds * 10))
    for i in range(steps):
        await ctx.report_progress(i, steps, f"step {i + 1} of {steps}")
        await anyio.sleep(seconds / steps)
    return f"slept {seconds} s"


@server.tool()
def huge(kb: int) -> str:
    """A text of `kb` KiB."""
    return ("0123456789abcde\n" * 64 * kb)[: kb * 1024]


@server.tool()
async def hang(ctx: Context) -> str:
    """Work for two minutes, reporting progress (a tool the user cancels)."""
    for i in range(1200):
        await ctx.report_progress(i, 1200, "working")
        await anyio.sleep(0.1)
    return "done"


@server.tool()
def big() -> str:
    """A 200 KiB text (more than a chat's result limit)."""
    return ("0123456789abcde\n" * 64 * 200)[: 200 * 1024]


@server.tool()
def picture() -> Image:
    """An image: a non-text result."""
    return Image(data=_PIXEL, format="png")


@server.tool()
def fail() -> str:
    """Always raises: the client gets an is_error result."""
    raise ToolError("the tool failed on purpose")


@server.tool()
def crash() -> str:
    """Exit the whole server process, as a crashing server does."""
    os._exit(3)


def _run_http(port: int, token: str | None) -> None:
    import uvicorn

    app = server.streamable_http_app()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and token is not None:
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"text/plain")],
                    }
                )
                await send({"type": "http.response.body", "body": b"missing or wrong token"})
                return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT")
    parser.add_argument("--token")
    args = parser.parse_args()
    if args.http:
        _run_http(args.http, args.token)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
