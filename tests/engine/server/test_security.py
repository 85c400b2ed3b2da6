"""API key, loopback-only default, CORS closed unless configured, the key never logged."""

from __future__ import annotations

import logging
import subprocess
import sys

import openai
import pytest

from engine.server import ServedModel, ServerConfig, ServerError, ServerState, ServerThread
from engine.server.app import AuthMiddleware
from tests.app.cli_inproc import run_cli
from tests.engine.server.conftest import API_KEY, http, make_config


def test_no_key_wrong_key_right_key(base_url: str) -> None:
    url = base_url + "/v1/models"
    assert http.get(url).status_code == 401
    r = http.get(url, headers={"Authorization": "Bearer wrong-key-0123456789"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert r.headers["www-authenticate"] == "Bearer"
    assert http.get(url, headers={"Authorization": f"Basic {API_KEY}"}).status_code == 401
    assert http.get(url, headers={"Authorization": f"Bearer {API_KEY}x"}).status_code == 401
    assert http.get(url, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    assert http.get(url, headers={"x-api-key": API_KEY}).status_code == 200
    # Ollama routes answer in Ollama's error shape.
    r = http.get(base_url + "/api/tags")
    assert r.status_code == 401 and isinstance(r.json()["error"], str)
    for path in ("/metrics", "/openapi.json", "/slots", "/api/version"):
        assert http.get(base_url + path).status_code == 401, path
    # /health is the one open route.
    assert http.get(base_url + "/health").status_code == 200


def test_official_clients_get_401(base_url: str) -> None:
    with (
        openai.OpenAI(base_url=base_url + "/v1", api_key="not-the-key", max_retries=0) as c,
        pytest.raises(openai.AuthenticationError),
    ):
        c.models.list()


def test_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import hmac

    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    mw = AuthMiddleware(lambda *a: None, "k" * 12)  # type: ignore[arg-type,return-value]
    assert not mw._authorized({"headers": [(b"authorization", b"Bearer kkk")]})
    assert mw._authorized({"headers": [(b"authorization", b"Bearer " + b"k" * 12)]})
    assert calls == [(b"kkk", b"k" * 12), (b"k" * 12, b"k" * 12)]


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "example.com"])
def test_non_loopback_bind_without_key_is_refused(host: str) -> None:
    with pytest.raises(ServerError, match="without an API key"):
        ServerConfig(host=host).validate()
    ServerConfig(host=host, api_key=API_KEY).validate()  # with a key it is allowed


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_without_key_is_fine(host: str) -> None:
    ServerConfig(host=host).validate()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ServerError, match="too short"):
        ServerConfig(api_key="short").validate()
    with pytest.raises(ServerError, match="spaces"):
        ServerConfig(api_key="has a space in it").validate()
    with pytest.raises(ServerError, match="CORS"):
        ServerConfig(cors_origins=("*",)).validate()
    with pytest.raises(ServerError, match="port"):
        ServerConfig(port=70000).validate()


def test_cli_refuses_network_bind_without_key() -> None:
    r = run_cli("serve", "--host", "0.0.0.0")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "without an API key" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_reports_a_busy_port_and_a_bad_key_file(server: ServerThread, tmp_path: object) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(server.port)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "cannot listen" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--api-key-file", "/nonexistent/key"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "API key file" in r.stderr


def test_cors_closed_by_default_open_for_configured_origin(
    served: ServedModel, base_url: str
) -> None:
    pre = {
        "Origin": "http://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    r = http.options(base_url + "/v1/chat/completions", headers=pre)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://app.example"
    r = http.options(
        base_url + "/v1/chat/completions", headers={**pre, "Origin": "http://evil.example"}
    )
    assert "access-control-allow-origin" not in r.headers

    state = ServerState(make_config(cors_origins=()))
    state.set_loaded(served)
    with ServerThread(state) as srv:
        r = http.options(srv.url + "/v1/chat/completions", headers=pre)
        assert "access-control-allow-origin" not in r.headers
        r = http.get(srv.url + "/health", headers={"Origin": "http://app.example"})
        assert "access-control-allow-origin" not in r.headers


def test_key_never_logged(served: ServedModel, caplog: pytest.LogCaptureFixture) -> None:
    state = ServerState(make_config())
    state.set_loaded(served)
    with caplog.at_level(logging.DEBUG), ServerThread(state, access_log=True) as srv:
        http.get(srv.url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
        http.get(srv.url + "/v1/models", headers={"Authorization": "Bearer wrong-guess-123"})
    assert caplog.records  # the access log did run
    assert API_KEY not in caplog.text and "wrong-guess" not in caplog.text
