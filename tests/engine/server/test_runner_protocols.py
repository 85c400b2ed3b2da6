"""Which HTTP protocol and event loop uvicorn runs the server on (engine/server/runner.py):
httptools and uvloop where they are installed (less CPU per streamed chunk on the cores
llama.cpp decodes on), h11 and asyncio where they are not (uvloop has no Windows build).
The streamed bytes are the same on either: test_routes_fast's wire-format test runs over
the installed pair, the fallback's stream is checked here."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from engine.server import ServerConfig, ServerState, ServerThread
from engine.server.runner import _uvicorn_config
from tests.engine.server.conftest import API_KEY, make_config
from tests.fake_server_engine import fake_model, serve_fake

AUTO_MODULES = ("uvicorn.protocols.http.auto", "uvicorn.loops.auto")


def _loaded_config() -> uvicorn.Config:
    cfg = _uvicorn_config(ServerState(ServerConfig(port=0)), access_log=False)
    cfg.load()
    return cfg


@pytest.fixture
def without_c_speedups(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As on a platform without the wheels: importing httptools or uvloop fails."""
    for name in AUTO_MODULES:  # they chose at import: import them again
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "httptools", None)
    monkeypatch.setitem(sys.modules, "uvloop", None)
    yield
    for name in AUTO_MODULES:  # chosen without the speed-ups: not for the next test
        sys.modules.pop(name, None)


def test_installed_speedups_are_used() -> None:
    pytest.importorskip("httptools")
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    cfg = _loaded_config()
    assert cfg.http_protocol_class is HttpToolsProtocol
    if sys.platform != "win32":
        import uvloop

        factory = cfg.get_loop_factory()
        assert factory is not None
        loop = factory()
        try:
            assert isinstance(loop, uvloop.Loop)
        finally:
            loop.close()


def test_without_speedups_h11_and_asyncio(without_c_speedups: None) -> None:
    import asyncio

    from uvicorn.protocols.http.h11_impl import H11Protocol

    cfg = _loaded_config()
    assert cfg.http_protocol_class is H11Protocol
    factory = cfg.get_loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, asyncio.BaseEventLoop)  # the standard library's
    finally:
        loop.close()


def _stream(url: str) -> list[str]:
    body = {
        "model": "fake",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": 'say "hi"\n'}],
    }
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=body, headers=auth, timeout=60
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return [ln for ln in r.iter_lines() if ln]


def _without_ids(lines: list[str]) -> list[object]:
    """The stream with what differs between two requests (id, created, timings) left out."""
    out: list[object] = []
    for ln in lines:
        assert ln.startswith("data: ")
        data = ln.removeprefix("data: ")
        if data == "[DONE]":
            out.append(data)
            continue
        obj = json.loads(data)
        for key in ("id", "created", "timings"):
            obj.pop(key, None)
        out.append(obj)
    return out


def test_same_stream_over_h11(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One fake reply streamed by the installed protocol, then by the fallback: the same."""
    with fake_model(tmp_path_factory.mktemp("models")) as model:
        streams = []
        for fallback in (False, True):
            if fallback:
                for name in AUTO_MODULES:
                    monkeypatch.delitem(sys.modules, name, raising=False)
                monkeypatch.setitem(sys.modules, "httptools", None)
            model.reset()
            model.script('Hi "there"\nçà ✓ 😀')
            srv: ServerThread
            with serve_fake(model, make_config(model_id="fake")) as srv:
                used = srv._server.config.http_protocol_class.__name__
                assert used == ("H11Protocol" if fallback else "HttpToolsProtocol")
                streams.append(_stream(srv.url))
            assert model.loop.wait_idle(10)
        for name in AUTO_MODULES:
            sys.modules.pop(name, None)
    assert len(streams[0]) > 3
    assert _without_ids(streams[0]) == _without_ids(streams[1])
