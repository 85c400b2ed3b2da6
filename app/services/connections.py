"""Remote engine connections: saved in `connections.json` in the config folder, keys elsewhere.

A connection is a name, a server URL, the API dialect (openai | ollama), a default model, TLS
and timeout settings. Its API key is never written to the JSON file: it goes to the system
keyring (`app.services.secrets.SecretStore`, account "connection:<name>"), or, for headless
machines without a keyring, the connection names an environment variable that holds it
(`key_env`).

The file is rewritten atomically (a temporary file in the same folder, then a rename), so a
crash mid-save leaves the old file. A file that cannot be read is reported, never overwritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.services.paths import AppPaths
from app.services.secrets import SaveResult, SecretStore
from engine.remote.engines import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    CheckResult,
    RemoteEndpoint,
    RemoteEngine,
)
from engine.remote.streaming import APIS, Api, ClientError, StreamingClient

FILE_NAME = "connections.json"
FORMAT_VERSION = 1
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConnectionsError(ValueError):
    """Bad connection settings or an unreadable store; `str()` is one line."""


@dataclass(frozen=True)
class Connection:
    """A saved remote endpoint, without its key."""

    name: str
    base_url: str
    api: Api = "openai"
    model: str = ""  # default model; "" = the first the server lists
    verify_tls: bool = True
    ca_file: str | None = None
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    key_env: str | None = None  # an environment variable holding the key, instead of keyring

    def validate(self) -> None:
        name = self.name
        if not name.strip():
            raise ConnectionsError("a connection needs a name")
        if name != name.strip() or len(name) > 64 or any(not c.isprintable() for c in name):
            raise ConnectionsError(
                f"bad connection name {name!r}: up to 64 printable "
                "characters, no leading or trailing spaces"
            )
        if self.api not in APIS:
            raise ConnectionsError(f"unknown API {self.api!r} (choose from {', '.join(APIS)})")
        for label, v in (("connect timeout", self.connect_timeout_s), ("timeout", self.timeout_s)):
            if not isinstance(v, int | float) or isinstance(v, bool) or not 0 < v <= 86400:
                raise ConnectionsError(f"{name}: {label} must be between 0 and 86400 seconds")
        if self.key_env is not None and not _ENV_NAME.match(self.key_env):
            raise ConnectionsError(f"{name}: {self.key_env!r} is not an environment variable name")
        if self.ca_file and not Path(self.ca_file).is_file():
            raise ConnectionsError(f"{name}: CA file not found: {self.ca_file}")
        try:
            StreamingClient(self.base_url, api=self.api, ca_file=self.ca_file or None)
        except ClientError as e:
            raise ConnectionsError(f"{name}: {e}") from None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Connection:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(obj) - fields
        if unknown:
            raise ConnectionsError(f"unknown connection field(s): {', '.join(sorted(unknown))}")
        try:
            conn = cls(**obj)
        except TypeError:
            raise ConnectionsError("a connection needs at least a name and a base_url") from None
        for key in ("name", "base_url", "model"):
            if not isinstance(getattr(conn, key), str):
                raise ConnectionsError(f"connection field {key!r} must be text")
        if not isinstance(conn.verify_tls, bool):
            raise ConnectionsError(f"{conn.name}: verify_tls must be true or false")
        return conn


def _account(name: str) -> str:
    return f"connection:{name}"


class ConnectionStore:
    """The saved connections. `path`: the JSON file (default: the app's config folder);
    `secrets`: where API keys go (default: the system keyring)."""

    def __init__(
        self,
        path: Path | None = None,
        secrets: SecretStore | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.path = path or AppPaths.default().config / FILE_NAME
        self.secrets = secrets or SecretStore()
        self._environ = environ if environ is not None else os.environ

    # -- reading -----------------------------------------------------------------------------

    def connections(self) -> list[Connection]:
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as e:
            raise ConnectionsError(f"cannot read {self.path}: {e.strerror or e}") from None
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ConnectionsError(
                f"{self.path} is not valid JSON (line {e.lineno}, "
                f"column {e.colno}): fix or remove it"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("connections"), list):
            raise ConnectionsError(f'{self.path}: expected {{"connections": [...]}}')
        out: list[Connection] = []
        for item in data["connections"]:
            if not isinstance(item, dict):
                raise ConnectionsError(f"{self.path}: a connection entry is not an object")
            try:
                out.append(Connection.from_json(item))
            except ConnectionsError as e:
                raise ConnectionsError(f"{self.path}: {e}") from None
        return out

    def names(self) -> list[str]:
        return [c.name for c in self.connections()]

    def get(self, name: str) -> Connection:
        for c in self.connections():
            if c.name == name:
                return c
        known = ", ".join(self.names()) or "none saved yet"
        raise ConnectionsError(f"no connection named {name!r} (known: {known})")

    # -- keys --------------------------------------------------------------------------------

    def api_key(self, name: str) -> str | None:
        conn = self.get(name)
        if conn.key_env:
            return self._environ.get(conn.key_env) or None
        return self.secrets.get(_account(name))

    def has_key(self, name: str) -> bool:
        return self.api_key(name) is not None

    def set_api_key(self, name: str, key: str | None) -> SaveResult:
        """Store (or with None/"" remove) the key of a saved connection, in the keyring."""
        self.get(name)
        key = (key or "").strip()
        if not key:
            self.secrets.delete(_account(name))
            return SaveResult(False, "API key removed")
        if any(c.isspace() for c in key) or len(key) > 8192:
            raise ConnectionsError(
                "that does not look like an API key (it has spaces or is too long)"
            )
        result = self.secrets.set(_account(name), key)
        return SaveResult(result.persisted, f"API key {result.message}")

    # -- writing -----------------------------------------------------------------------------

    def add(
        self, conn: Connection, api_key: str | None = None, *, replace: bool = False
    ) -> SaveResult | None:
        """Save `conn` (and its key, if given). Returns where the key went, if one was given."""
        conn.validate()
        items = self.connections()
        clash = [c for c in items if c.name.casefold() == conn.name.casefold()]
        if clash and not (replace and clash[0].name == conn.name):
            raise ConnectionsError(f"a connection named {clash[0].name!r} exists already")
        items = [c for c in items if c.name != conn.name] + [conn]
        self._write(items)
        return self.set_api_key(conn.name, api_key) if api_key else None

    def update(self, old_name: str, conn: Connection) -> None:
        """Replace a connection, possibly renamed; its key moves with it."""
        conn.validate()
        items = self.connections()
        if not any(c.name == old_name for c in items):
            self.get(old_name)  # raises with the known names
        if any(c.name.casefold() == conn.name.casefold() and c.name != old_name for c in items):
            raise ConnectionsError(f"a connection named {conn.name!r} exists already")
        self._write([conn if c.name == old_name else c for c in items])
        if conn.name != old_name:
            key = self.secrets.get(_account(old_name))
            if key:
                self.secrets.set(_account(conn.name), key)
            self.secrets.delete(_account(old_name))

    def remove(self, name: str) -> None:
        items = self.connections()
        if not any(c.name == name for c in items):
            self.get(name)
        self._write([c for c in items if c.name != name])
        self.secrets.delete(_account(name))

    def _write(self, items: list[Connection]) -> None:
        data = {"version": FORMAT_VERSION, "connections": [c.to_json() for c in items]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".connections-", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # -- engines -----------------------------------------------------------------------------

    def endpoint(self, name: str, model: str | None = None) -> RemoteEndpoint:
        """The connection with its key, ready for `RemoteEngine`; `model` overrides the
        connection's default model."""
        c = self.get(name)
        return RemoteEndpoint(
            name=c.name,
            base_url=c.base_url,
            api=c.api,
            model=c.model if model is None else model,
            api_key=self.api_key(name),
            verify_tls=c.verify_tls,
            ca_file=c.ca_file,
            connect_timeout_s=c.connect_timeout_s,
            timeout_s=c.timeout_s,
        )

    def engine(self, name: str, model: str | None = None) -> RemoteEngine:
        return RemoteEngine(self.endpoint(name, model))

    def check(self, name: str) -> CheckResult:
        """Test a saved connection (network I/O: call it off the GUI thread)."""
        return self.engine(name).check()
