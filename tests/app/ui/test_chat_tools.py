"""MCP tools in the desktop chat, end to end: the real window, the real SmolLM2 (the chat's
`tool_choice` forces the first call: a 135M model would not call on its own) and a real MCP
server written with the SDK (tests/mcp_servers/demo_server.py, over stdio).

The model calls a tool, the approval block appears and nothing runs until Allow; the result is
shown, stored and sent back in the next step's prompt; Deny goes back as a refusal; a crashing
server is one line in the chat; a hanging tool is cancelled by Stop; a huge result is cut
before the model reads it; the calls and results survive reopening the chat and export to
Markdown."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.chat_exchange import export_conversation, export_markdown
from app.services.mcp_config import McpConfigStore, McpServer, StdioTransport
from app.services.paths import AppPaths
from app.ui.main_window import MainWindow
from app.ui.tool_blocks import ToolCallBlock
from engine.settings import LoadParams, SamplingParams
from tests.app.ui.shots import save_shot, shots_dir

pytestmark = [
    pytest.mark.slow,
    pytest.mark.qt_log_ignore(
        "This plugin does not support propagateSizeHints", "This plugin does not support raise"
    ),
]
DEMO = Path(__file__).resolve().parents[2] / "mcp_servers" / "demo_server.py"


def forced(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


@pytest.fixture
def window(qtbot: QtBot, smollm2_path: Path) -> Iterator[MainWindow]:
    McpConfigStore(AppPaths.default().config / "mcp_servers.json").save(
        [McpServer("demo", StdioTransport(sys.executable, (str(DEMO),)))]
    )
    w = build_window(sampling=SamplingParams(temperature=0.0, max_tokens=96))
    w.ask_quit = lambda _parent, _warnings: True
    w.show()
    qtbot.waitExposed(w)
    # Two tool rounds an answer: an always-allowed tool runs without asking, and the default
    # eight rounds of a 135M model calling it again took over the per-test limit on a busy
    # machine (at ~3 tok/s); two still show the loop going on after a result.
    w.controller.set_chat_settings({**w.controller.chat_settings, "tool_rounds": 2})
    w.controller.load(smollm2_path, LoadParams(n_ctx=2048, n_threads=2))
    qtbot.waitUntil(lambda: w.controller.loaded is not None, timeout=120_000)
    prompts: list[list[dict[str, Any]]] = []
    real = w.engine.generate

    def recording(messages: Any, *args: Any, **kwargs: Any) -> int:
        prompts.append([dict(m) for m in messages])
        return real(messages, *args, **kwargs)

    w.engine.generate = recording  # type: ignore[method-assign]
    w.prompts = prompts  # type: ignore[attr-defined]
    yield w
    w.close()
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def ask(qtbot: QtBot, w: MainWindow, text: str, tool: str) -> ToolCallBlock:
    """Send `text` with `tool` forced; the first call's block, waiting for the user."""
    w.controller.set_chat_settings({**w.controller.chat_settings, "tool_choice": forced(tool)})
    assert w.controller.send(text)
    qtbot.waitUntil(lambda: pending(w) is not None or not w.controller.busy, timeout=120_000)
    block = pending(w)
    assert block is not None, transcript(w)
    return block


def transcript(w: MainWindow) -> str:
    """The chat as a test failure shows it."""
    lines = []
    for i in range(w.chat_model.rowCount()):
        m = w.chat_model.message(i)
        lines.append(
            f"{i} {m.role} {m.state} {m.tool_status if m.role == 'tool' else ''} "
            f"{m.text[:80]!r} {[(c.name, c.decision) for c in m.tool_calls]}"
        )
    return "\n".join(lines)


def pending(w: MainWindow) -> ToolCallBlock | None:
    for mw in w.chat_view.message_widgets:
        for b in mw.call_blocks.values():
            if not b.buttons.isHidden():
                return b
    return None


def settle(qtbot: QtBot, w: MainWindow) -> None:
    """Deny whatever else the model asks for, until the turn is over."""

    def done() -> bool:
        b = pending(w)
        if b is not None:
            b.deny_button.click()
        return not w.controller.busy

    qtbot.waitUntil(done, timeout=180_000)


def tool_rows(w: MainWindow) -> list[int]:
    return [i for i in range(w.chat_model.rowCount()) if w.chat_model.message(i).role == "tool"]


def test_allow_runs_the_tool_and_its_result_goes_back_to_the_model(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    w = window
    block = ask(qtbot, w, "What is 2 plus 3? Use the add tool.", "add")
    answer_row = next(
        i for i in range(w.chat_model.rowCount()) if w.chat_model.message(i).tool_calls
    )
    call = w.chat_model.message(answer_row).tool_calls[0]
    args = json.loads(call.arguments)
    assert call.name == "add" and call.server == "demo" and set(args) == {"a", "b"}
    assert block.title.text() == "Tool call: add · demo"
    qtbot.wait(300)
    assert tool_rows(w) == [] and w.controller.busy  # nothing runs before the click
    block.allow_button.click()
    qtbot.waitUntil(
        lambda: (
            bool(tool_rows(w)) and w.chat_model.message(tool_rows(w)[0]).tool_status != "running"
        ),
        timeout=60_000,
    )
    result = w.chat_model.message(tool_rows(w)[0])
    assert (result.tool_status, result.text) == ("complete", str(args["a"] + args["b"]))
    assert block.decision.text() == "Allowed once"
    shown = w.chat_view.message_widgets[tool_rows(w)[0]].result
    assert shown is not None
    shown.toggle.click()  # the result opened, for the picture
    w.resize(1280, 860)
    save_shot(w, shots_dir(tmp_path) / "chat-tool-call.png")
    settle(qtbot, w)
    # The next step's prompt: the call, then its result, in the OpenAI shape.
    second = w.prompts[1]  # type: ignore[attr-defined]
    at = next(i for i, m in enumerate(second) if m.get("tool_calls"))
    calls = second[at]["tool_calls"]
    assert calls[0] == {
        "id": call.id,
        "type": "function",
        "function": {"name": "add", "arguments": call.arguments},
    }
    # Each call answered right after it (a second call SmolLM2 made was denied by `settle`).
    assert second[at + 1] == {
        "role": "tool",
        "tool_call_id": call.id,
        "name": "add",
        "content": result.text,
    }
    assert [m["role"] for m in second[at + 1 :]] == ["tool"] * len(calls)

    # Reopened from the store: the call with its decision and the result, as they were.
    cid = w.controller.conversation_id
    assert cid is not None and w.store is not None
    w.controller.new_chat()
    w.controller.open_conversation(cid)
    shown = [w.chat_model.message(i) for i in range(w.chat_model.rowCount())]
    reopened = next(m for m in shown if m.tool_calls)
    assert reopened.tool_calls[0].decision == "allowed"
    assert any(m.role == "tool" and m.text == result.text for m in shown)
    md = export_markdown([export_conversation(w.store, cid)])
    assert "**Tool call** `add` on `demo`" in md and result.text in md


def test_deny_goes_back_as_a_refusal(qtbot: QtBot, window: MainWindow) -> None:
    w = window
    block = ask(qtbot, w, "Read my note called groceries.", "read_note")
    block.deny_button.click()
    settle(qtbot, w)
    first = w.chat_model.message(tool_rows(w)[0])
    assert first.tool_status == "denied" and block.decision.text() == "Denied"
    assert w.prompts[1][-1]["content"] == "The user denied this tool call."  # type: ignore[attr-defined]


def test_always_allow_is_remembered_for_the_tool(qtbot: QtBot, window: MainWindow) -> None:
    w = window
    ask(qtbot, w, "What is 1 plus 1?", "add").always_button.click()
    settle(qtbot, w)
    server = McpConfigStore(AppPaths.default().config / "mcp_servers.json").get("demo")
    assert server is not None and "add" in server.always_allow
    # The next call of that tool runs without asking.
    w.controller.set_chat_settings({**w.controller.chat_settings, "tool_choice": forced("add")})
    before = len(tool_rows(w))
    assert w.controller.send("And 2 plus 2?")
    qtbot.waitUntil(lambda: len(tool_rows(w)) > before, timeout=120_000)
    assert w.chat_model.message(tool_rows(w)[before]).tool_call_id is not None
    settle(qtbot, w)


def test_a_crashing_server_is_one_line_and_a_huge_result_is_cut(
    qtbot: QtBot, window: MainWindow
) -> None:
    w = window
    ask(qtbot, w, "Crash.", "crash").allow_button.click()
    settle(qtbot, w)
    crashed = w.chat_model.message(tool_rows(w)[0])
    assert crashed.tool_status == "error" and "\n" not in crashed.text and crashed.text
    before = len(tool_rows(w))
    ask(qtbot, w, "Give me the big text.", "big").allow_button.click()  # restarted
    settle(qtbot, w)
    big = w.chat_model.message(tool_rows(w)[before])
    assert big.tool_status == "complete" and big.truncated
    assert len(big.text.encode()) < 70 * 1024 and "truncated" in big.text


def test_stop_cancels_a_hanging_tool(qtbot: QtBot, window: MainWindow) -> None:
    w = window
    ask(qtbot, w, "Work on it.", "hang").allow_button.click()
    qtbot.waitUntil(lambda: bool(tool_rows(w)), timeout=30_000)
    row = tool_rows(w)[0]
    qtbot.waitUntil(lambda: w.chat_model.message(row).progress is not None, timeout=30_000)
    result = w.chat_view.message_widgets[row].result
    assert result is not None and not result.cancel_button.isHidden()
    w.controller.stop()
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=10_000)
    assert w.chat_model.message(row).tool_status == "cancelled"
    assert len(w.prompts) == 1  # type: ignore[attr-defined]  # Stop ends the turn


def test_a_streamable_http_server_with_a_token(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same loop over HTTP: the token from the keyring reaches the server (it refuses
    requests without it)."""
    import keyring

    from app.services.mcp_config import HttpTransport
    from tests.app.services.test_mcp_client import start_http_server, stop_process
    from tests.memory_keyring import MemoryKeyring

    memory = MemoryKeyring()  # not the machine's keyring
    monkeypatch.setattr(keyring, "get_keyring", lambda: memory)

    proc, url = start_http_server("s3cret-token")
    try:
        w = window
        turns = w.controller.turns
        assert turns is not None
        store = turns.runner.store  # the app's: its secrets are the hub's
        store.save([McpServer("remote", HttpTransport(url))])
        saved = store.set_token("remote", "s3cret-token")
        assert saved is not None
        assert "s3cret-token" not in store.path.read_text(encoding="utf-8")
        block = ask(qtbot, w, "What is 4 plus 4?", "add")
        assert block.title.text() == "Tool call: add · remote"
        block.allow_button.click()
        qtbot.waitUntil(
            lambda: (
                bool(tool_rows(w))
                and w.chat_model.message(tool_rows(w)[0]).tool_status != "running"
            ),
            timeout=60_000,
        )
        result = w.chat_model.message(tool_rows(w)[0])
        args = json.loads(
            w.chat_model.message(tool_rows(w)[0] - 1).tool_calls[0].arguments
            if w.chat_model.message(tool_rows(w)[0] - 1).tool_calls
            else "{}"
        )
        assert result.tool_status == "complete", result.text
        assert not args or result.text == str(args["a"] + args["b"])
        settle(qtbot, w)
    finally:
        stop_process(proc)
