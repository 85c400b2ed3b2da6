"""The streaming client against a real llama_cpp.server and against misbehaving servers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.remote.streaming import ClientError, StreamingClient
from tests.engine.clients.bench_servers import FaultServer, free_port, llama_cpp_server

MSG = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def llama_server(
    smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with llama_cpp_server(smollm2_path, log) as server:
        yield server


def test_real_openai_stream_is_timed(llama_server: tuple[str, int], smollm2_path: Path) -> None:
    url, _pid = llama_server
    client = StreamingClient(url, timeout_s=120)
    models = client.list_models()
    assert models and models[0].endswith(smollm2_path.name)
    pieces: list[str] = []
    r = client.chat(MSG, max_tokens=16, temperature=0.0, on_piece=pieces.append)
    assert r.ok, r.error
    assert r.status == 200 and r.finish_reason in ("stop", "length")
    assert r.text and "".join(pieces) == r.text
    assert r.t_first is not None and r.t_start < r.t_first <= r.t_end
    assert r.chunk_times == sorted(r.chunk_times) and r.chunk_times[0] == r.t_first
    assert 1 <= r.n_chunks <= 16
    # The same request through the /v1 base URL form reaches the same endpoint.
    r2 = StreamingClient(url + "/v1/", timeout_s=120).chat(MSG, max_tokens=4)
    assert r2.ok, r2.error


def test_real_server_cut_stream_is_a_failure(llama_server: tuple[str, int]) -> None:
    url, _pid = llama_server
    # Far beyond the server's 2048-token context: it cannot answer.
    r = StreamingClient(url, timeout_s=120).chat(
        [{"role": "user", "content": "word " * 3000}], max_tokens=4
    )
    assert not r.ok
    assert r.error


def test_interrupted_answers_are_failures(llama_server: tuple[str, int]) -> None:
    """llama-cpp-python's server, by default, cuts a running answer short when another request
    arrives and still ends the stream normally; the client must not count that as a success."""
    url, _pid = llama_server
    client = StreamingClient(url, timeout_s=120)
    results: list[object] = []

    def one() -> None:
        results.append(client.chat(MSG, max_tokens=48))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [getattr(r, "error", None) for r in results]
    assert "the server ended the answer early (no finish reason)" in errors


def test_unreachable_server() -> None:
    r = StreamingClient(f"http://127.0.0.1:{free_port()}", timeout_s=5).chat(MSG)
    assert r.error == "connection refused (is the server running?)"
    assert r.status is None and not r.ok and r.t_end >= r.t_start
    with pytest.raises(ClientError, match="connection refused"):
        StreamingClient(f"http://127.0.0.1:{free_port()}").list_models()


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("http500", "HTTP 500: model crashed"),
        ("http503_text", "HTTP 503: <html><body>Service Unavailable</body></html>"),
        ("sse_error", "server error: out of memory"),
        ("truncated", "the stream ended before the answer was complete"),
        ("interrupted", "the server ended the answer early (no finish reason)"),
        ("garbage", "the server sent a malformed event"),
    ],
)
def test_server_errors_are_reported(mode: str, expected: str) -> None:
    with FaultServer(mode) as srv:
        r = StreamingClient(srv.url, timeout_s=10).chat(MSG)
    assert r.error == expected
    assert not r.ok and not r.timed_out


def test_stalled_stream_times_out() -> None:
    with FaultServer("stall") as srv:
        r = StreamingClient(srv.url, timeout_s=0.5).chat(MSG)
    assert r.timed_out and not r.ok
    assert r.text == "first"  # what arrived before the stall is kept
    assert r.t_end - r.t_start < 10


def test_cancel_ends_a_stalled_stream() -> None:
    cancel = threading.Event()
    with FaultServer("stall") as srv:
        # Cancel from another thread while the client is blocked waiting for the next line.
        timer = threading.Timer(0.3, cancel.set)
        timer.start()
        r = StreamingClient(srv.url, timeout_s=60).chat(MSG, cancel=cancel)
        timer.join()
        assert not srv.release.is_set()  # the server was still stalling: the client left
    assert r.cancelled and not r.ok and not r.timed_out and r.error is None
    assert r.text == "first"
    assert r.t_end - r.t_start < 30


def test_openai_usage_and_request_body() -> None:
    with FaultServer("openai_usage") as srv:
        client = StreamingClient(srv.url, api_key="sk-test", model="m1")
        r = client.chat(MSG, max_tokens=7, temperature=0.3, seed=5)
    assert r.ok, r.error
    assert r.text == "One two three" and r.n_chunks == 3
    assert (r.prompt_tokens, r.completion_tokens) == (17, 3)
    body = srv.requests[0]
    assert body["stream"] is True and body["max_tokens"] == 7 and body["model"] == "m1"
    assert body["stream_options"] == {"include_usage": True} and body["seed"] == 5


def test_ollama_dialect() -> None:
    with FaultServer("ollama") as srv:
        client = StreamingClient(srv.url, api="ollama", model="llama3")
        assert client.list_models() == ["fault-model"]
        r = client.chat(MSG, max_tokens=9)
    assert r.ok, r.error
    assert r.text == "Un deux trois" and r.n_chunks == 3
    assert (r.prompt_tokens, r.completion_tokens, r.finish_reason) == (21, 3, "stop")
    assert srv.requests[0]["options"]["num_predict"] == 9
    with FaultServer("ollama_error") as srv:
        r = StreamingClient(srv.url, api="ollama").chat(MSG)
    assert r.error == 'server error: model "x" not found'


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("localhost:8080", "not an http"),
        ("ftp://host/", "not an http"),
        ("http://", "not an http"),
        ("http://host:99999", "bad port"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ClientError, match=message):
        StreamingClient(url)
    with pytest.raises(ClientError, match="unknown API"):
        StreamingClient("http://x", api="grpc")  # type: ignore[arg-type]
