"""The Ollama routes driven by the official `ollama` client."""

from __future__ import annotations

from collections.abc import Iterator

import ollama
import pytest

from engine.server import ServedModel, ServerThread
from tests.engine.server.conftest import API_KEY, assert_no_leak, http

OPTS = {"temperature": 0, "num_predict": 16}
MSG = [{"role": "user", "content": "Name a big city."}]


@pytest.fixture
def client(server: ServerThread) -> Iterator[ollama.Client]:
    with ollama.Client(host=server.url, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        yield c


def test_list_show_version(client: ollama.Client, server: ServerThread) -> None:
    models = client.list().models
    assert [m.model for m in models] == ["smollm2"]
    assert models[0].size and models[0].details and models[0].details.format == "gguf"
    shown = client.show("smollm2")
    assert shown.details is not None and shown.details.family == "llama"
    assert shown.modelinfo and shown.modelinfo["general.architecture"] == "llama"
    assert shown.template
    v = http.get(server.url + "/api/version", headers={"Authorization": f"Bearer {API_KEY}"})
    assert v.json()["version"]


def test_chat_streaming_matches_non_streaming(client: ollama.Client, served: ServedModel) -> None:
    whole = client.chat(model="smollm2", messages=MSG, options=OPTS, stream=False)
    assert whole.done and whole.message.content
    assert whole.eval_count and whole.prompt_eval_count
    parts = list(client.chat(model="smollm2", messages=MSG, options=OPTS, stream=True))
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].done_reason == whole.done_reason
    assert_no_leak(served)


def test_generate(client: ollama.Client) -> None:
    r = client.generate(model="smollm2", prompt="Name a planet.", options=OPTS)
    assert r.done and r.response
    raw = client.generate(
        model="smollm2", prompt="1, 2, 3,", raw=True, options={"temperature": 0, "num_predict": 4}
    )
    assert raw.eval_count == 4 and raw.done_reason == "length"
    streamed = "".join(
        p.response
        for p in client.generate(
            model="smollm2",
            prompt="1, 2, 3,",
            raw=True,
            stream=True,
            options={"temperature": 0, "num_predict": 4},
        )
    )
    assert streamed == raw.response
    # An empty prompt "loads the model", as in Ollama.
    assert client.generate(model="smollm2", prompt="").done


def test_embed(client: ollama.Client) -> None:
    r = client.embed(model="smollm2", input=["hello there", "general kenobi"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) > 100


def test_errors(client: ollama.Client, server: ServerThread) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(
            model="smollm2",
            messages=[{"role": "user", "content": "x"}],
            options={"temperature": -3},
        )
    assert e.value.status_code == 400 and "temperature" in e.value.error
    r = http.post(
        server.url + "/api/chat",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": "smollm2", "messages": "hi"},
    )
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
