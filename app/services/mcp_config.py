"""The MCP servers a person has set up: `mcp_servers.json` in the config folder.

A server runs as a local command (stdio) or is reached over Streamable HTTP. An HTTP server's
bearer token never goes to the file: it lives in the keyring (`SecretStore`, account
"mcp:<name>"). Environment values of stdio servers are in the file (they are part of the
command, as in Claude Desktop's config) but are treated as secrets everywhere else: never
logged, masked by `describe()` and `redacted()`. The file is written atomically and readable by
its owner only.

A file that cannot be parsed is moved aside to `mcp_servers.json.bad` and reported in one line
(`McpConfigError`); a file written by a newer Candlewick, or one that cannot be read, is left
where it is and never overwritten.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from app.services.atomic_write import write_text_atomic
from app.services.paths import AppPaths
from app.services.secrets import SaveResult, SecretStore

FILE_NAME = "mcp_servers.json"
FORMAT_VERSION = 1
MASK = "***"
_MAX_NAME = 64
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Arguments after (or joined to) a flag with one of these words carry a secret: `--api-key X`.
_SECRET_FLAG = re.compile(r"^--?[\w-]*(token|key|secret|password|passwd|auth)[\w-]*$", re.I)


class McpConfigError(ValueError):
    """Bad MCP server settings or an unusable config file; `str()` is one line."""


class _NewerFileError(McpConfigError):
    pass


@dataclass(frozen=True)
class StdioTransport:
    """A local server: a command whose stdin/stdout carry the protocol."""

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    cwd: str | None = None

    kind: ClassVar[Literal["stdio"]] = "stdio"

    def __repr__(self) -> str:
        # A repr can land in a log or a traceback: no env values, no secret arguments.
        env = dict.fromkeys(self.env, MASK)
        return (
            f"StdioTransport(command={self.command!r}, args={tuple(_mask_args(self.args))!r}"
            f", env={env!r}, cwd={self.cwd!r})"
        )


@dataclass(frozen=True)
class HttpTransport:
    """A server reached over Streamable HTTP; its bearer token is in the keyring."""

    url: str

    kind: ClassVar[Literal["http"]] = "http"


Transport = StdioTransport | HttpTransport


@dataclass(frozen=True)
class McpServer:
    name: str
    transport: Transport
    enabled: bool = True
    # Tools the person allowed to run without asking each time.
    always_allow: frozenset[str] = frozenset()

    def validate(self) -> None:
        _check_name(self.name)
        t = self.transport
        if isinstance(t, StdioTransport):
            if not isinstance(t.command, str) or not t.command.strip():
                raise McpConfigError(f"{self.name}: the command is empty")
            if any("\0" in s for s in (t.command, *t.args, *t.env.values())):
                raise McpConfigError(f"{self.name}: the command line contains a NUL character")
            bad = [k for k in t.env if not _ENV_NAME.match(k)]
            if bad:
                raise McpConfigError(f"{self.name}: {bad[0]!r} is not an environment variable name")
            if t.cwd is not None and not t.cwd.strip():
                raise McpConfigError(f"{self.name}: the working folder is empty")
        else:
            check_url(t.url, self.name)

    def describe(self, *, has_token: bool = False) -> str:
        """One line for display or a log, with env values, secret arguments and the token
        masked."""
        t = self.transport
        if isinstance(t, StdioTransport):
            line = f"{self.name} (stdio): " + " ".join([t.command, *_mask_args(t.args)])
            if t.env:
                line += " env " + ", ".join(f"{k}={MASK}" for k in t.env)
            if t.cwd:
                line += f" in {t.cwd}"
        else:
            line = f"{self.name} (http): {t.url}"
            if has_token:
                line += f" with bearer token {MASK}"
        return line if self.enabled else line + " [disabled]"

    def redacted(self, *, has_token: bool = False) -> dict[str, Any]:
        """The server as its JSON, with every secret replaced by "***"."""
        data = self.to_json()
        if isinstance(self.transport, StdioTransport):
            data["args"] = _mask_args(self.transport.args)
            data["env"] = dict.fromkeys(self.transport.env, MASK)
        elif has_token:
            data["token"] = MASK
        return data

    def to_json(self) -> dict[str, Any]:
        t = self.transport
        data: dict[str, Any] = {"name": self.name, "enabled": self.enabled, "transport": t.kind}
        if isinstance(t, StdioTransport):
            data.update(command=t.command, args=list(t.args), env=dict(t.env))
            if t.cwd is not None:
                data["cwd"] = t.cwd
        else:
            data["url"] = t.url
        data["always_allow"] = sorted(self.always_allow)
        return data

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> McpServer:
        name = obj.get("name")
        if not isinstance(name, str):
            raise McpConfigError("a server entry has no name")
        kind = obj.get("transport")
        common = {"name", "enabled", "transport", "always_allow"}
        fields = common | ({"command", "args", "env", "cwd"} if kind == "stdio" else {"url"})
        unknown = set(obj) - fields
        if unknown:
            raise McpConfigError(f"{name}: unknown field(s) {', '.join(sorted(unknown))}")
        transport: Transport
        if kind == "stdio":
            transport = StdioTransport(
                command=_text(obj.get("command"), name, "command"),
                args=tuple(_text_list(obj.get("args", []), name, "args")),
                env=_text_map(obj.get("env", {}), name, "env"),
                cwd=None if obj.get("cwd") is None else _text(obj["cwd"], name, "cwd"),
            )
        elif kind == "http":
            transport = HttpTransport(url=_text(obj.get("url"), name, "url"))
        else:
            raise McpConfigError(f'{name}: transport must be "stdio" or "http", not {kind!r}')
        enabled = obj.get("enabled", True)
        if not isinstance(enabled, bool):
            raise McpConfigError(f"{name}: enabled must be true or false")
        allow = frozenset(_text_list(obj.get("always_allow", []), name, "always_allow"))
        server = cls(name, transport, enabled, allow)
        server.validate()
        return server


def account(name: str) -> str:
    """The keyring account of a server's bearer token."""
    return f"mcp:{name}"


def check_url(url: str, name: str = "server") -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise McpConfigError(f"{name}: {url!r} is not an http:// or https:// URL")


@dataclass(frozen=True)
class ImportReport:
    added: list[str]
    problems: list[str]  # one line per entry that was not imported (or only in part)


class McpConfigStore:
    """The configured MCP servers. `path`: the JSON file (default: the app's config folder);
    `secrets`: where bearer tokens go (default: the system keyring)."""

    def __init__(self, path: Path | None = None, secrets: SecretStore | None = None) -> None:
        self.path = path or AppPaths.default().config / FILE_NAME
        self.secrets = secrets or SecretStore()

    # -- reading -----------------------------------------------------------------------------

    def servers(self) -> list[McpServer]:
        """The servers in the file ([] when there is none). A file that does not parse is moved
        to `<file>.bad` and reported as `McpConfigError`; the next call then returns []."""
        raw = self._read()
        if raw is None:
            return []
        try:
            return self._parse(raw)
        except _NewerFileError as e:
            raise McpConfigError(str(e)) from None  # not ours to move aside
        except McpConfigError as e:
            kept = self._move_aside()
            raise McpConfigError(
                f"{self.path.name} was not usable ({e}); it was moved to "
                f"{kept.name} and no MCP servers are set up"
            ) from None

    def get(self, name: str) -> McpServer:
        for s in self.servers():
            if s.name == name:
                return s
        raise McpConfigError(f"no MCP server named {name!r}")

    def token(self, name: str) -> str | None:
        return self.secrets.get(account(name))

    # -- writing -----------------------------------------------------------------------------

    def save(self, servers: Sequence[McpServer]) -> None:
        """Replace the whole list (validated: names must be unique)."""
        for s in servers:
            s.validate()
        seen: set[str] = set()
        for s in servers:
            if s.name.casefold() in seen:
                raise McpConfigError(f"two servers are named {s.name!r}")
            seen.add(s.name.casefold())
        self._guard_overwrite()
        data = {"version": FORMAT_VERSION, "servers": [s.to_json() for s in servers]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, json.dumps(data, indent=2) + "\n")
        # Env values are secrets: keep the file to its owner (a no-op on Windows).
        with contextlib.suppress(OSError):
            os.chmod(self.path, 0o600)

    def add(self, server: McpServer, token: str | None = None) -> SaveResult | None:
        """Add a server (and its bearer token, if given). Returns where the token went."""
        items = self.servers()
        if any(s.name.casefold() == server.name.casefold() for s in items):
            raise McpConfigError(f"an MCP server named {server.name!r} exists already")
        self.save([*items, server])
        return self.set_token(server.name, token) if token else None

    def update(self, old_name: str, server: McpServer) -> None:
        """Replace a server, possibly renamed; its token moves with it."""
        items = self.servers()
        if not any(s.name == old_name for s in items):
            raise McpConfigError(f"no MCP server named {old_name!r}")
        self.save([server if s.name == old_name else s for s in items])
        if server.name != old_name:
            token = self.token(old_name)
            if token:
                self.secrets.set(account(server.name), token)
            self.secrets.delete(account(old_name))

    def remove(self, name: str) -> None:
        items = self.servers()
        if not any(s.name == name for s in items):
            raise McpConfigError(f"no MCP server named {name!r}")
        self.save([s for s in items if s.name != name])
        self.secrets.delete(account(name))

    def set_enabled(self, name: str, enabled: bool) -> None:
        self.update(name, replace(self.get(name), enabled=enabled))

    def set_always_allow(self, name: str, tool: str, allowed: bool) -> None:
        s = self.get(name)
        allow = s.always_allow | {tool} if allowed else s.always_allow - {tool}
        self.update(name, replace(s, always_allow=frozenset(allow)))

    def set_token(self, name: str, token: str | None) -> SaveResult:
        """Store (or with None/"" remove) an HTTP server's bearer token, in the keyring."""
        token = (token or "").strip()
        if not token:
            self.secrets.delete(account(name))
            return SaveResult(False, "token removed")
        if any(c.isspace() for c in token) or len(token) > 8192:
            raise McpConfigError(
                "that does not look like a bearer token (it has spaces or is too long)"
            )
        saved = self.secrets.set(account(name), token)
        return SaveResult(saved.persisted, f"token {saved.message}")

    # -- import ------------------------------------------------------------------------------

    def import_mcp_servers(self, source: str | Mapping[str, Any]) -> ImportReport:
        """Add the servers of a Claude Desktop / LM Studio / Cursor `mcp.json`
        (`{"mcpServers": {name: {...}}}`; VS Code's `{"servers": ...}` too). A bearer token in
        an Authorization header goes to the keyring. An entry that cannot be imported is
        reported in one line and skipped; the others are added."""
        if isinstance(source, str):
            try:
                source = json.loads(source)
            except json.JSONDecodeError as e:
                raise McpConfigError(
                    f"not valid JSON (line {e.lineno}, column {e.colno})"
                ) from None
        if not isinstance(source, Mapping):
            raise McpConfigError('expected {"mcpServers": {...}}')
        entries = source.get("mcpServers", source.get("servers"))
        if not isinstance(entries, Mapping):
            raise McpConfigError('expected {"mcpServers": {...}}')
        items = self.servers()
        taken = {s.name.casefold() for s in items}
        added: list[tuple[McpServer, str | None]] = []
        problems: list[str] = []
        for name, entry in entries.items():
            try:
                server, token, notes = _from_mcp_servers_entry(str(name), entry)
            except McpConfigError as e:
                problems.append(f"{name}: not imported: {e}")
                continue
            if server.name.casefold() in taken:
                problems.append(f"{name}: not imported: a server with that name exists already")
                continue
            taken.add(server.name.casefold())
            added.append((server, token))
            problems.extend(f"{name}: {n}" for n in notes)
        if added:
            self.save([*items, *(s for s, _ in added)])
        for server, token in added:
            if token:
                self.set_token(server.name, token)
        return ImportReport([s.name for s, _ in added], problems)

    # -- the file ----------------------------------------------------------------------------

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise McpConfigError(f"cannot read {self.path}: {e.strerror or e}") from None

    def _parse(self, raw: bytes) -> list[McpServer]:
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise McpConfigError("not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise McpConfigError(f"not valid JSON at line {e.lineno}, column {e.colno}") from None
        if not isinstance(data, dict) or not isinstance(data.get("servers"), list):
            raise McpConfigError('expected {"version": 1, "servers": [...]}')
        version = data.get("version")
        if isinstance(version, int) and version > FORMAT_VERSION:
            raise _NewerFileError(
                f"{self.path} was written by a newer Candlewick (format "
                f"{version}); update Candlewick to use it"
            )
        out: list[McpServer] = []
        for item in data["servers"]:
            if not isinstance(item, dict):
                raise McpConfigError("a server entry is not an object")
            out.append(McpServer.from_json(item))
        names = [s.name.casefold() for s in out]
        if len(set(names)) != len(names):
            raise McpConfigError("two servers have the same name")
        return out

    def _guard_overwrite(self) -> None:
        """Refuse to replace a file this version cannot read (see `servers`)."""
        raw = self._read()
        if raw is not None:
            try:
                self._parse(raw)
            except McpConfigError as e:
                raise McpConfigError(
                    f"{self.path.name} is not usable, so it was not overwritten: {e}"
                ) from None

    def _move_aside(self) -> Path:
        for i in range(1, 1000):
            kept = self.path.with_name(self.path.name + (".bad" if i == 1 else f".bad{i}"))
            if not kept.exists():
                break
        os.replace(self.path, kept)
        return kept


def _from_mcp_servers_entry(name: str, entry: Any) -> tuple[McpServer, str | None, list[str]]:
    """One entry of an `mcpServers` map: the server, its bearer token, and notes on what was
    left out."""
    if not isinstance(entry, Mapping):
        raise McpConfigError("the entry is not an object")
    kind = entry.get("type")
    notes: list[str] = []
    token: str | None = None
    transport: Transport
    if "command" in entry:
        transport = StdioTransport(
            command=_text(entry["command"], name, "command"),
            args=tuple(_text_list(entry.get("args", []), name, "args")),
            env=_text_map(entry.get("env") or {}, name, "env"),
            cwd=None if entry.get("cwd") is None else _text(entry["cwd"], name, "cwd"),
        )
    elif "url" in entry or "serverUrl" in entry:
        if kind == "sse":
            raise McpConfigError("SSE servers are not supported (only Streamable HTTP)")
        transport = HttpTransport(_text(entry.get("url", entry.get("serverUrl")), name, "url"))
        headers = entry.get("headers") or {}
        if not isinstance(headers, Mapping):
            raise McpConfigError("headers must be an object")
        for key, value in headers.items():
            if (
                str(key).lower() == "authorization"
                and isinstance(value, str)
                and value.lower().startswith("bearer ")
            ):
                token = value[len("bearer ") :].strip() or None
            else:
                notes.append(
                    f"header {key!r} was not imported (only an Authorization: "
                    "Bearer token is supported)"
                )
    else:
        raise McpConfigError("the entry has neither a command nor a url")
    enabled = not bool(entry.get("disabled", False))
    server = McpServer(name.strip(), transport, enabled)
    server.validate()
    return server, token, notes


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise McpConfigError("an MCP server needs a name")
    if name != name.strip() or len(name) > _MAX_NAME or any(not c.isprintable() for c in name):
        raise McpConfigError(
            f"bad server name {name!r}: up to {_MAX_NAME} printable "
            "characters, no leading or trailing spaces"
        )


def _mask_args(args: Iterable[str]) -> list[str]:
    out: list[str] = []
    secret_next = False
    for a in args:
        flag, eq, _ = a.partition("=")
        if secret_next:
            out.append(MASK)
        elif eq and _SECRET_FLAG.match(flag):
            out.append(f"{flag}={MASK}")
        else:
            out.append(a)
        secret_next = not eq and bool(_SECRET_FLAG.match(a))
    return out


def _text(value: Any, name: str, key: str) -> str:
    if not isinstance(value, str):
        raise McpConfigError(f"{name}: {key} must be text")
    return value


def _text_list(value: Any, name: str, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise McpConfigError(f"{name}: {key} must be a list of text")
    return list(value)


def _text_map(value: Any, name: str, key: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise McpConfigError(f"{name}: {key} must map names to text")
    return dict(value)


__all__ = [
    "FILE_NAME",
    "HttpTransport",
    "ImportReport",
    "McpConfigError",
    "McpConfigStore",
    "McpServer",
    "StdioTransport",
    "Transport",
    "account",
    "check_url",
]
