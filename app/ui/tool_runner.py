"""The chat's MCP tools, for the GUI thread: which tools a chat offers the model, and running
one call the user allowed, off the GUI thread, with progress and Cancel.

It owns the app's `McpHub` (app/services/mcp_client.py), configured from the MCP servers'
settings (`McpConfigStore`) each time they are read, so the dialog's changes apply to the next
turn. Listing a server's tools starts it, which may take seconds: `prepare` does that in the
background and calls back on the GUI thread; the tools are then cached until the settings
change or a server fails. What a chat offers and its agent loop are Qt-free
(app/services/chat_tools.py); this is the `ToolPort` they run on.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.services.chat_settings import ChatSettings
from app.services.chat_tools import OfferedTool, chat_servers, offer
from app.services.mcp_client import (
    McpClientError,
    McpHub,
    ToolCancelledError,
    ToolInfo,
)
from app.services.mcp_config import McpConfigError, McpConfigStore, McpServer
from app.ui.background import Background

log = logging.getLogger("candlewick.tools")
TOOL_TIMEOUT_S = 300.0


class ToolRunner(QObject):
    """`progress(token, done, total, message)` while a call runs; `done(token, status, text,
    truncated)` when it ends: status complete | error | cancelled."""

    progress = Signal(int, float, object, object)
    done = Signal(int, str, str, bool)

    def __init__(
        self, store: McpConfigStore, hub: McpHub | None = None, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.store = store
        self.hub = hub or McpHub(secrets=store.secrets)
        self._bg = Background(self)
        self._tools: dict[str, list[ToolInfo]] = {}  # per server, while its settings hold
        self._seen: dict[str, McpServer] = {}
        self._cancels: dict[int, threading.Event] = {}
        self._next = 0
        self.problems: list[str] = []  # servers that could not list their tools, one line each

    # -- the tools a chat offers -----------------------------------------------------------

    def servers(self) -> list[McpServer]:
        try:
            servers = self.store.servers()
        except McpConfigError as e:
            self.problems = [str(e)]
            return []
        for s in servers:
            if self._seen.get(s.name) != s:  # new or changed: its tools are listed again
                self._tools.pop(s.name, None)
        self._seen = {s.name: s for s in servers}
        self.hub.configure([s for s in servers if s.enabled])
        return servers

    def cached(self, settings: ChatSettings) -> list[OfferedTool] | None:
        """The chat's tools if every server's list is known (None: `prepare` first)."""
        chosen = chat_servers(settings, self.servers())
        if any(s.name not in self._tools for s in chosen):
            return None
        return offer([(s.name, t) for s in chosen for t in self._tools[s.name]])

    def prepare(self, settings: ChatSettings, then: Callable[[list[OfferedTool]], None]) -> None:
        """List the chat's servers' tools (starting them) off the GUI thread, then call
        `then(tools)` on it; a server that fails is left out and named in `problems`."""
        chosen = chat_servers(settings, self.servers())
        hub = self.hub

        def work() -> tuple[dict[str, list[ToolInfo]], list[str]]:
            found, problems = {}, []
            for s in chosen:
                try:
                    found[s.name] = hub.list_tools(s.name)
                except McpClientError as e:
                    problems.append(f"{s.name}: {e}")
            return found, problems

        def done(result: Any, error: BaseException | None) -> None:
            found, problems = result if error is None else ({}, [str(error)])
            self._tools.update(found)
            self.problems = problems
            then(offer([(s.name, t) for s in chosen if s.name in found for t in found[s.name]]))

        self._bg.run(work, done, name="candlewick-tools-list")

    def always_allowed(self, tool: OfferedTool) -> bool:
        server = self._seen.get(tool.server)
        return server is not None and tool.tool in server.always_allow

    def allow_always(self, tool: OfferedTool) -> None:
        try:
            self.store.set_always_allow(tool.server, tool.tool, True)
        except McpConfigError as e:  # it still runs this once
            log.warning("could not save always-allow for %s: %s", tool.name, e)
        self.servers()

    # -- running a call ----------------------------------------------------------------------

    def run(self, tool: OfferedTool, arguments: str) -> int:
        """Start the call; returns its token for `cancel`, `progress` and `done`."""
        self._next += 1
        token = self._next
        cancel = self._cancels[token] = threading.Event()
        hub = self.hub

        def work() -> tuple[str, str, bool]:
            try:
                args = json.loads(arguments) if arguments.strip() else {}
            except ValueError as e:
                return "error", f"the model's arguments are not JSON: {e}", False
            if not isinstance(args, dict):
                return "error", "the model's arguments are not a JSON object", False
            try:
                result = hub.call_tool(
                    tool.server,
                    tool.tool,
                    args,
                    cancel=cancel,
                    timeout_s=TOOL_TIMEOUT_S,
                    on_progress=lambda done, total, msg: self.progress.emit(
                        token, float(done), total, msg
                    ),
                )
            except ToolCancelledError:
                return "cancelled", "", False
            except McpClientError as e:  # a server that died, a timeout: one line
                self._tools.pop(tool.server, None)
                return "error", str(e), False
            return ("error" if result.is_error else "complete"), result.text, result.truncated

        def finished(result: Any, error: BaseException | None) -> None:
            self._cancels.pop(token, None)
            if error is not None:
                self.done.emit(token, "error", f"internal error: {error}", False)
                return
            status, text, truncated = result
            self.done.emit(token, status, text, truncated)

        self._bg.run(work, finished, name="candlewick-tool-call")
        return token

    def cancel(self, token: int | None = None) -> None:
        """Cancel one call (or every call running)."""
        for t, ev in list(self._cancels.items()):
            if token is None or t == token:
                ev.set()

    def shutdown(self) -> None:
        self.cancel()
        self._bg.wait(10)
        self.hub.close()


__all__ = ["OfferedTool", "ToolRunner", "chat_servers", "offer"]
