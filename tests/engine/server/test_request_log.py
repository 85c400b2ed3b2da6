"""The request log a viewer (the desktop server panel) reads: one row per answered request."""

from __future__ import annotations

import httpx

from engine.server import ServedModel, ServerState, ServerThread
from engine.server.request_log import RequestLog, RequestRecord
from tests.engine.server.conftest import API_KEY, http, make_config

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_requests_are_logged_with_tokens_and_without_the_key(served: ServedModel) -> None:
    log = RequestLog(maxlen=50, secret=API_KEY)
    state = ServerState(make_config(), request_log=log)
    state.set_loaded(served)
    with ServerThread(state) as srv:
        r = http.post(
            srv.url + "/v1/chat/completions",
            headers=AUTH,
            json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3},
        )
        usage = r.json()["usage"]
        with httpx.stream(
            "POST",
            srv.url + "/v1/chat/completions",
            headers=AUTH,
            timeout=120,
            json={
                "messages": [{"role": "user", "content": "Count."}],
                "max_tokens": 4,
                "stream": True,
            },
        ) as s:
            assert [x for x in s.iter_lines() if x][-1] == "data: [DONE]"
        http.get(srv.url + "/v1/models", headers={"Authorization": "Bearer wrong-key-123"})
        http.get(srv.url + f"/v1/models/{API_KEY}", headers=AUTH)
    rows = log.drain()
    assert [(r.method, r.path, r.status) for r in rows] == [
        ("POST", "/v1/chat/completions", 200),
        ("POST", "/v1/chat/completions", 200),
        ("GET", "/v1/models", 401),
        ("GET", "/v1/models/***", 404),
    ]
    assert rows[0].prompt_tokens == usage["prompt_tokens"]
    assert rows[0].completion_tokens == usage["completion_tokens"]
    assert rows[1].completion_tokens is not None and rows[1].completion_tokens >= 1
    assert rows[2].completion_tokens is None  # refused before any generation
    assert all(r.latency_s > 0 and r.client.startswith("127.0.0.1:") for r in rows)
    assert not any(API_KEY in repr(r) for r in rows)
    assert log.drain() == [] and log.total == 4


def test_log_is_bounded() -> None:
    log = RequestLog(maxlen=3)
    for i in range(5):
        log.append(RequestRecord("GET", f"/{i}"))
    assert [r.path for r in log.drain()] == ["/2", "/3", "/4"]
    assert log.total == 5
