"""The chat's MCP tools, Qt-free: which tools a chat offers the model, and the agent loop of
one answer: the model's tool calls, the user's decision on each, the calls the user allowed
run through a `ToolPort`, their results sent back, and the model asked again, until it
answers without calls or the chat's limit of tool rounds is reached.

The chat's session owns one `ToolLoop` and tells it what the engine did (`offer`,
`calls_made`, `answer_finished`); the view's buttons come in through `decide` and
`cancel_tool`, the port's progress and results through `tool_progress` and `tool_done`. It
asks the session for the next model step with `on_continue` and says the loop is over with
`on_ended(note)`. Every call and result is written to the chat store as it happens (a running
tool is recovered after a crash like a streaming answer).

Nothing runs without the user's click, unless they chose "Always allow this tool" for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.services.chat_settings import DEFAULT_TOOL_ROUNDS, ChatSettings
from app.services.chat_store import ChatStore, ChatStoreError
from app.services.chat_transcript import Transcript
from app.services.conversation import ToolCallView, ToolDecision, ToolProgress, ToolStatus
from app.services.mcp_client import ToolInfo
from app.services.mcp_config import McpServer

log = logging.getLogger("candlewick.tools")


@dataclass(frozen=True)
class OfferedTool:
    """A tool as the model sees it (`name`: unique among the chat's tools) and where it runs."""

    name: str
    server: str
    tool: str
    description: str
    schema: dict[str, Any]

    def as_function(self) -> dict[str, Any]:
        params = dict(self.schema or {"type": "object", "properties": {}})
        # The call is decoded under a grammar of this schema: without this, "any other key"
        # is allowed too, and a small model fills a tool of no parameters with invented
        # ones until it runs out of tokens. The tool's server takes nothing else anyway.
        if params.get("type") == "object" and "additionalProperties" not in params:
            params["additionalProperties"] = False
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": params},
        }


def offer(tools: Sequence[tuple[str, ToolInfo]]) -> list[OfferedTool]:
    """Each (server, tool) under the tool's own name, or `server_tool` where two servers
    have a tool of the same name (the model must be able to tell them apart)."""
    counts: dict[str, int] = {}
    for _, t in tools:
        counts[t.name] = counts.get(t.name, 0) + 1
    out = []
    for server, t in tools:
        name = t.name if counts[t.name] == 1 else f"{server}_{t.name}"
        out.append(
            OfferedTool(name, server, t.name, t.description or "", dict(t.input_schema or {}))
        )
    return out


def chat_servers(settings: ChatSettings, servers: Sequence[McpServer]) -> list[McpServer]:
    """The servers a chat uses: the enabled ones, less those it turned off for itself."""
    off = set(settings.tools_off)
    return [s for s in servers if s.enabled and s.name not in off]


class ToolPort(Protocol):
    """Lists a chat's tools and runs calls off the session's thread (the window's
    `ToolRunner`); its progress and results come back through `ToolLoop.tool_progress` and
    `ToolLoop.tool_done`, on the session's thread."""

    problems: list[str]

    def cached(self, settings: ChatSettings) -> list[OfferedTool] | None: ...
    def prepare(
        self, settings: ChatSettings, then: Callable[[list[OfferedTool]], None]
    ) -> None: ...
    def always_allowed(self, tool: OfferedTool) -> bool: ...
    def allow_always(self, tool: OfferedTool) -> None: ...
    def run(self, tool: OfferedTool, arguments: str) -> int: ...
    def cancel(self, token: int | None = None) -> None: ...


def _ignore(*_: object) -> None:
    pass


class ToolLoop:
    def __init__(self, runner: ToolPort, chat: Transcript) -> None:
        self.runner = runner
        self.chat = chat
        self.store: ChatStore | None = None
        # Every call of the answer is answered: ask the model again (set by the session).
        self.on_continue: Callable[[], None] = _ignore
        # The loop is over ('' or why it stopped: the round limit, Stop).
        self.on_ended: Callable[[str], None] = _ignore
        self.offered: dict[str, OfferedTool] = {}
        self.rounds = 0
        self.max_rounds = DEFAULT_TOOL_ROUNDS
        self.row: int | None = None  # the answer whose calls are being answered
        self._calls: list[ToolCallView] = []  # calls of the answer still streaming
        self._token: int | None = None  # the call running now
        self._tool_row: int | None = None
        self._stopping = False

    @property
    def active(self) -> bool:
        """Waiting for the user or a tool (the chat is busy meanwhile)."""
        return self.row is not None

    # -- from the session ----------------------------------------------------------------------

    def new_turn(self, settings: ChatSettings) -> None:
        """The user asked something: the round count starts again."""
        self.rounds = 0
        self.max_rounds = settings.tool_rounds

    def offer(self, tools: list[OfferedTool]) -> list[dict[str, Any]]:
        """The tools of the next model step, as the engine takes them."""
        self.offered = {t.name: t for t in tools}
        self._calls = []
        return [t.as_function() for t in tools]

    def calls_made(self, calls: list[dict[str, Any]]) -> None:
        """The answer streaming now made these calls (before its `finished`)."""
        self._calls = [
            ToolCallView(
                str(c["id"]),
                str(c["name"]),
                str(c["arguments"]),
                server=self.offered[c["name"]].server if c["name"] in self.offered else "",
            )
            for c in calls
        ]

    def answer_finished(self, row: int, store_id: int | None) -> bool:
        """The answer at `row` ended; True when it made calls and the loop takes over (the
        chat stays busy until `on_ended`)."""
        calls, self._calls = self._calls, []
        if not calls:
            return False
        self.chat.set_tool_calls(row, calls)
        self._store(
            lambda s: (
                s.update_message(store_id, tool_calls=_stored(calls))
                if store_id is not None
                else None
            )
        )
        self.row = row
        self.rounds += 1
        self._stopping = False
        self._next()
        return True

    def decide(self, row: int, call_id: str, decision: str) -> None:
        """The user's click on a call of the answer being answered."""
        if (
            row != self.row
            or self._token is not None
            or decision not in ("allowed", "always", "denied")
        ):
            return
        call = self._pending_call()
        if call is None or call.id != call_id:
            return  # answered already, or not the one asked about now
        self._decide(call, decision)  # type: ignore[arg-type]

    def cancel_tool(self, row: int) -> None:
        """Cancel on a running tool: it ends as cancelled and the model hears so."""
        if row == self._tool_row and self._token is not None:
            self.runner.cancel(self._token)

    def stop(self) -> bool:
        """Stop pressed: the running tool is cancelled, the calls not yet answered are
        cancelled, and the loop ends. False when the loop was not running."""
        if self.row is None:
            return False
        self._stopping = True
        if self._token is not None:
            self.runner.cancel(self._token)  # the loop ends when its result comes
        else:
            self._finish("Stopped: the tool calls left were not run")
        return True

    def abandon(self) -> None:
        """The chat on screen changes (new chat, another conversation): drop the loop, with
        the calls not answered marked cancelled in the store."""
        if self._token is not None:
            self.runner.cancel(self._token)
        if self.row is not None:
            self._cancel_rest()
        self.row = self._token = self._tool_row = None
        self._calls = []

    # -- from the port ---------------------------------------------------------------------------

    def tool_progress(self, token: int, done: float, total: object, message: object) -> None:
        if token == self._token and self._tool_row is not None:
            self.chat.set_tool_progress(
                self._tool_row,
                ToolProgress(
                    done,
                    float(total) if isinstance(total, int | float) else None,
                    str(message) if message else None,
                ),
            )

    def tool_done(self, token: int, status: str, text: str, truncated: bool) -> None:
        if token != self._token or self._tool_row is None:
            return
        row, self._token, self._tool_row = self._tool_row, None, None
        final: ToolStatus = status if status in ("complete", "error", "cancelled") else "error"  # type: ignore[assignment]
        self.chat.set_tool_result(row, final, text, truncated=truncated)
        sid = self.chat.message(row).store_id
        self._store(
            lambda s: (
                s.update_tool_result(sid, content=text, status=final, truncated=truncated)
                if sid is not None
                else None
            )
        )
        if self._stopping:
            self._finish("Stopped: the tool was cancelled")
        else:
            self._next()

    # -- the loop ----------------------------------------------------------------------------

    def _pending_call(self) -> ToolCallView | None:
        if self.row is None:
            return None
        return next(
            (c for c in self.chat.message(self.row).tool_calls if c.decision == "pending"), None
        )

    def _next(self) -> None:
        call = self._pending_call()
        if call is None:
            self._round_done()
            return
        tool = self.offered.get(call.name)
        if tool is None:  # the model named a tool this chat does not offer
            self._set_decision(call, "cancelled")
            self._result(call, "error", f"no tool named {call.name!r} is offered in this chat")
            self._next()
            return
        if self.runner.always_allowed(tool):
            self._decide(call, "always")
        # else: the block's buttons wait for the user

    def _decide(self, call: ToolCallView, decision: ToolDecision) -> None:
        self._set_decision(call, decision)
        tool = self.offered[call.name]
        if decision == "always":
            self.runner.allow_always(tool)
        if decision == "denied":
            self._result(call, "denied")
            self._next()
            return
        self._tool_row = self._result(call, "running")
        self._token = self.runner.run(tool, call.arguments)

    def _round_done(self) -> None:
        if self.rounds >= self.max_rounds:
            self._finish(
                f"Stopped after {self.rounds} tool round"
                f"{'s' if self.rounds != 1 else ''} (the chat's limit; Tool rounds "
                "in the chat settings)"
            )
            return
        self.row = None
        self.on_continue()

    def _finish(self, note: str) -> None:
        self._cancel_rest()
        self.row = None
        self.on_ended(note)

    def _cancel_rest(self) -> None:
        while (call := self._pending_call()) is not None:
            self._set_decision(call, "cancelled")
            self._result(call, "cancelled")

    # -- the conversation and the store --------------------------------------------------------

    def _set_decision(self, call: ToolCallView, decision: ToolDecision) -> None:
        assert self.row is not None
        self.chat.set_decision(self.row, call.id, decision)
        sid = self.chat.message(self.row).store_id
        # The store knows pending | allowed | always | denied: "cancelled" stays pending
        # there, answered by its cancelled result.
        if sid is not None and decision != "cancelled":
            self._store(lambda s: s.set_tool_decision(sid, call.id, decision))

    def _result(self, call: ToolCallView, status: ToolStatus, text: str = "") -> int:
        """A tool message for `call` on screen and in the store; its row."""
        assert self.row is not None
        row = self.chat.append_tool(call, status, text)
        answer = self.chat.message(self.row).store_id
        if answer is not None and self.store is not None:
            try:
                stored = self.store.add_tool_result(answer, call.id, text, status=status)
                self.chat.message(row).store_id = stored.id
            except ChatStoreError as e:  # on screen still; the history misses it
                log.warning("tool result not saved: %s", e)
        return row

    def _store(self, write: Callable[[ChatStore], object]) -> None:
        if self.store is None:
            return
        try:
            write(self.store)
        except ChatStoreError as e:
            log.warning("tool call not saved: %s", e)


def _stored(calls: list[ToolCallView]) -> list[dict[str, Any]]:
    return [
        {
            "id": c.id,
            "name": c.name,
            "arguments": c.arguments,
            "server": c.server,
            "decision": c.decision,
        }
        for c in calls
    ]


__all__ = ["OfferedTool", "ToolLoop", "ToolPort", "chat_servers", "offer"]
