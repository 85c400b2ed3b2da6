"""Saved remote connections: a JSON file without keys, keys in the keyring."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from keyring.backends import fail

from app.services.connections import Connection, ConnectionsError, ConnectionStore
from app.services.paths import AppPaths
from app.services.secrets import SERVICE, SecretStore
from engine.host.chat_engine import ChatRequest
from engine.settings import SamplingParams
from tests.app.services.file_keyring import FileKeyring
from tests.engine.clients.bench_servers import FaultServer

KEY = "sk-TOPSECRET-4242"


@pytest.fixture
def keyring_file(tmp_path: Path) -> Path:
    return tmp_path / "outside-the-app" / "keyring.json"


@pytest.fixture
def store(keyring_file: Path) -> ConnectionStore:
    keyring_file.parent.mkdir()
    return ConnectionStore(secrets=SecretStore(FileKeyring(keyring_file)), environ={})


def files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_saved_in_the_config_folder_and_read_back(store: ConnectionStore) -> None:
    assert store.path == AppPaths.default().config / "connections.json"
    assert store.connections() == []
    c = Connection("gpu box", "https://gpu.example:8000/v1", model="llama-70b", timeout_s=30)
    saved = store.add(c, KEY)
    assert saved is not None and saved.persisted and "keyring" in saved.message
    assert store.connections() == [c] and store.get("gpu box") == c
    fresh = ConnectionStore(secrets=store.secrets)  # another session
    assert fresh.connections() == [c] and fresh.api_key("gpu box") == KEY
    data = json.loads(store.path.read_text())
    assert data["version"] == 1 and data["connections"][0]["base_url"] == c.base_url
    ep = store.endpoint("gpu box")
    assert (ep.api_key, ep.model, ep.timeout_s) == (KEY, "llama-70b", 30)
    assert store.endpoint("gpu box", model="other").model == "other"


def test_the_key_never_lands_in_the_apps_files(
    store: ConnectionStore, candlewick_home: Path, keyring_file: Path
) -> None:
    store.add(Connection("a", "http://127.0.0.1:9"), KEY)
    store.add(Connection("b", "http://127.0.0.1:9", api="ollama"))
    store.set_api_key("b", KEY + "-b")
    store.update("a", Connection("renamed", "http://127.0.0.1:9", model="m"))
    assert files_containing(candlewick_home, "TOPSECRET") == []
    assert "TOPSECRET" not in repr(store.endpoint("renamed"))
    # It is in the keyring, under the connection's (new) name, and nowhere else.
    assert files_containing(keyring_file.parent, "TOPSECRET") == [keyring_file]
    keys = json.loads(keyring_file.read_text())
    assert keys == {f"{SERVICE}/connection:renamed": KEY, f"{SERVICE}/connection:b": KEY + "-b"}
    store.remove("renamed")
    store.remove("b")
    assert json.loads(keyring_file.read_text()) == {}
    assert store.connections() == []


def test_key_from_an_environment_variable() -> None:
    store = ConnectionStore(
        secrets=SecretStore(fail.Keyring()),  # type: ignore[no-untyped-call]
        environ={"LAB_KEY": KEY},
    )
    store.add(Connection("lab", "http://127.0.0.1:9", key_env="LAB_KEY"))
    assert store.api_key("lab") == KEY and store.endpoint("lab").api_key == KEY
    assert KEY not in store.path.read_text()
    store.add(Connection("unset", "http://127.0.0.1:9", key_env="NOT_SET"))
    assert store.api_key("unset") is None and not store.has_key("unset")


def test_without_a_keyring_the_key_lives_for_this_session_only() -> None:
    secrets = SecretStore(fail.Keyring())  # type: ignore[no-untyped-call]
    store = ConnectionStore(secrets=secrets)
    saved = store.add(Connection("x", "http://127.0.0.1:9"), KEY)
    assert saved is not None and not saved.persisted and "this session only" in saved.message
    assert store.api_key("x") == KEY
    assert ConnectionStore(secrets=SecretStore(fail.Keyring())).api_key("x") is None  # type: ignore[no-untyped-call]
    assert KEY not in store.path.read_text()


@pytest.mark.parametrize(
    ("conn", "message"),
    [
        (Connection("", "http://h"), "needs a name"),
        (Connection("a\nb", "http://h"), "bad connection name"),
        (Connection(" pad", "http://h"), "bad connection name"),
        (Connection("x", "gpu-box:8000"), "x: not an http"),
        (Connection("x", "http://h:99999"), "bad port"),
        (Connection("x", "http://h", api="grpc"), "unknown API"),  # type: ignore[arg-type]
        (Connection("x", "http://h", timeout_s=0), "timeout must be between"),
        (Connection("x", "http://h", connect_timeout_s=-1), "connect timeout must be"),
        (Connection("x", "http://h", key_env="NOT A VAR"), "not an environment variable name"),
        (Connection("x", "https://h", ca_file="/nonexistent/ca.pem"), "CA file not found"),
    ],
)
def test_bad_settings_are_one_line_errors(
    store: ConnectionStore, conn: Connection, message: str
) -> None:
    with pytest.raises(ConnectionsError, match=message) as ei:
        store.add(conn)
    assert "\n" not in str(ei.value)
    assert not store.path.exists()


def test_names_are_unique_and_replace_is_explicit(store: ConnectionStore) -> None:
    store.add(Connection("Lab", "http://127.0.0.1:1"))
    with pytest.raises(ConnectionsError, match="'Lab' exists already"):
        store.add(Connection("lab", "http://127.0.0.1:2"))
    with pytest.raises(ConnectionsError, match="'Lab' exists already"):
        store.add(Connection("Lab", "http://127.0.0.1:2"))
    store.add(Connection("Lab", "http://127.0.0.1:2"), replace=True)
    assert store.get("Lab").base_url == "http://127.0.0.1:2"
    store.add(Connection("Other", "http://127.0.0.1:3"))
    with pytest.raises(ConnectionsError, match="'lab' exists already"):
        store.update("Other", Connection("lab", "http://127.0.0.1:3"))
    with pytest.raises(
        ConnectionsError,
        match=r"no connection named 'nope' \(known: Lab, "
        r"Other\)",
    ):
        store.remove("nope")
    with pytest.raises(ConnectionsError, match="does not look like an API key"):
        store.set_api_key("Lab", "two words")


def test_a_damaged_file_is_reported_and_left_alone(store: ConnectionStore) -> None:
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_text('{"connections": [{"name": "a", "base_url": ')
    with pytest.raises(
        ConnectionsError,
        match=r"is not valid JSON \(line 1, column \d+\): "
        r"fix or remove it",
    ):
        store.connections()
    with pytest.raises(ConnectionsError):
        store.add(Connection("b", "http://127.0.0.1:9"))
    assert store.path.read_text().endswith('"base_url": ')  # not overwritten
    store.path.write_text('{"connections": [{"name": "a", "base_url": "http://h", "x": 1}]}')
    with pytest.raises(ConnectionsError, match=r"unknown connection field\(s\): x"):
        store.connections()
    store.path.write_text('{"connections": [{"name": "a"}]}')
    with pytest.raises(ConnectionsError, match="needs at least a name and a base_url"):
        store.connections()


def test_a_failed_save_keeps_the_old_file(
    store: ConnectionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.add(Connection("a", "http://127.0.0.1:9"))
    before = store.path.read_bytes()

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space left"):
        store.add(Connection("b", "http://127.0.0.1:9"))
    monkeypatch.undo()
    assert store.path.read_bytes() == before
    assert [p.name for p in store.path.parent.iterdir()] == ["connections.json"]  # no temp


def test_check_and_chat_through_a_saved_connection(store: ConnectionStore) -> None:
    with FaultServer("openai_usage") as srv:
        store.add(Connection("fault", srv.url), KEY)
        result = store.check("fault")
        assert result.ok and result.models == ("fault-model",)
        store.add(Connection("fault", srv.url, model="m1"), KEY, replace=True)
        result = store.check("fault")
        assert not result.ok and "'m1' is not among them" in result.message
        reply = store.engine("fault").reply(
            ChatRequest([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=5))
        )
        assert "".join(reply) == "One two three"
        assert srv.requests[-1]["model"] == "m1" and srv.requests[-1]["max_tokens"] == 5
