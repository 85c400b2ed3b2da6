"""The MCP client (McpHub) against real servers: the demo server as a stdio subprocess and as a
Streamable HTTP server, both on the official SDK."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services.mcp_client import (
    THREAD_NAME,
    McpClientError,
    McpHub,
    ToolCancelledError,
    ToolServerError,
    ToolTimeoutError,
)
from app.services.mcp_config import HttpTransport, McpServer, StdioTransport
from app.services.secrets import SecretStore
from tests.memory_keyring import MemoryKeyring

# Real server processes, started and crashed on purpose: 1-5 s a test.
pytestmark = pytest.mark.slow

DEMO = Path(__file__).resolve().parents[2] / "mcp_servers" / "demo_server.py"
TOKEN = "tok-SECRET-8842"
ENV_SECRET = "env-SECRET-5150"


def demo(name: str = "demo", **env: str) -> McpServer:
    return McpServer(name, StdioTransport(sys.executable, (str(DEMO),), env=env))


def one_line(e: BaseException) -> str:
    text = str(e)
    assert text and "\n" not in text and "Traceback" not in text
    return text


@pytest.fixture
def secrets() -> SecretStore:
    return SecretStore(MemoryKeyring())


@pytest.fixture
def hub(secrets: SecretStore) -> Iterator[McpHub]:
    h = McpHub([demo()], secrets=secrets)
    yield h
    h.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_http_server(token: str, port: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """The demo server over Streamable HTTP (on `port`, or a free one), once it accepts."""
    port = port or free_port()
    proc = subprocess.Popen(
        [sys.executable, str(DEMO), "--http", str(port), "--token", token],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    end = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > end:
                proc.kill()
                proc.wait()
                raise RuntimeError("the demo HTTP server did not start") from None
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/mcp"


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    proc, url = start_http_server(TOKEN)
    yield url
    stop_process(proc)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- stdio ---------------------------------------------------------------------------------------


def test_lists_tools_and_calls_one(hub: McpHub) -> None:
    tools = {t.name: t for t in hub.list_tools("demo")}
    assert {"add", "read_note", "slow", "huge", "fail", "crash"} <= set(tools)
    assert tools["add"].description == "Add two integers."
    assert set(tools["add"].input_schema["properties"]) == {"a", "b"}
    assert any(t.name == THREAD_NAME and t.daemon for t in threading.enumerate())
    result = hub.call_tool("demo", "add", {"a": 2, "b": 40})
    assert (result.text, result.is_error, result.truncated) == ("42", False, False)
    assert result.duration_s > 0
    assert "remember the milk" in hub.call_tool("demo", "read_note", {"name": "x"}).text
    assert hub.is_running("demo")


def test_env_and_working_folder_reach_the_server(secrets: SecretStore, tmp_path: Path) -> None:
    server = McpServer(
        "demo",
        StdioTransport(
            sys.executable, (str(DEMO),), env={"DEMO_VALUE": "hello"}, cwd=str(tmp_path)
        ),
    )
    with McpHub([server], secrets=secrets) as hub:
        assert hub.call_tool("demo", "env_value", {"name": "DEMO_VALUE"}).text == "hello"
        assert Path(hub.call_tool("demo", "cwd").text) == tmp_path


def test_progress_arrives_on_the_calling_thread(hub: McpHub) -> None:
    seen: list[tuple[float, float | None, str | None, int]] = []
    result = hub.call_tool(
        "demo",
        "slow",
        {"seconds": 0.3},
        on_progress=lambda p, t, m: seen.append((p, t, m, threading.get_ident())),
    )
    assert result.text == "slept 0.3 s"
    assert [(p, t, m) for p, t, m, _ in seen] == [
        (0, 3, "step 1 of 3"),
        (1, 3, "step 2 of 3"),
        (2, 3, "step 3 of 3"),
    ]
    assert {ident for *_, ident in seen} == {threading.get_ident()}


def test_cancel_stops_a_slow_call_promptly_and_the_session_stays(hub: McpHub) -> None:
    pid = int(hub.call_tool("demo", "pid").text)
    cancel = threading.Event()
    set_at: list[float] = []

    def on_progress(p: float, total: float | None, message: str | None) -> None:
        if not cancel.is_set():
            set_at.append(time.monotonic())
            cancel.set()

    with pytest.raises(ToolCancelledError) as info:
        hub.call_tool("demo", "slow", {"seconds": 30}, on_progress=on_progress, cancel=cancel)
    # Far less than the 30 s the tool would run (the bound is loose: machines are noisy).
    assert time.monotonic() - set_at[0] < 2.0
    assert "cancelled" in one_line(info.value)
    assert hub.call_tool("demo", "add", {"a": 1, "b": 1}).text == "2"
    assert int(hub.call_tool("demo", "pid").text) == pid


def test_a_call_past_its_timeout_raises_and_the_session_stays(hub: McpHub) -> None:
    pid = int(hub.call_tool("demo", "pid").text)
    start = time.monotonic()
    with pytest.raises(ToolTimeoutError) as info:
        hub.call_tool("demo", "slow", {"seconds": 30}, timeout_s=0.5)
    assert time.monotonic() - start < 3.0
    assert "timed out after 0.5 s" in one_line(info.value)
    assert hub.call_tool("demo", "add", {"a": 1, "b": 2}).text == "3"
    assert int(hub.call_tool("demo", "pid").text) == pid


def test_a_huge_result_is_truncated_with_a_note(hub: McpHub) -> None:
    result = hub.call_tool("demo", "huge", {"kb": 200})
    assert result.truncated and not result.is_error
    full = "0123456789abcde\n" * 64 * 200
    assert result.text == (
        full[: 64 * 1024] + "\n[result truncated: 200 KB, showing the first 64 KB]"
    )
    small = hub.call_tool("demo", "huge", {"kb": 4}, max_result_bytes=1024)
    assert small.truncated and small.text.endswith("showing the first 1 KB]")
    assert not hub.call_tool("demo", "huge", {"kb": 8}).truncated


def test_a_failing_tool_gives_an_error_result(hub: McpHub) -> None:
    result = hub.call_tool("demo", "fail")
    assert result.is_error and "the tool failed on purpose" in result.text
    unknown = hub.call_tool("demo", "no_such_tool")
    assert unknown.is_error and "no_such_tool" in unknown.text


def test_non_text_content_is_described_in_one_line(hub: McpHub) -> None:
    assert hub.call_tool("demo", "picture").text == "[image, 70 bytes]"


def test_a_crashed_server_fails_the_call_then_restarts(hub: McpHub) -> None:
    pid = int(hub.call_tool("demo", "pid").text)
    with pytest.raises(ToolServerError) as info:
        hub.call_tool("demo", "crash")
    assert one_line(info.value).startswith("MCP server 'demo' stopped: the server process exited")
    assert not hub.is_running("demo")
    assert hub.call_tool("demo", "add", {"a": 5, "b": 5}).text == "10"
    new_pid = int(hub.call_tool("demo", "pid").text)
    assert new_pid != pid and not alive(pid)


def test_a_server_that_died_while_idle_is_restarted_on_next_use(hub: McpHub) -> None:
    pid = int(hub.call_tool("demo", "pid").text)
    os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + 10
    while hub.is_running("demo"):  # the hub sees the end of the transport by itself
        assert time.monotonic() < end
        time.sleep(0.02)
    assert hub.call_tool("demo", "add", {"a": 1, "b": 2}).text == "3"
    assert int(hub.call_tool("demo", "pid").text) != pid


def test_a_missing_command_is_one_line(secrets: SecretStore, tmp_path: Path) -> None:
    servers = [
        McpServer("ghost", StdioTransport("candlewick-no-such-command", ("--x",))),
        McpServer(
            "nowhere", StdioTransport(sys.executable, (str(DEMO),), cwd=str(tmp_path / "missing"))
        ),
    ]
    with McpHub(servers, secrets=secrets) as hub:
        with pytest.raises(ToolServerError) as info:
            hub.list_tools("ghost")
        assert one_line(info.value) == (
            "MCP server 'ghost' could not start: command not found: candlewick-no-such-command"
        )
        with pytest.raises(ToolServerError) as info:
            hub.call_tool("nowhere", "add", {"a": 1, "b": 2})
        assert "working folder not found" in one_line(info.value)


def test_a_server_that_exits_at_start_shows_its_last_words_without_secrets(
    secrets: SecretStore,
) -> None:
    script = (
        "import os, sys; sys.stderr.write('starting\\nbad config, key=' + "
        "os.environ['API_KEY'] + '\\n'); sys.exit(2)"
    )
    server = McpServer(
        "broken", StdioTransport(sys.executable, ("-c", script), env={"API_KEY": ENV_SECRET})
    )
    with McpHub([server], secrets=secrets) as hub, pytest.raises(ToolServerError) as info:
        hub.list_tools("broken")
    assert one_line(info.value) == (
        "MCP server 'broken' could not start: the server process exited (bad config, key=***)"
    )


HANG = "import time; time.sleep(60)"  # a command that never speaks MCP


def test_a_server_that_never_answers_times_out_at_start(secrets: SecretStore) -> None:
    server = McpServer("mute", StdioTransport(sys.executable, ("-c", HANG)))
    with (
        McpHub([server], secrets=secrets, start_timeout_s=0.5) as hub,
        pytest.raises(ToolServerError) as info,
    ):
        hub.list_tools("mute")
    assert one_line(info.value) == (
        "MCP server 'mute' could not start: no answer to the MCP handshake within 0.5 s"
    )


def test_close_stops_a_start_that_was_cancelled(secrets: SecretStore) -> None:
    hub = McpHub([McpServer("mute", StdioTransport(sys.executable, ("-c", HANG)))], secrets=secrets)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(ToolCancelledError):
        hub.call_tool("mute", "add", cancel=cancel)
    start = time.monotonic()
    hub.close()
    assert time.monotonic() - start < 8  # not the 30 s start-up timeout


def test_an_error_in_on_progress_stops_the_call(hub: McpHub) -> None:
    def on_progress(p: float, total: float | None, message: str | None) -> None:
        raise ValueError("the callback broke")

    with pytest.raises(ValueError, match="the callback broke"):
        hub.call_tool("demo", "slow", {"seconds": 30}, on_progress=on_progress)
    assert hub.call_tool("demo", "add", {"a": 1, "b": 2}).text == "3"


def test_unknown_disabled_and_closed(secrets: SecretStore) -> None:
    hub = McpHub([McpServer("off", StdioTransport("true"), enabled=False)], secrets=secrets)
    with pytest.raises(McpClientError, match="no MCP server named 'nope'"):
        hub.list_tools("nope")
    with pytest.raises(McpClientError, match="turned off"):
        hub.call_tool("off", "add")
    hub.close()
    hub.close()
    hub.configure([demo()])
    with pytest.raises(McpClientError, match="closed"):
        hub.list_tools("demo")


def test_close_stops_the_servers_and_the_thread(secrets: SecretStore) -> None:
    hub = McpHub([demo("a"), demo("b")], secrets=secrets)
    pids = [int(hub.call_tool(n, "pid").text) for n in ("a", "b")]
    hub.close()
    assert not any(t.name == THREAD_NAME for t in threading.enumerate())
    assert not any(alive(p) for p in pids)


def test_a_changed_server_is_restarted(hub: McpHub) -> None:
    pid = int(hub.call_tool("demo", "pid").text)
    hub.configure([demo(DEMO_VALUE="new")])
    assert hub.call_tool("demo", "env_value", {"name": "DEMO_VALUE"}).text == "new"
    assert int(hub.call_tool("demo", "pid").text) != pid


def test_calls_from_two_threads_at_once(hub: McpHub) -> None:
    results: list[str] = []

    def work() -> None:
        results.append(hub.call_tool("demo", "slow", {"seconds": 0.3}).text)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == ["slept 0.3 s"] * 2


# -- Streamable HTTP -----------------------------------------------------------------------------


def test_http_sends_the_bearer_token_from_the_keyring(http_url: str, secrets: SecretStore) -> None:
    secrets.set("mcp:web", TOKEN)
    with McpHub([McpServer("web", HttpTransport(http_url))], secrets=secrets) as hub:
        assert "add" in {t.name for t in hub.list_tools("web")}
        assert hub.call_tool("web", "add", {"a": 20, "b": 22}).text == "42"
        seen: list[float] = []
        assert (
            hub.call_tool(
                "web", "slow", {"seconds": 0.2}, on_progress=lambda p, t, m: seen.append(p)
            ).text
            == "slept 0.2 s"
        )
        assert seen == [0, 1]
        assert hub.call_tool("web", "huge", {"kb": 100}).truncated


def test_http_with_a_wrong_token_is_one_line_without_the_token(
    http_url: str, secrets: SecretStore
) -> None:
    secrets.set("mcp:web", "wrong-" + TOKEN)
    with McpHub([McpServer("web", HttpTransport(http_url))], secrets=secrets) as hub:
        with pytest.raises(ToolServerError) as info:
            hub.list_tools("web")
        text = one_line(info.value)
        assert "HTTP 401" in text and "token" in text and TOKEN not in text


def test_http_cancel_and_a_server_that_is_not_there(http_url: str, secrets: SecretStore) -> None:
    secrets.set("mcp:web", TOKEN)
    servers = [
        McpServer("web", HttpTransport(http_url)),
        McpServer("gone", HttpTransport(f"http://127.0.0.1:{free_port()}/mcp")),
    ]
    with McpHub(servers, secrets=secrets) as hub:
        cancel = threading.Event()
        with pytest.raises(ToolCancelledError):
            hub.call_tool(
                "web",
                "slow",
                {"seconds": 30},
                cancel=cancel,
                on_progress=lambda p, t, m: cancel.set(),
            )
        assert hub.call_tool("web", "add", {"a": 1, "b": 1}).text == "2"
        with pytest.raises(ToolServerError) as info:
            hub.list_tools("gone")
        assert "cannot connect to http://127.0.0.1:" in one_line(info.value)


def test_http_server_crash_then_back(secrets: SecretStore) -> None:
    proc, url = start_http_server(TOKEN)
    try:
        secrets.set("mcp:web", TOKEN)
        with McpHub([McpServer("web", HttpTransport(url))], secrets=secrets) as hub:
            assert hub.call_tool("web", "add", {"a": 1, "b": 2}).text == "3"
            with pytest.raises(ToolServerError) as info:
                hub.call_tool("web", "crash")
            assert one_line(info.value).startswith("MCP server 'web' stopped")
            proc.wait(10)
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            proc, _ = start_http_server(TOKEN, port)  # the same address, a new process
            assert hub.call_tool("web", "add", {"a": 2, "b": 2}).text == "4"
    finally:
        stop_process(proc)


# -- secrets in logs -----------------------------------------------------------------------------


def test_logs_carry_no_env_values_or_tokens(
    http_url: str, secrets: SecretStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secrets.set("mcp:web", TOKEN)
    servers = [
        demo(API_KEY=ENV_SECRET),
        McpServer("web", HttpTransport(http_url)),
        McpServer(
            "bad",
            StdioTransport(
                sys.executable, ("-c", "raise SystemExit(1)"), env={"API_KEY": ENV_SECRET}
            ),
        ),
    ]
    with McpHub(servers, secrets=secrets) as hub:
        assert hub.call_tool("demo", "env_value", {"name": "API_KEY"}).text == ENV_SECRET
        hub.call_tool("web", "add", {"a": 1, "b": 1})
        with pytest.raises(ToolServerError):
            hub.call_tool("demo", "crash")
        with pytest.raises(ToolServerError):
            hub.list_tools("bad")
    assert "starting MCP server 'demo'" in caplog.text
    assert ENV_SECRET not in caplog.text and TOKEN not in caplog.text
