"""The remote engine against two real OpenAI-compatible servers on SmolLM2: `candlewick serve`
(which also speaks Ollama) and llama-cpp-python's bundled server."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from pathlib import Path

import pytest

from engine.host.chat_engine import ChatEngine, ChatRequest, EmbeddedEngine, ReplyStream
from engine.host.runtime import Model
from engine.host.stats import GenerationStats
from engine.remote.engines import (
    RemoteAuthError,
    RemoteConnectionError,
    RemoteDroppedError,
    RemoteEndpoint,
    RemoteEngine,
)
from engine.settings import SamplingParams
from tests.engine.clients.bench_servers import candlewick_serve
from tests.engine.remote.conftest import API_KEY

MSG = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Name three colours."},
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, seed=1)


def check_client_stats(st: GenerationStats, reply: ReplyStream, n_pieces: int) -> None:
    assert st.measured_on == "client"
    assert st.stop_reason in ("stop", "length")
    assert 0 < st.ttft_s <= st.total_s
    if "gen_tokens" in st.server_usage:
        assert st.gen_tokens == reply.generated_tokens >= 1
    else:
        assert st.gen_tokens == n_pieces
    if "prompt_tokens" in st.server_usage:
        assert st.prompt_tokens == reply.prompt_tokens and st.prompt_tokens > 10
    else:
        assert st.prompt_tokens == 0 and reply.prompt_tokens is None
    if st.gen_tokens > 2:
        assert st.gen_tps > 0 and st.gen_tps == st.gen_tps_wall


def test_candlewick_serve_streams_a_chat(
    candlewick_endpoint: RemoteEndpoint, smollm2: Model
) -> None:
    engine = RemoteEngine(candlewick_endpoint)
    assert isinstance(engine, ChatEngine)
    check = engine.check()
    assert check.ok, check.message
    assert check.models == ("default",) and engine.list_models() == ["default"]
    reply = engine.reply(ChatRequest(MSG, GREEDY))
    assert isinstance(reply, ReplyStream)
    pieces = list(reply)
    assert len(pieces) > 1 and "".join(pieces) == reply.text
    st = reply.stats
    # Candlewick sends its usage report: both counts come from the server.
    assert st.server_usage == ("prompt_tokens", "gen_tokens")
    check_client_stats(st, reply, len(pieces))
    # The same greedy question through the embedded engine gives the same answer.
    smollm2.reset_cache()
    # A remote chat sends temperature, top-p, seed and the token limit; the server's defaults
    # do the rest, and an OpenAI request that sets no repeat penalty gets none.
    same = dataclasses.replace(GREEDY, repeat_penalty=1.0)
    local = EmbeddedEngine(smollm2).reply(ChatRequest(MSG, same))
    assert "".join(local) == reply.text
    assert local.prompt_tokens == reply.prompt_tokens
    assert local.stats.gen_tokens == st.gen_tokens and local.stats.measured_on == "engine"


def test_llama_cpp_server_streams_a_chat(
    llama_endpoint: RemoteEndpoint, smollm2_path: Path
) -> None:
    engine = RemoteEngine(llama_endpoint)
    models = engine.list_models()
    assert len(models) == 1 and models[0].endswith(smollm2_path.name)
    reply = engine.reply(ChatRequest(MSG, GREEDY))
    pieces = list(reply)
    assert pieces and reply.text.strip()
    assert engine.model == models[0]  # no model set: the server's only one is used
    check_client_stats(reply.stats, reply, len(pieces))


def test_max_tokens_and_cancel_on_a_real_server(llama_endpoint: RemoteEndpoint) -> None:
    engine = RemoteEngine(llama_endpoint)
    reply = engine.reply(ChatRequest(MSG, SamplingParams(temperature=0.0, max_tokens=3)))
    list(reply)
    assert reply.stats.stop_reason == "length"
    cancel = threading.Event()
    story = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    reply = engine.reply(
        ChatRequest(story, SamplingParams(temperature=0.7, max_tokens=400, seed=3)), cancel
    )
    n = 0
    for _ in reply:
        n += 1
        if n == 3:
            cancel.set()
    assert reply.stats.stop_reason == "cancelled" and 3 <= n < 400


def test_ollama_dialect_against_candlewick_serve(candlewick_server: tuple[str, int]) -> None:
    ep = RemoteEndpoint(
        name="serve-ollama",
        base_url=candlewick_server[0],
        api="ollama",
        api_key=API_KEY,
        timeout_s=120,
    )
    engine = RemoteEngine(ep)
    assert "default" in engine.list_models()
    reply = engine.reply(ChatRequest(MSG, GREEDY))
    pieces = list(reply)
    assert pieces and "".join(pieces) == reply.text
    st = reply.stats
    assert st.server_usage == ("prompt_tokens", "gen_tokens")  # prompt_eval_count, eval_count
    check_client_stats(st, reply, len(pieces))


@pytest.mark.parametrize("key", ["wrong-key-000000", None])
def test_wrong_or_missing_key_is_an_auth_error(
    candlewick_endpoint: RemoteEndpoint, key: str | None
) -> None:
    ep = RemoteEndpoint(
        name="local-serve", base_url=candlewick_endpoint.base_url, model="default", api_key=key
    )
    engine = RemoteEngine(ep)
    check = engine.check()
    assert not check.ok and isinstance(check.error, RemoteAuthError)
    assert check.message == "local-serve: wrong or missing API key (HTTP 401)"
    with pytest.raises(
        RemoteAuthError,
        match=r"^local-serve: wrong or missing API key "
        r"\(HTTP 401\)$",
    ) as ei:
        list(engine.reply(ChatRequest(MSG, GREEDY)))
    assert ei.value.status == 401 and ei.value.partial == ""
    with pytest.raises(RemoteAuthError):
        RemoteEngine(ep.with_model("")).list_models()
    ollama = RemoteEngine(
        RemoteEndpoint("o", ep.base_url, api="ollama", model="default", api_key=key)
    )
    with pytest.raises(RemoteAuthError):
        list(ollama.reply(ChatRequest(MSG, GREEDY)))


@pytest.mark.model
def test_server_killed_mid_stream(tmp_path: Path) -> None:
    """The server process dies while answering: the reply ends with a 'dropped' error that
    keeps what arrived, and the next request finds nobody listening."""
    with candlewick_serve(tmp_path / "serve.log", parallel=1, ctx=1024) as (url, pid):
        engine = RemoteEngine(
            RemoteEndpoint(name="doomed", base_url=url, model="default", timeout_s=60)
        )
        story = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
        reply = engine.reply(
            ChatRequest(story, SamplingParams(temperature=0.7, max_tokens=800, seed=3))
        )
        received: list[str] = []
        with pytest.raises(RemoteDroppedError) as ei:
            for piece in reply:
                received.append(piece)
                if len(received) == 5:
                    os.kill(pid, signal.SIGKILL)
    e = ei.value
    assert len(received) >= 5 and e.partial == "".join(received) == reply.text
    assert str(e).startswith("doomed: the connection dropped mid-answer (")
    assert str(e).endswith(f"the partial answer ({len(e.partial)} characters) is kept")
    assert e.stats is not None and e.stats.stop_reason == "error"
    assert e.stats.gen_tokens == len(received) and e.stats.server_usage == ()
    with pytest.raises(RemoteConnectionError, match="connection refused"):
        list(engine.reply(ChatRequest(story, GREEDY)))
