"""MCP server settings: a JSON file without tokens, tokens in the keyring, and an import of the
`mcpServers` JSON other apps use."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from app.services.mcp_config import (
    FILE_NAME,
    HttpTransport,
    McpConfigError,
    McpConfigStore,
    McpServer,
    StdioTransport,
)
from app.services.paths import AppPaths
from app.services.secrets import SERVICE, SecretStore
from tests.app.services.file_keyring import FileKeyring

TOKEN = "tok-TOPSECRET-7731"
ENV_SECRET = "env-TOPSECRET-1234"

FILES = McpServer(
    "files",
    StdioTransport(
        "npx", ("-y", "@mcp/files", "/home/me"), env={"API_KEY": ENV_SECRET}, cwd="/tmp"
    ),
    always_allow=frozenset({"read_file"}),
)
WEB = McpServer("web", HttpTransport("https://mcp.example.com/mcp"), enabled=False)


@pytest.fixture
def keyring_file(tmp_path: Path) -> Path:
    path = tmp_path / "outside-the-app" / "keyring.json"
    path.parent.mkdir()
    return path


@pytest.fixture
def store(keyring_file: Path) -> McpConfigStore:
    return McpConfigStore(secrets=SecretStore(FileKeyring(keyring_file)))


def files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def one_line(e: BaseException) -> str:
    text = str(e)
    assert text and "\n" not in text
    return text


def test_round_trip_in_the_config_folder(store: McpConfigStore) -> None:
    assert store.path == AppPaths.default().config / FILE_NAME
    assert store.servers() == []
    store.add(FILES)
    saved = store.add(WEB, token=TOKEN)
    assert saved is not None and saved.persisted
    assert store.servers() == [FILES, WEB]
    fresh = McpConfigStore(secrets=store.secrets)  # another session
    assert fresh.servers() == [FILES, WEB] and fresh.token("web") == TOKEN
    data = json.loads(store.path.read_text())
    assert data["version"] == 1
    assert data["servers"][0] == {
        "name": "files",
        "enabled": True,
        "transport": "stdio",
        "command": "npx",
        "args": ["-y", "@mcp/files", "/home/me"],
        "env": {"API_KEY": ENV_SECRET},
        "cwd": "/tmp",
        "always_allow": ["read_file"],
    }
    assert data["servers"][1]["url"] == "https://mcp.example.com/mcp"
    if os.name == "posix":
        assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert not list(store.path.parent.glob("*.part"))


def test_the_token_goes_to_the_keyring_and_moves_with_a_rename(
    store: McpConfigStore, candlewick_home: Path, keyring_file: Path
) -> None:
    store.add(WEB, token=TOKEN)
    assert files_containing(candlewick_home, "TOPSECRET") == []
    assert json.loads(keyring_file.read_text()) == {f"{SERVICE}/mcp:web": TOKEN}
    store.update("web", McpServer("remote", WEB.transport))
    assert store.token("remote") == TOKEN and store.token("web") is None
    store.remove("remote")
    assert store.token("remote") is None and store.servers() == []
    with pytest.raises(McpConfigError, match="bearer token"):
        store.set_token("remote", "has spaces in it")


def test_enable_and_always_allow_are_saved(store: McpConfigStore) -> None:
    store.save([FILES, WEB])
    store.set_enabled("web", True)
    store.set_always_allow("files", "write_file", True)
    store.set_always_allow("files", "read_file", False)
    assert store.get("web").enabled
    assert store.get("files").always_allow == {"write_file"}
    with pytest.raises(McpConfigError, match="no MCP server named 'nope'"):
        store.get("nope")


@pytest.mark.parametrize(
    ("server", "message"),
    [
        (McpServer("", StdioTransport("x")), "needs a name"),
        (McpServer(" padded", StdioTransport("x")), "bad server name"),
        (McpServer("x" * 65, StdioTransport("x")), "bad server name"),
        (McpServer("s", StdioTransport("  ")), "the command is empty"),
        (McpServer("s", StdioTransport("x", env={"NOT A NAME": "v"})), "environment variable"),
        (McpServer("s", HttpTransport("ftp://example.com")), "not an http:// or https:// URL"),
        (McpServer("s", HttpTransport("localhost:3000/mcp")), "not an http:// or https:// URL"),
        (McpServer("s", HttpTransport("https://")), "not an http:// or https:// URL"),
    ],
)
def test_bad_settings_are_refused(store: McpConfigStore, server: McpServer, message: str) -> None:
    with pytest.raises(McpConfigError, match=message) as info:
        store.add(server)
    one_line(info.value)
    assert not store.path.exists()


def test_names_are_unique_ignoring_case(store: McpConfigStore) -> None:
    store.add(FILES)
    with pytest.raises(McpConfigError, match="exists already"):
        store.add(McpServer("FILES", StdioTransport("other")))
    with pytest.raises(McpConfigError, match="two servers"):
        store.save([FILES, McpServer("Files", StdioTransport("other"))])


@pytest.mark.parametrize(
    "content",
    [
        b'{"version": 1, "servers": [{"name": "a", "transport": "stdio", "comm',  # half-written
        b"not json at all",
        b'{"version": 1, "servers": [{"name": "a", "transport": "sse", "url": "http://x"}]}',
        b'{"version": 1, "servers": [{"name": "a", "transport": "stdio", "command": ""}]}',
        b'{"version": 1, "servers": {"a": 1}}',
        b"\xff\xfe garbage",
    ],
)
def test_a_malformed_file_is_reported_and_kept(store: McpConfigStore, content: bytes) -> None:
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_bytes(content)
    with pytest.raises(McpConfigError) as info:
        store.servers()
    text = one_line(info.value)
    assert "mcp_servers.json.bad" in text
    bad = store.path.with_name(FILE_NAME + ".bad")
    assert bad.read_bytes() == content and not store.path.exists()
    assert store.servers() == []
    store.add(FILES)  # a fresh start
    assert store.servers() == [FILES] and bad.read_bytes() == content
    # A second bad file does not replace the first.
    store.path.write_bytes(b"{")
    with pytest.raises(McpConfigError, match=r"\.bad2"):
        store.servers()
    assert bad.read_bytes() == content


def test_a_newer_file_is_left_alone_and_never_overwritten(store: McpConfigStore) -> None:
    store.path.parent.mkdir(parents=True, exist_ok=True)
    content = b'{"version": 9, "servers": [{"name": "future", "transport": "quantum"}]}'
    store.path.write_bytes(content)
    with pytest.raises(McpConfigError, match="newer Candlewick"):
        store.servers()
    with pytest.raises(McpConfigError, match="not overwritten"):
        store.save([FILES])
    assert store.path.read_bytes() == content


def test_import_of_mcp_servers_json(store: McpConfigStore, candlewick_home: Path) -> None:
    store.add(McpServer("taken", StdioTransport("x")))
    report = store.import_mcp_servers(
        json.dumps(
            {
                "mcpServers": {
                    "files": {
                        "command": "npx",
                        "args": ["-y", "@mcp/files"],
                        "env": {"API_KEY": ENV_SECRET},
                    },
                    "remote": {
                        "url": "https://mcp.example.com/mcp",
                        "headers": {"Authorization": f"Bearer {TOKEN}", "X-Team": "blue"},
                    },
                    "plain": {"type": "http", "url": "http://127.0.0.1:3000/mcp", "disabled": True},
                    "old": {"type": "sse", "url": "https://old.example.com/sse"},
                    "weird": {"args": ["x"]},
                    "taken": {"command": "y"},
                    "badurl": {"url": "file:///etc/passwd"},
                    "notobj": [1, 2],
                }
            }
        )
    )
    assert report.added == ["files", "remote", "plain"]
    assert report.problems == [
        "remote: header 'X-Team' was not imported (only an Authorization: Bearer token is "
        "supported)",
        "old: not imported: SSE servers are not supported (only Streamable HTTP)",
        "weird: not imported: the entry has neither a command nor a url",
        "taken: not imported: a server with that name exists already",
        "badurl: not imported: badurl: 'file:///etc/passwd' is not an http:// or https:// URL",
        "notobj: not imported: the entry is not an object",
    ]
    servers = {s.name: s for s in store.servers()}
    assert servers["files"].transport == StdioTransport(
        "npx", ("-y", "@mcp/files"), env={"API_KEY": ENV_SECRET}
    )
    assert servers["remote"].transport == HttpTransport("https://mcp.example.com/mcp")
    assert not servers["plain"].enabled
    assert store.token("remote") == TOKEN
    assert files_containing(candlewick_home, TOKEN) == []


def test_import_of_something_else_fails_in_one_line(store: McpConfigStore) -> None:
    for source in ("{not json", "[1]", '{"mcpServers": 3}'):
        with pytest.raises(McpConfigError) as info:
            store.import_mcp_servers(source)
        one_line(info.value)
    assert not store.path.exists()


def test_describe_and_redacted_mask_the_secrets() -> None:
    server = McpServer(
        "tools",
        StdioTransport(
            sys.executable,
            ("server.py", "--api-key", "ARG-SECRET", "--token=ARG-SECRET2", "-v"),
            env={"API_KEY": ENV_SECRET},
        ),
    )
    line = server.describe()
    assert line == (
        f"tools (stdio): {sys.executable} server.py --api-key *** --token=*** -v env API_KEY=***"
    )
    redacted = json.dumps(server.redacted())
    for text in (line, redacted, repr(server)):
        assert "SECRET" not in text
    assert json.loads(redacted)["env"] == {"API_KEY": "***"}
    assert WEB.describe(has_token=True) == (
        "web (http): https://mcp.example.com/mcp with bearer token *** [disabled]"
    )
    assert WEB.redacted(has_token=True)["token"] == "***"
    assert hash(server) == hash(server)  # usable in sets despite the env dict
