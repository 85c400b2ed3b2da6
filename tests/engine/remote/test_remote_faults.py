"""The remote engine against servers that misbehave: silent, stalling, refusing, failing,
wrong certificates. Each failure is a `RemoteError` of the right kind with a one-line message,
and the text that arrived before it is kept."""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from engine.errors import EngineError
from engine.host.chat_engine import ChatEngine, ChatRequest, ReplyStream
from engine.remote.engines import (
    RemoteAuthError,
    RemoteConnectionError,
    RemoteDroppedError,
    RemoteEndpoint,
    RemoteEngine,
    RemoteError,
    RemoteHTTPError,
    RemoteTimeoutError,
)
from engine.remote.streaming import StreamingClient
from engine.settings import SamplingParams
from tests.engine.clients.bench_servers import FaultServer, free_port

MSG = [{"role": "user", "content": "Count to three."}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


class SlowServer:
    """A deliberately slow OpenAI-style server (standard library only).

    mode "silent": reads the request and sends nothing until released.
    mode "trickle": sends the headers and one chunk, then nothing until released.
    """

    def __init__(self, mode: str) -> None:
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if mode == "trickle":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(
                        b'data: {"choices": [{"index": 0, "delta": '
                        b'{"content": "One, two"}, "finish_reason": null}]}\n\n'
                    )
                    self.wfile.flush()
                outer.release.wait(30)
                self.close_connection = True

            do_GET = do_POST

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(
            # shutdown() waits for the loop's next poll: 0.5 s by default, per server
            target=self.httpd.serve_forever,
            name="slow-server",
            kwargs={"poll_interval": 0.02},
        )

    def __enter__(self) -> SlowServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()


def engine(url: str, **kw: Any) -> RemoteEngine:
    base: dict[str, Any] = {"name": "test", "base_url": url, "model": "m1", "timeout_s": 10}
    base.update(kw)
    return RemoteEngine(RemoteEndpoint(**base))


def consume(reply: ReplyStream) -> list[str]:
    return list(reply)


def test_the_remote_engine_is_a_chat_engine() -> None:
    e = engine("http://127.0.0.1:9")
    assert isinstance(e, ChatEngine)
    assert e.kind == "remote" and e.n_ctx is None and not e.can_continue
    assert e.name == "test · m1"
    assert "sk-" not in repr(RemoteEndpoint("x", "http://h", api_key="sk-secret"))


def test_silent_server_times_out() -> None:
    with SlowServer("silent") as srv:
        reply = engine(srv.url, timeout_s=0.5).reply(ChatRequest(MSG, GREEDY))
        with pytest.raises(RemoteTimeoutError) as ei:
            consume(reply)
    e = ei.value
    assert str(e) == "test: no answer: the server was silent for 0.5 s (timed out)"
    assert e.partial == "" and e.stats is not None and e.stats.stop_reason == "error"
    # The model list times out the same way.
    with SlowServer("silent") as srv, pytest.raises(RemoteTimeoutError, match="timed out"):
        engine(srv.url, timeout_s=0.5).list_models()


def test_stalled_stream_times_out_and_keeps_the_partial_answer() -> None:
    with SlowServer("trickle") as srv:
        reply = engine(srv.url, timeout_s=0.5).reply(ChatRequest(MSG, GREEDY))
        pieces: list[str] = []
        with pytest.raises(RemoteTimeoutError) as ei:
            for p in reply:
                pieces.append(p)
    e = ei.value
    assert pieces == ["One, two"] and reply.text == "One, two" and e.partial == "One, two"
    assert str(e) == (
        "test: the answer stalled: the server was silent for 0.5 s (timed out); "
        "the partial answer (8 characters) is kept"
    )
    assert e.stats is not None and e.stats.gen_tokens == 1 and e.stats.measured_on == "client"


def test_cancel_ends_a_stalled_stream_without_an_error() -> None:
    cancel = threading.Event()
    with SlowServer("trickle") as srv:
        reply = engine(srv.url, timeout_s=60).reply(ChatRequest(MSG, GREEDY), cancel)
        pieces = []
        for p in reply:
            pieces.append(p)
            cancel.set()  # the next read blocks; the watcher wakes it
        assert not srv.release.is_set()
    assert pieces == ["One, two"]
    assert reply.stats.stop_reason == "cancelled" and reply.stats.gen_tokens == 1


def test_a_connection_that_never_completes_times_out() -> None:
    """A listening socket whose accept queue is full: the kernel drops further SYNs, so the
    TCP connect hangs until the connect timeout."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        port = srv.getsockname()[1]
        fillers = []
        try:
            for _ in range(4):
                c = socket.socket()
                c.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    c.connect(("127.0.0.1", port))
                fillers.append(c)
            e = engine(f"http://127.0.0.1:{port}", connect_timeout_s=0.5)
            with pytest.raises(RemoteTimeoutError) as ei:
                consume(e.reply(ChatRequest(MSG, GREEDY)))
            with pytest.raises(RemoteTimeoutError, match=r"no connection within 0\.5 s"):
                e.list_models()
        finally:
            for c in fillers:
                c.close()
    assert str(ei.value) == (
        f"cannot connect to test (http://127.0.0.1:{port}): no connection within 0.5 s (timed out)"
    )


def test_refused_port_is_a_connection_error() -> None:
    e = engine(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(
        RemoteConnectionError,
        match=r"^cannot connect to test \(http://127"
        r".*\): connection refused \(is the server running\?\)$",
    ):
        consume(e.reply(ChatRequest(MSG, GREEDY)))
    result = e.check()
    assert not result.ok and isinstance(result.error, RemoteConnectionError)
    assert "connection refused" in result.message and result.models == ()


def test_unknown_host_is_a_connection_error() -> None:
    e = engine("http://no-such-host.invalid:8000", connect_timeout_s=5)
    with pytest.raises(RemoteConnectionError, match="host not found"):
        e.list_models()


@pytest.mark.parametrize(
    ("mode", "cls", "message", "partial"),
    [
        ("http500", RemoteHTTPError, "test: HTTP 500: model crashed", ""),
        (
            "sse_error",
            RemoteHTTPError,
            "test: server error: out of memory; the partial answer (3 characters) is kept",
            "Hel",
        ),
        (
            "truncated",
            RemoteDroppedError,
            "test: the connection dropped mid-answer (the stream "
            "ended before the answer was complete); the partial answer (9 characters) is kept",
            "Hello wor",
        ),
        (
            "interrupted",
            RemoteDroppedError,
            "test: the connection dropped mid-answer (the server "
            "ended the answer early (no finish reason)); the partial answer (3 characters) is kept",
            "Hel",
        ),
    ],
)
def test_server_failures_are_typed(
    mode: str, cls: type[RemoteError], message: str, partial: str
) -> None:
    with FaultServer(mode) as srv:
        reply = engine(srv.url).reply(ChatRequest(MSG, GREEDY))
        with pytest.raises(cls) as ei:
            consume(reply)
    assert str(ei.value) == message
    assert ei.value.partial == partial == reply.text
    assert "\n" not in str(ei.value)


def test_sampling_settings_reach_the_server() -> None:
    s = SamplingParams(temperature=0.4, top_p=0.8, seed=7, max_tokens=33, stop=("END",))
    with FaultServer("openai_usage") as srv:
        reply = engine(srv.url, api_key="sk-test").reply(ChatRequest(MSG, s))
        assert consume(reply) == ["One", " two", " three"]
        body = srv.requests[0]
    assert (
        body["temperature"],
        body["top_p"],
        body["seed"],
        body["max_tokens"],
        body["stop"],
        body["model"],
    ) == (0.4, 0.8, 7, 33, ["END"], "m1")
    assert body["messages"] == MSG and body["stream"] is True
    st = reply.stats
    assert st.measured_on == "client" and st.server_usage == ("prompt_tokens", "gen_tokens")
    assert (st.prompt_tokens, st.gen_tokens, st.stop_reason) == (17, 3, "stop")
    assert reply.prompt_tokens == 17 and reply.generated_tokens == 3
    assert 0 < st.ttft_s <= st.total_s
    with FaultServer("ollama") as srv:
        reply = engine(srv.url, api="ollama").reply(ChatRequest(MSG, s))
        assert "".join(reply) == "Un deux trois"
        opts = srv.requests[0]["options"]
    assert (
        opts["temperature"],
        opts["top_p"],
        opts["seed"],
        opts["num_predict"],
        opts["stop"],
    ) == (0.4, 0.8, 7, 33, ["END"])


def test_without_usage_tokens_are_counted_as_chunks() -> None:
    with FaultServer("ollama") as srv:
        srv.mode = "ollama"
        reply = engine(srv.url, api="ollama").reply(ChatRequest(MSG, GREEDY))
        consume(reply)
    # The fault server's Ollama stream does report counts...
    assert reply.stats.server_usage == ("prompt_tokens", "gen_tokens")
    with FaultServer("truncated") as srv:
        reply = engine(srv.url).reply(ChatRequest(MSG, GREEDY))
        with pytest.raises(RemoteDroppedError) as ei:
            consume(reply)
    # ...this one does not: two chunks arrived, the prompt size is unknown.
    st = ei.value.stats
    assert st is not None and st.server_usage == () and st.gen_tokens == 2
    assert st.prompt_tokens == 0 and reply.prompt_tokens is None


def test_the_first_listed_model_is_used_when_none_is_set() -> None:
    with FaultServer("openai_usage") as srv:
        e = engine(srv.url, model="")
        assert e.name == "test"
        consume(e.reply(ChatRequest(MSG, GREEDY)))
        assert srv.requests[0]["model"] == "fault-model" and e.name == "test · fault-model"
        check = e.check()
    assert check.ok and check.models == ("fault-model",) and check.latency_s is not None
    assert check.message.startswith("1 model, answered in ")
    with FaultServer("openai_usage") as srv:
        check = engine(srv.url, model="other").check()
    assert not check.ok and "'other' is not among them" in check.message


def test_continuing_an_answer_is_refused_with_a_reason() -> None:
    with pytest.raises(RemoteError, match="works with a local model only"):
        engine("http://127.0.0.1:9").reply(ChatRequest(MSG, GREEDY, continue_text="Once upon"))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"base_url": "localhost:8080"}, "not an http"),
        ({"api": "grpc"}, "unknown API"),
        ({"timeout_s": 0}, "timeouts must be greater than 0"),
        ({"name": " "}, "needs a name"),
        ({"base_url": "https://h", "ca_file": "/nonexistent/ca.pem"}, "cannot read the CA file"),
    ],
)
def test_bad_settings_are_one_line_errors(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(EngineError, match=message):
        engine("http://127.0.0.1:9", **kw)


def test_bad_sampling_is_refused_before_sending() -> None:
    with pytest.raises(EngineError, match="max_tokens"):
        engine("http://127.0.0.1:9").reply(ChatRequest(MSG, SamplingParams(max_tokens=0)))


# -- TLS ---------------------------------------------------------------------------------------


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[FaultServer, Path]]:
    """The fault server behind TLS with a self-signed certificate for 127.0.0.1."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    srv = FaultServer("openai_usage")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.httpd.socket = ctx.wrap_socket(srv.httpd.socket, server_side=True)
    srv.url = srv.url.replace("http://", "https://")
    with srv:
        yield srv, cert


def test_tls_is_verified_by_default(tls_server: tuple[FaultServer, Path]) -> None:
    srv, cert = tls_server
    with pytest.raises(RemoteConnectionError, match="TLS error: CERTIFICATE_VERIFY_FAILED"):
        engine(srv.url).list_models()
    # A private CA file, or verification turned off, lets the same server through.
    assert engine(srv.url, ca_file=str(cert)).list_models() == ["fault-model"]
    reply = engine(srv.url, verify_tls=False).reply(ChatRequest(MSG, GREEDY))
    assert "".join(reply) == "One two three"


def test_bench_and_remote_engine_share_one_client() -> None:
    """`candlewick bench --url` builds a StreamingClient; the remote engine's endpoint builds
    the same class with the connection's settings."""
    c = RemoteEndpoint("x", "http://127.0.0.1:1/v1", api_key="k", timeout_s=7).client()
    assert type(c) is StreamingClient
    assert (c.idle_timeout_s, c.api_key, c.user_agent) == (7, "k", "candlewick")


def test_wrong_key_on_a_fault_server_is_not_an_auth_error() -> None:
    """Only 401/403 mean a bad key; other statuses are reported with the server's words."""
    with FaultServer("http503_text") as srv, pytest.raises(RemoteHTTPError) as ei:
        consume(engine(srv.url).reply(ChatRequest(MSG, GREEDY)))
    assert not isinstance(ei.value, RemoteAuthError) and ei.value.status == 503
