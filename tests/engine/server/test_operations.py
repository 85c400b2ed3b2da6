"""Health, metrics, back-pressure, disconnects, a bounded load test and a schemathesis run."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.services.server_models import LibraryModelStore
from engine.server import ServedModel, ServerState, ServerThread
from tests.engine.server.conftest import API_KEY, assert_no_leak, http, make_config

AUTH = {"Authorization": f"Bearer {API_KEY}"}
LONG = {
    "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
    "max_tokens": 2000,
    "temperature": 0,
    "stream": True,
}


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^candlewick_{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    assert m, f"{name}{labels} missing"
    return float(m.group(1))


def test_health_while_loading_then_ready(served: ServedModel) -> None:
    state = ServerState(make_config())
    with ServerThread(state) as srv:
        r = http.get(srv.url + "/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = http.get(srv.url + "/v1/models", headers=AUTH)
        assert r.status_code == 503 and r.headers["retry-after"]
        assert "loading" in r.json()["error"]["message"]
        state.set_loaded(served)
        r = http.get(srv.url + "/health")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        assert r.json()["slots_total"] == 4
        state.set_loaded(None)
        state.load_error = "loading failed: bad file"
        r = http.get(srv.url + "/health")
        assert r.status_code == 503 and r.json()["error"] == "loading failed: bad file"


def test_metrics_count_requests_and_tokens(base_url: str) -> None:
    before = http.get(base_url + "/metrics", headers=AUTH).text
    r = http.post(
        base_url + "/v1/chat/completions",
        headers=AUTH,
        json={"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 5},
    )
    usage = r.json()["usage"]
    http.get(base_url + "/v1/models")  # a 401
    after = http.get(base_url + "/metrics", headers=AUTH)
    assert after.headers["content-type"].startswith("text/plain")
    a = after.text
    label = '{route="/v1/chat/completions",status="200"}'
    assert (
        metric(a, "requests_total", label)
        == (metric(before, "requests_total", label) if label in before else 0) + 1
    )
    assert metric(a, "requests_total", '{route="/v1/models",status="401"}') >= 1
    assert (
        metric(a, "completion_tokens_total") - metric(before, "completion_tokens_total")
        == usage["completion_tokens"]
    )
    assert (
        metric(a, "prompt_tokens_total") - metric(before, "prompt_tokens_total")
        == usage["prompt_tokens"]
    )
    assert metric(a, "time_to_first_token_seconds_count") >= 1
    assert metric(a, "request_duration_seconds_count") >= 1
    assert metric(a, "slots_total") == 4
    assert metric(a, "kv_cache_capacity_cells") == 4 * 1024
    assert metric(a, "queue_depth") == 0
    assert "# TYPE candlewick_request_duration_seconds histogram" in a


def test_openapi_schema(base_url: str) -> None:
    s = http.get(base_url + "/openapi.json", headers=AUTH).json()
    assert s["openapi"].startswith("3.")
    for path in (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
        "/api/chat",
        "/api/generate",
        "/api/tags",
        "/api/show",
        "/health",
        "/metrics",
    ):
        assert path in s["paths"], path
    assert s["security"] == [{"bearer": []}]


# How long a test waits for a state before it fails: generous, since the suite must pass on
# a 2-core machine whose cores other jobs keep busy (scripts/test_under_load.sh). Not a
# speed check: a state that comes at all comes long before this.
PATIENCE_S = 300


def _busy_slot(served: ServedModel) -> int:
    end = time.monotonic() + PATIENCE_S
    while time.monotonic() < end:
        busy = [s["id"] for s in served.scheduler.snapshot().slots if s["busy"]]
        if busy:
            return int(busy[0])
        time.sleep(0.01)
    raise AssertionError("no slot became busy")


def test_streaming_client_disconnect_frees_slot_and_kv(base_url: str, served: ServedModel) -> None:
    assert_no_leak(served)
    with (
        httpx.Client(timeout=PATIENCE_S) as c,
        c.stream(
            "POST", base_url + "/v1/chat/completions", headers=AUTH, json={**LONG, "max_tokens": 60}
        ) as r,
    ):
        lines = r.iter_lines()
        got = [next(lines) for _ in range(4)]  # role chunk + a few tokens
        assert all(x.startswith("data: ") or x == "" for x in got)
        slot = _busy_slot(served)
    # Leaving the block closed the connection mid-stream.
    assert_no_leak(served)
    snap = served.scheduler.snapshot()
    assert snap.slots[slot]["cached_tokens"] == 0
    assert served.scheduler.kv_positions()[slot] == 0


def test_non_streaming_client_disconnect_frees_slot(
    server: ServerThread, served: ServedModel
) -> None:
    assert_no_leak(served)
    body = json.dumps({**LONG, "stream": False, "max_tokens": 60}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        f"{API_KEY}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        "\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head + body)
        slot = _busy_slot(served)
    assert_no_leak(served)
    assert served.scheduler.snapshot().slots[slot]["cached_tokens"] == 0
    assert served.scheduler.kv_positions()[slot] == 0


def test_queue_full_gives_429_with_retry_after(served: ServedModel) -> None:
    state = ServerState(make_config(max_tokens_cap=2000))
    state.set_loaded(served)
    sched = served.scheduler
    old = sched.max_queue
    sched.max_queue = 0  # nothing may wait: the 5th concurrent request is refused
    try:
        with ServerThread(state) as srv, httpx.Client(timeout=PATIENCE_S) as c:
            streams = []
            for i in range(4):
                cm = c.stream(
                    "POST",
                    srv.url + "/v1/chat/completions",
                    headers=AUTH,
                    json={
                        **LONG,
                        "messages": [{"role": "user", "content": f"Story number {i}, please."}],
                        # No early end: a greedy story may stop by itself, and which one does
                        # depends on how the steps' batches were cut (busy machine, kernels).
                        "grammar": "root ::= [a-z ]{1500}",
                    },
                )
                r = cm.__enter__()
                lines = r.iter_lines()  # kept alive: dropping it would close the connection
                next(lines)
                streams.append((cm, lines))
            end = time.monotonic() + PATIENCE_S  # requests take a slot between decode steps
            while sched.snapshot().busy_slots < 4 and time.monotonic() < end:
                time.sleep(0.01)
            assert sched.snapshot().busy_slots == 4
            r = c.post(srv.url + "/v1/chat/completions", headers=AUTH, json=LONG)
            assert r.status_code == 429
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
            r = c.post(
                srv.url + "/api/generate", headers=AUTH, json={"model": "smollm2", "prompt": "hi"}
            )
            assert r.status_code == 429 and isinstance(r.json()["error"], str)
            for cm, _ in streams:
                cm.__exit__(None, None, None)
            m = c.get(srv.url + "/metrics", headers=AUTH).text
            assert metric(m, "requests_rejected_total") == 2
    finally:
        sched.max_queue = old
    assert_no_leak(served)


@pytest.mark.slow
@pytest.mark.timeout(900)  # on a 2-core machine shared with other jobs this takes minutes
def test_bounded_load_with_disconnects(served: ServedModel) -> None:
    """200 requests at concurrency 16 on 4 slots with room for 10 waiting: when all 16 are in
    flight some are refused with 429 and retried after Retry-After; every 8th client hangs up
    mid-stream.
    Afterwards no request has failed, no slot is busy, nothing waits, and the KV cache holds
    only the finished requests' reusable prefixes (llama.cpp's own count agrees)."""
    n_requests, concurrency, max_queue, answer_tokens, hangup_tokens = 200, 16, 10, 3, 40
    sched = served.scheduler
    state = ServerState(make_config())
    state.set_loaded(served)
    answered: list[int] = []  # prompt + completion tokens of each request that ran to its end
    statuses: list[int] = []  # every HTTP answer, retries included
    hung_up = 0
    failures: list[str] = []

    async def one(c: httpx.AsyncClient, i: int) -> None:
        nonlocal hung_up
        body = {
            "messages": [{"role": "user", "content": f"Give me fact number {i}."}],
            "max_tokens": answer_tokens,
            "stream": i % 2 == 0,
            "stream_options": {"include_usage": True} if i % 2 == 0 else None,
        }
        while time.monotonic() < give_up:
            if i % 8 == 0:
                async with c.stream(
                    "POST",
                    "/v1/chat/completions",
                    headers=AUTH,
                    json={**body, "stream": True, "max_tokens": hangup_tokens},
                ) as r:
                    statuses.append(r.status_code)
                    if r.status_code == 429:
                        await r.aread()
                        await asyncio.sleep(float(r.headers["retry-after"]))
                        continue
                    assert r.status_code == 200, r.status_code
                    got = 0
                    async for line in r.aiter_lines():
                        got += line.startswith("data: {")
                        if got == 3:  # the role chunk and two pieces of text
                            break
                    assert got == 3, "the answer ended before the client could hang up"
                    hung_up += 1
                return  # leaving the block closes the connection mid-stream
            r = await c.post("/v1/chat/completions", headers=AUTH, json=body)
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.json()["error"]["type"] == "rate_limit_error"
                await asyncio.sleep(float(r.headers["retry-after"]))
                continue
            assert r.status_code == 200, f"{r.status_code}: {r.text[:200]}"
            if body["stream"]:
                events = [x for x in r.text.split("\n") if x.startswith("data: ")]
                assert events[-1] == "data: [DONE]"
                usage = json.loads(events[-2][6:])["usage"]
            else:
                out = r.json()
                assert out["choices"][0]["finish_reason"] in ("stop", "length")
                usage = out["usage"]
            assert 1 <= usage["completion_tokens"] <= answer_tokens
            answered.append(usage["prompt_tokens"] + usage["completion_tokens"])
            return
        raise AssertionError("still refused after 800 s of retries")

    async def main(url: str) -> None:
        sem = asyncio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as c:

            async def guarded(i: int) -> None:
                async with sem:
                    try:
                        await one(c, i)
                    except Exception as e:  # collected, reported below
                        failures.append(f"{i}: {type(e).__name__}: {e}")

            await asyncio.gather(*(guarded(i) for i in range(n_requests)))

    give_up = time.monotonic() + 800  # a request still refused by then has failed
    old = sched.max_queue
    sched.max_queue = max_queue
    try:
        with ServerThread(state) as srv:
            asyncio.run(main(srv.url))
            assert sched.wait_idle(60)
            m = http.get(srv.url + "/metrics", headers=AUTH).text
            health = http.get(srv.url + "/health").json()
    finally:
        sched.max_queue = old
    assert not failures, failures[:5]
    assert hung_up == n_requests // 8 and len(answered) == n_requests - hung_up
    assert set(statuses) <= {200, 429}
    label = '{route="/v1/chat/completions",status="%d"}'
    assert metric(m, "requests_total", label % 200) == statuses.count(200) == n_requests
    refused = statuses.count(429)
    if refused:
        assert metric(m, "requests_total", label % 429) == refused
    assert metric(m, "requests_rejected_total") == refused
    assert metric(m, "slots_busy") == 0 and metric(m, "queue_depth") == 0
    assert health["slots_busy"] == 0 and health["queue_depth"] == 0
    # No leak: the cells in use are the idle slots' cached prefixes, each at most what one
    # finished request decoded (hung-up requests' cells were freed), and llama.cpp agrees.
    snap = sched.snapshot()
    cached = [s["cached_tokens"] for s in snap.slots]
    assert metric(m, "kv_cache_used_cells") == sum(cached) == snap.kv_used
    assert max(cached) <= max(answered)
    assert sched.kv_positions() == cached
    assert_no_leak(served)


WARNINGS = (
    "missing_auth",
    "missing_test_data",
    "base_url_mismatch",
    "validation_mismatch",
    "missing_deserializer",
    "unused_openapi_auth",
    "unsupported_regex",
    "method_not_allowed",
    "unmatched_filter",
    "unresolvable_reference",
    "low_valid_rate",
    "rate_limited",
)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # minutes alone; over 14 beside busy loops and other jobs
def test_schemathesis_finds_nothing(
    served: ServedModel, tmp_path: Path, model_store: LibraryModelStore
) -> None:
    """Fuzz every route from the server's own OpenAPI schema: no 5xx, no schema violation.

    `positive_data_acceptance` is left out: a schema-valid prompt can still be longer than a
    slot's context (a token count JSON Schema cannot express), and that is a correct 400."""
    # With a slot folder, so the /slots actions answer rather than refuse with a 501.
    slots = tmp_path / "slots"
    slots.mkdir()
    # With a model store over an empty library: pulls (from the Hub emulator), copies,
    # creates and deletes are fuzzed too.
    state = ServerState(make_config(max_tokens_cap=2, slot_save_path=slots), store=model_store)
    state.set_loaded(served)
    exe = Path(sys.executable).parent / "schemathesis"
    with ServerThread(state) as srv:
        r = subprocess.run(
            [
                str(exe),
                "run",
                srv.url + "/openapi.json",
                "-H",
                f"Authorization: Bearer {API_KEY}",
                "--checks",
                "all",
                "--exclude-checks",
                "positive_data_acceptance",
                "--max-examples",
                "5",
                "--workers",
                "1",
                "--request-timeout",
                "300",
                # Not a speed check (tests assert no wall-clock times): a grammar compile or
                # an embedding on a busy 2-core machine can take longer than the default 10 s.
                "--max-response-time",
                "300",
                # A made-up model name is a correct 404 (no fallback to another model), so
                # operations whose generated data names one are mostly refused: not a finding.
                "--warnings",
                ",".join(
                    w
                    for w in WARNINGS
                    if w not in ("missing_test_data", "validation_mismatch", "low_valid_rate")
                ),
                "--seed",
                "7",
            ],
            capture_output=True,
            text=True,
            timeout=1750,
            cwd=tmp_path,
        )
    assert r.returncode == 0, r.stdout[-3000:]
    assert "No issues found" in r.stdout, r.stdout[-3000:]
    assert_no_leak(served)
