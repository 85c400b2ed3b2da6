"""The MCP servers dialog against real servers: the demo server as a stdio command and as a
Streamable HTTP server with a bearer token, tokens in a memory keyring."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.services.mcp_client import THREAD_NAME, McpHub
from app.services.mcp_config import HttpTransport, McpConfigStore, McpServer, StdioTransport
from app.services.secrets import SERVICE, SecretStore
from app.ui.mcp_dialog import (
    COL_ALLOW,
    COL_DESCRIPTION,
    COL_PARAMETERS,
    ENV_MASK,
    McpServersDialog,
    describe_parameters,
    join_args,
    parse_env,
    split_args,
)
from tests.app.services.test_mcp_client import start_http_server, stop_process
from tests.app.ui.shots import save_shot, shots_dir
from tests.memory_keyring import MemoryKeyring

# Showing a dialog on the offscreen platform says this once per window; harmless.
pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

DEMO = Path(__file__).resolve().parents[2] / "mcp_servers" / "demo_server.py"
TOKEN = "tok-SECRET-7731"
ENV_SECRET = "env-SECRET-4410"
CHECK = "\u2713 "
CROSS = "\u2717 "


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """The demo server over Streamable HTTP, refusing requests without TOKEN."""
    proc, url = start_http_server(TOKEN)
    try:
        yield url
    finally:
        stop_process(proc)


@pytest.fixture
def keyring_backend() -> MemoryKeyring:
    return MemoryKeyring()


@pytest.fixture
def store(tmp_path: Path, keyring_backend: MemoryKeyring) -> McpConfigStore:
    return McpConfigStore(tmp_path / "mcp_servers.json", SecretStore(keyring_backend))


class Hubs:
    """A hub factory that remembers what it built, to check each test hub was closed."""

    def __init__(self) -> None:
        self.built: list[tuple[list[McpServer], McpHub]] = []

    def __call__(self, servers: Sequence[McpServer], secrets: SecretStore) -> McpHub:
        hub = McpHub(servers, secrets=secrets)
        self.built.append((list(servers), hub))
        return hub


@pytest.fixture
def hubs() -> Hubs:
    return Hubs()


@pytest.fixture
def open_dialog(
    qtbot: QtBot, store: McpConfigStore, hubs: Hubs
) -> Iterator[Callable[[], McpServersDialog]]:
    """Opens dialogs on the store (shown, like the app does) and closes them at the end."""
    opened: list[McpServersDialog] = []

    def make() -> McpServersDialog:
        d = McpServersDialog(store, hub_factory=hubs)
        qtbot.addWidget(d)
        d.show()
        qtbot.waitExposed(d)
        opened.append(d)
        return d

    yield make
    for d in opened:
        d.done(0)


def run_test(qtbot: QtBot, dialog: McpServersDialog) -> tuple[bool, str]:
    with qtbot.waitSignal(dialog.tested, timeout=60_000) as got:
        dialog.test_button.click()
    assert got.args is not None
    ok, line = got.args
    assert line and "\n" not in line and "Traceback" not in line
    assert dialog.status.text() == (CHECK if ok else CROSS) + line
    # The result arrives after the hub closed, stopping its loop thread and its server.
    qtbot.waitUntil(lambda: dialog.background.running == 0, timeout=10_000)
    assert not any(t.name == THREAD_NAME for t in threading.enumerate())
    return bool(ok), str(line)


def env_of(store: McpConfigStore, name: str) -> dict[str, str]:
    t = store.get(name).transport
    assert isinstance(t, StdioTransport)
    return dict(t.env)


def cell(dialog: McpServersDialog, tool: str, col: int) -> str:
    item = dialog.tools.item(dialog.tool_row(tool), col)
    assert item is not None
    return item.text()


def allow_cell(dialog: McpServersDialog, tool: str) -> Qt.CheckState:
    item = dialog.tools.item(dialog.tool_row(tool), COL_ALLOW)
    assert item is not None
    return item.checkState()


def click_allow(dialog: McpServersDialog, tool: str, on: bool) -> None:
    item = dialog.tools.item(dialog.tool_row(tool), COL_ALLOW)
    assert item is not None and item.flags() & Qt.ItemFlag.ItemIsEnabled
    item.setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)


def fill_stdio(qtbot: QtBot, dialog: McpServersDialog, name: str, command: str, args: str) -> None:
    dialog.new_server()
    qtbot.keyClicks(dialog.name, name)
    qtbot.keyClicks(dialog.command, command)
    qtbot.keyClicks(dialog.arguments, args)


# -- helpers of the form ----------------------------------------------------------------------


def test_arguments_split_like_a_shell() -> None:
    assert split_args('-y "my server" --flag=a\\ b', windows=False) == [
        "-y",
        "my server",
        "--flag=a b",
    ]
    assert split_args(r'C:\tools\srv.py "C:\My Files\x"', windows=True) == [
        r"C:\tools\srv.py",
        r"C:\My Files\x",
    ]
    args = ["--name", "two words", "it's"]
    assert split_args(join_args(args, windows=False), windows=False) == args
    assert split_args(join_args(args[:2], windows=True), windows=True) == args[:2]
    with pytest.raises(ValueError, match="the arguments do not parse"):
        split_args('"unclosed', windows=False)


def test_environment_lines() -> None:
    assert parse_env("A=1\n\n# note\nB = x=y\n") == {"A": "1", "B": " x=y"}
    with pytest.raises(ValueError, match=r"^environment line 2: expected NAME=VALUE$"):
        parse_env("A=1\nsecret-without-name")


def test_parameters_from_the_input_schema() -> None:
    schema = {
        "type": "object",
        "required": ["path"],
        "properties": {
            "path": {"type": "string"},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "mode": {"enum": ["a", "b"]},
        },
    }
    assert describe_parameters(schema) == (
        "path: string (required), limit: integer | null, tags: array of string, mode: enum"
    )
    assert describe_parameters({"type": "object"}) == "none"


# -- stdio -------------------------------------------------------------------------------------


def test_stdio_server_lists_its_tools_saves_and_allows(
    qtbot: QtBot,
    open_dialog: Callable[[], McpServersDialog],
    store: McpConfigStore,
    hubs: Hubs,
    tmp_path: Path,
) -> None:
    dialog = open_dialog()
    assert dialog.names() == [] and not dialog.remove_button.isEnabled()
    assert dialog.transport.currentData() == "stdio"
    assert dialog.command.isVisible() and not dialog.token.isVisible()
    fill_stdio(qtbot, dialog, "demo", sys.executable, join_args([str(DEMO)]))

    # Tested before it is saved: the form as it is, on a hub of its own.
    ok, line = run_test(qtbot, dialog)
    assert (ok, line) == (True, f"{len(dialog.tool_names())} tools on demo")
    assert {"add", "read_note", "slow", "huge", "fail", "crash"} <= set(dialog.tool_names())
    assert cell(dialog, "add", COL_DESCRIPTION) == "Add two integers."
    assert cell(dialog, "add", COL_PARAMETERS) == "a: integer (required), b: integer (required)"
    assert cell(dialog, "read_note", COL_PARAMETERS) == "name: string (required)"
    assert cell(dialog, "slow", COL_PARAMETERS) == "seconds: number (required)"
    assert cell(dialog, "pid", COL_PARAMETERS) == "none"
    ((servers, hub),) = hubs.built
    assert [s.name for s in servers] == ["demo"] and hub._closed
    # "Always allow" belongs to a saved server: greyed out until then.
    item = dialog.tools.item(dialog.tool_row("add"), COL_ALLOW)
    assert item is not None and not item.flags() & Qt.ItemFlag.ItemIsEnabled

    assert dialog.save()
    assert dialog.names() == ["demo"] and dialog.status.text() == CHECK + "Saved demo"
    saved = store.get("demo")
    assert saved.transport == StdioTransport(sys.executable, (str(DEMO),))
    assert saved.enabled and saved.always_allow == frozenset()
    click_allow(dialog, "add", True)
    click_allow(dialog, "read_note", True)
    click_allow(dialog, "read_note", False)
    assert store.get("demo").always_allow == {"add"}

    # Saving the form again keeps what the table set.
    dialog.cwd.setText(str(DEMO.parent))
    dialog.show_env.setChecked(True)
    dialog.env.setPlainText(f"DEMO_TOKEN={ENV_SECRET}")
    dialog.show_env.setChecked(False)
    assert dialog.save()
    assert store.get("demo").always_allow == {"add"}
    assert store.get("demo").transport == StdioTransport(
        sys.executable, (str(DEMO),), env={"DEMO_TOKEN": ENV_SECRET}, cwd=str(DEMO.parent)
    )

    # The enabled checkbox in the list saves at once; a server turned off still tests.
    dialog.list.item(0).setCheckState(Qt.CheckState.Unchecked)
    assert not store.get("demo").enabled
    assert run_test(qtbot, dialog)[0]
    assert hubs.built[-1][0][0].enabled

    # A fresh dialog shows it as saved: off, and "add" allowed once its tools are listed.
    again = open_dialog()
    assert again.names() == ["demo"] and again.name.text() == "demo"
    assert again.list.item(0).checkState() == Qt.CheckState.Unchecked
    assert again.arguments.text() == join_args([str(DEMO)])
    again.list.item(0).setCheckState(Qt.CheckState.Checked)
    assert store.get("demo").enabled
    assert run_test(qtbot, again)[0]
    assert allow_cell(again, "add") == Qt.CheckState.Checked
    assert allow_cell(again, "read_note") == Qt.CheckState.Unchecked
    assert ENV_SECRET not in again.env.toPlainText()
    save_shot(again, shots_dir(tmp_path) / "mcp_servers.png")

    again.remove_button.click()
    assert store.servers() == [] and again.names() == []
    assert again.status.text() == CHECK + "Removed demo" and again.name.text() == ""


def test_failing_commands_show_one_line(
    qtbot: QtBot, open_dialog: Callable[[], McpServersDialog], tmp_path: Path
) -> None:
    dialog = open_dialog()
    fill_stdio(qtbot, dialog, "missing", str(tmp_path / "no-such-command"), "")
    ok, line = run_test(qtbot, dialog)
    assert not ok
    assert (
        line == f"MCP server 'missing' could not start: command not found: "
        f"{tmp_path / 'no-such-command'}"
    )

    # A server that exits at once: its last stderr line says why.
    fill_stdio(qtbot, dialog, "exits", sys.executable, "-c \"import sys; sys.exit('boom')\"")
    ok, line = run_test(qtbot, dialog)
    assert not ok and "exits" in line and "boom" in line

    # Settings that do not parse are refused before anything starts.
    fill_stdio(qtbot, dialog, "bad", sys.executable, '"unclosed')
    with qtbot.waitSignal(dialog.tested, timeout=5_000) as got:
        dialog.test_button.click()
    assert got.args == [False, "the arguments do not parse: No closing quotation"]
    dialog.new_server()
    with qtbot.waitSignal(dialog.tested, timeout=5_000) as got:
        dialog.test_button.click()
    assert got.args == [False, "server: the command is empty"]
    assert dialog.background.running == 0


def test_closing_during_a_test_of_a_silent_server(
    qtbot: QtBot, open_dialog: Callable[[], McpServersDialog]
) -> None:
    dialog = open_dialog()
    fill_stdio(qtbot, dialog, "silent", sys.executable, '-c "import time; time.sleep(60)"')
    dialog.test_button.click()
    assert dialog.background.running == 1 and not dialog.test_button.isEnabled()
    started, running = time.monotonic(), dialog.background
    dialog.done(0)  # cancels the listing and waits a moment for the server to stop
    assert time.monotonic() - started < 5
    # The SDK gives a server that ignores its closed stdin 2 s before SIGTERM.
    qtbot.waitUntil(lambda: running.running == 0, timeout=15_000)


# -- HTTP --------------------------------------------------------------------------------------


def test_http_server_token_goes_to_the_keyring(
    qtbot: QtBot,
    open_dialog: Callable[[], McpServersDialog],
    store: McpConfigStore,
    keyring_backend: MemoryKeyring,
    http_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="candlewick")
    dialog = open_dialog()
    assert dialog.token.echoMode() == dialog.token.EchoMode.Password
    dialog.new_server()
    qtbot.keyClicks(dialog.name, "web")
    dialog.transport.setCurrentIndex(dialog.transport.findData("http"))
    assert dialog.url.isVisible() and not dialog.command.isVisible()
    qtbot.keyClicks(dialog.url, http_url)

    # Without the token the server refuses; with it typed (not saved yet) it lists its tools.
    ok, line = run_test(qtbot, dialog)
    assert not ok and "HTTP 401" in line and "check the server's token" in line
    qtbot.keyClicks(dialog.token, TOKEN)
    ok, _ = run_test(qtbot, dialog)
    assert ok and "add" in dialog.tool_names()

    assert dialog.save()
    assert dialog.status.text().startswith(CHECK + "Saved web; token saved in the system keyring")
    assert keyring_backend.store[(SERVICE, "mcp:web")] == TOKEN
    assert TOKEN not in store.path.read_text()
    assert store.get("web").transport == HttpTransport(http_url)
    assert dialog.token.text() == "" and "saved" in dialog.token.placeholderText()

    # Empty field: the saved token is used. A wrong one typed: one line, without it.
    ok, _ = run_test(qtbot, dialog)
    assert ok
    dialog.token.setText("wrong-token-1234")
    ok, line = run_test(qtbot, dialog)
    assert not ok and "HTTP 401" in line and "wrong-token" not in line
    dialog.token.clear()

    # Renamed: the token moves with it.
    dialog.name.setText("web2")
    assert dialog.save()
    assert keyring_backend.store == {(SERVICE, "mcp:web2"): TOKEN}
    assert run_test(qtbot, dialog)[0]
    assert dialog.remove_button.isEnabled()
    dialog.remove_button.click()
    assert not keyring_backend.store
    assert TOKEN not in caplog.text and TOKEN not in store.path.read_text()


# -- import, masking, store errors --------------------------------------------------------------


MIXED = {
    "mcpServers": {
        "files": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
            "env": {"API_KEY": ENV_SECRET},
        },
        "remote": {
            "url": "https://mcp.example.com/mcp",
            "headers": {"Authorization": f"Bearer {TOKEN}", "X-Team": "blue"},
        },
        "legacy": {"type": "sse", "url": "https://old.example.com/sse"},
        "broken": {"args": []},
    }
}


def test_import_shows_added_and_problems(
    qtbot: QtBot,
    open_dialog: Callable[[], McpServersDialog],
    store: McpConfigStore,
    keyring_backend: MemoryKeyring,
) -> None:
    dialog = open_dialog()
    changes: list[None] = []
    dialog.changed.connect(lambda: changes.append(None))
    report = dialog.import_text(json.dumps(MIXED))
    assert report is not None and report.added == ["files", "remote"]
    assert dialog.names() == ["files", "remote"] and len(changes) == 1
    problems = [dialog.problems.item(i).text() for i in range(dialog.problems.count())]
    assert problems == report.problems and len(problems) == 3
    assert problems[0].startswith("remote: header 'X-Team' was not imported")
    assert problems[1].startswith("legacy: not imported: SSE servers")
    assert problems[2] == "broken: not imported: the entry has neither a command nor a url"
    assert dialog.problems.isVisible()
    assert dialog.status.text() == CHECK + "Imported files, remote; 3 problems (below)"
    # The first one added is in the form, its env value masked.
    assert dialog.name.text() == "files" and ENV_SECRET not in dialog.env.toPlainText()
    assert keyring_backend.store[(SERVICE, "mcp:remote")] == TOKEN
    assert TOKEN not in store.path.read_text()

    # Through the button, with the text box replaced; cancelling does nothing.
    dialog.ask_import_text = lambda: None
    dialog.import_button.click()
    assert dialog.names() == ["files", "remote"]
    dialog.ask_import_text = lambda: json.dumps(MIXED)
    dialog.import_button.click()
    assert dialog.status.text() == CROSS + "Imported nothing; 4 problems (below)"
    assert all("exists already" in dialog.problems.item(i).text() for i in (0, 1))
    assert dialog.list.currentItem().text() == dialog.name.text() == "files"
    dialog.ask_import_text = lambda: "{not json"
    dialog.import_button.click()
    assert dialog.status.text() == CROSS + "Import failed: not valid JSON (line 1, column 2)"
    assert dialog.names() == ["files", "remote"]


def test_environment_values_are_masked(
    qtbot: QtBot, open_dialog: Callable[[], McpServersDialog], store: McpConfigStore
) -> None:
    store.add(
        McpServer(
            "demo",
            StdioTransport(
                sys.executable, (str(DEMO),), env={"DEMO_VALUE": ENV_SECRET, "EMPTY": ""}
            ),
        )
    )
    dialog = open_dialog()
    assert dialog.env.toPlainText() == f"DEMO_VALUE={ENV_MASK}\nEMPTY={ENV_MASK}"
    assert dialog.env.isReadOnly() and not dialog.show_env.isChecked()
    assert ENV_SECRET not in dialog.list.item(0).toolTip()
    # Saving while masked keeps the values.
    assert dialog.save()
    assert env_of(store, "demo") == {"DEMO_VALUE": ENV_SECRET, "EMPTY": ""}

    dialog.show_env.setChecked(True)
    assert dialog.env.toPlainText() == f"DEMO_VALUE={ENV_SECRET}\nEMPTY="
    assert not dialog.env.isReadOnly()
    dialog.env.setPlainText("DEMO_VALUE=changed-value\n")
    dialog.show_env.setChecked(False)
    assert dialog.env.toPlainText() == f"DEMO_VALUE={ENV_MASK}"
    assert run_test(qtbot, dialog)[0]  # the test runs with the values behind the mask
    assert dialog.save()
    assert env_of(store, "demo") == {"DEMO_VALUE": "changed-value"}

    # A line that does not parse: named by number, its text (perhaps a secret) not repeated,
    # and it stays in view to be fixed.
    dialog.show_env.setChecked(True)
    dialog.env.setPlainText(f"DEMO_VALUE=x\n{ENV_SECRET}")
    assert not dialog.save()
    assert dialog.status.text() == CROSS + "environment line 2: expected NAME=VALUE"
    dialog.show_env.setChecked(False)
    assert dialog.show_env.isChecked() and ENV_SECRET in dialog.env.toPlainText()
    dialog.env.setPlainText("1BAD=x")
    assert not dialog.save()
    assert dialog.status.text() == CROSS + "demo: '1BAD' is not an environment variable name"

    # Another server shown, then this one again: masked again.
    dialog.new_server()
    assert dialog.env.toPlainText() == "" and not dialog.show_env.isChecked()
    dialog.list.setCurrentRow(0)
    assert dialog.env.toPlainText() == f"DEMO_VALUE={ENV_MASK}"


def test_store_errors_show_one_line_and_keep_the_form(
    qtbot: QtBot,
    open_dialog: Callable[[], McpServersDialog],
    store: McpConfigStore,
    keyring_backend: MemoryKeyring,
) -> None:
    store.add(McpServer("demo", StdioTransport(sys.executable, (str(DEMO),))))
    dialog = open_dialog()
    # A token refused: the server is saved, the token stays in the field to be fixed.
    dialog.new_server()
    dialog.name.setText("web")
    dialog.transport.setCurrentIndex(dialog.transport.findData("http"))
    dialog.url.setText("http://127.0.0.1:9/mcp")
    dialog.token.setText("two words")
    assert not dialog.save()
    assert dialog.status.text() == (
        CROSS + "Saved web, but not its token: that does not "
        "look like a bearer token (it has spaces or is too long)"
    )
    assert dialog.names() == ["demo", "web"] and dialog.token.text() == "two words"
    dialog.token.setText(TOKEN)
    assert dialog.save()
    assert keyring_backend.store == {(SERVICE, "mcp:web"): TOKEN}
    # Turned into a stdio server: the token is not left behind.
    dialog.transport.setCurrentIndex(dialog.transport.findData("stdio"))
    dialog.command.setText("python3")
    assert dialog.save()
    assert not keyring_backend.store
    dialog.remove_button.click()
    fill_stdio(qtbot, dialog, "demo", "python3", "-m my_server")
    assert not dialog.save()
    assert dialog.status.text() == CROSS + "an MCP server named 'demo' exists already"
    assert (dialog.name.text(), dialog.command.text(), dialog.arguments.text()) == (
        "demo",
        "python3",
        "-m my_server",
    )

    # A file from a newer Candlewick is never overwritten; the form keeps what was typed.
    newer = '{"version": 99, "servers": []}\n'
    store.path.write_text(newer)
    dialog.name.setText("other")
    assert not dialog.save()
    line = dialog.status.text()
    assert line.startswith(CROSS) and "newer Candlewick" in line and "\n" not in line
    assert (dialog.name.text(), dialog.command.text()) == ("other", "python3")
    assert store.path.read_text() == newer
    # The list and the allow checkboxes report the same way.
    dialog.list.item(0).setCheckState(Qt.CheckState.Unchecked)
    assert dialog.list.item(0).checkState() == Qt.CheckState.Checked
    assert "newer Candlewick" in dialog.status.text()
    fresh = open_dialog()  # and a fresh dialog opens, saying why
    assert fresh.names() == [] and "newer Candlewick" in fresh.status.text()


@pytest.mark.qt_log_ignore(
    "This plugin does not support propagateSizeHints", "This plugin does not support raise"
)
def test_the_tools_menu_opens_the_dialog_on_the_apps_config(qtbot: QtBot) -> None:
    from PySide6.QtCore import QEvent

    from app.main import build_window
    from app.services.paths import AppPaths

    w = build_window()
    try:
        action = next(a for a in w.actions() if a.text() == "MCP servers…")
        action.trigger()
        dialog = w.findChild(McpServersDialog)
        assert dialog is not None and dialog.isVisible()
        assert dialog.store.path == AppPaths.default().config / "mcp_servers.json"
        assert dialog.names() == []  # a fresh profile has none
    finally:
        w.close()
        w.shutdown()
        w.deleteLater()
        QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
