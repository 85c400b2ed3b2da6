"""Embeddings go to the embedding model a request names (a GGUF whose pooling type says it is
one: all-MiniLM-L6-v2 here), loaded on demand beside a chat model, with its own pooling and
its own vector size; the chat model is not asked. An embedding model refuses to generate text
with a 400 naming it, through the official openai and ollama clients."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest

from engine.host.host import Loadable, ModelHost
from engine.host.runtime import Model
from engine.server import ServerState, ServerThread
from engine.server.embeddings import Embedder
from engine.settings import LoadParams
from tests.engine.server.conftest import API_KEY, http, make_config

pytestmark = pytest.mark.slow
PARAMS = LoadParams(n_ctx=1024, n_seq_max=2, n_threads=2)
AUTH = {"Authorization": f"Bearer {API_KEY}"}
FOOD = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (
        math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    )


@pytest.fixture
def server(smollm2_path: Path, minilm_path: Path) -> Iterator[tuple[ServerThread, ModelHost]]:
    catalog = [
        Loadable("smollm2", smollm2_path, PARAMS, title="SmolLM2"),
        Loadable("minilm", minilm_path, PARAMS, aliases=("all-minilm",), title="all-MiniLM-L6-v2"),
    ]
    host = ModelHost(lambda: catalog)
    state = ServerState(make_config(max_tokens_cap=16), host=host)
    srv = ServerThread(state).start()
    yield srv, host
    srv.stop()
    state.close()
    host.close()


def test_an_embedding_model_is_one_by_its_file(minilm_path: Path, smollm2_path: Path) -> None:
    with Model(minilm_path, LoadParams(n_ctx=4096, n_threads=2)) as m:
        # Its context: one sequence of at most what it was trained on, in embeddings mode.
        assert m.embedding_only and m.n_ctx == 512 and m.params.embeddings
        e = Embedder(m)
        try:
            vec, n = e.embed("hello world")
            assert len(vec) == 384 and n >= 3
            assert abs(math.fsum(v * v for v in vec) - 1.0) < 1e-4
            with pytest.raises(Exception, match="at most 512"):
                e.embed("word " * 600)
        finally:
            e.close()
    with Model(smollm2_path, LoadParams(n_ctx=512, n_threads=2)) as chat:
        assert not chat.embedding_only


def test_a_batch_embeds_as_one_input_at_a_time_does(minilm_path: Path) -> None:
    # Inputs of every size, more of them than one decode takes (512 tokens), so the batch is
    # several decodes of several sequences each.
    texts = [FOOD[i % 3] * (1 + i % 7) for i in range(20)] + ["word " * 500, "short"]
    with Model(minilm_path, LoadParams(n_ctx=512, n_threads=2)) as m:
        e = Embedder(m)
        try:
            alone = [e.embed(t) for t in texts]
            together = e.embed_many(texts)
            assert [n for _, n in together] == [n for _, n in alone]
            groups = e._groups([[0] * n for _, n in alone])
            assert len(groups) > 2 and max(len(g) for g in groups) > 1  # several, packed
            assert (
                min(cosine(a, b) for (a, _), (b, _) in zip(alone, together, strict=True)) >= 0.999
            )
            # The vectors still mean something: the food sentences stay near and far.
            vec = {t: v for t, (v, _) in zip(texts, together, strict=True)}
            assert cosine(vec[FOOD[0]], vec[FOOD[1]]) > cosine(vec[FOOD[0]], vec[FOOD[2]])
            assert e.embed_many([]) == []
            with pytest.raises(Exception, match=r"input 1 is 601 tokens; .* at most 512"):
                e.embed_many(["fine", "word " * 599])
        finally:
            e.close()


def test_a_text_generator_batches_its_mean_pooled_embeddings_too(smollm2_path: Path) -> None:
    # A causal model: the sequences share one KV cache in the batch, masked from each other.
    with Model(smollm2_path, LoadParams(n_ctx=512, n_threads=2)) as m:
        e = Embedder(m)
        try:
            alone = [e.embed(t)[0] for t in FOOD]
            together = [v for v, _ in e.embed_many(FOOD)]
            assert len(e._groups([[0] * 10] * 3)) == 1
            assert min(cosine(a, b) for a, b in zip(alone, together, strict=True)) >= 0.999
        finally:
            e.close()


def test_embeddings_go_to_the_named_embedding_model(server: tuple[ServerThread, ModelHost]) -> None:
    srv, host = server
    with openai.OpenAI(
        base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300
    ) as client:
        chat = client.chat.completions.create(
            model="smollm2",
            max_tokens=2,
            temperature=0,
            messages=[{"role": "user", "content": "Hi"}],
        )
        assert chat.model == "smollm2"
        got = client.embeddings.create(model="all-minilm", input=FOOD)
        assert got.model == "minilm" and len(got.data) == 3
        vecs = [d.embedding for d in got.data]
        assert {len(v) for v in vecs} == {384}  # MiniLM's size, not SmolLM2's 576
        near, far = cosine(vecs[0], vecs[1]), cosine(vecs[0], vecs[2])
        assert near > 0.6 and far < 0.3, (near, far)  # a sentence model, pooled as it says
        # A chat model named for embeddings still answers (mean pooling, as Ollama does).
        own = client.embeddings.create(model="smollm2", input="Hi")
        assert len(own.data[0].embedding) == 576
        assert sorted(host.names()) == ["minilm", "smollm2"]

        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model="minilm", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
            )
        assert "'minilm' is an embedding model" in str(e.value)
        assert e.value.body["param"] == "model"  # type: ignore[index]

    o = ollama.Client(host=srv.url, headers=AUTH)
    r = o.embed(model="minilm", input=FOOD[0])
    assert len(r.embeddings[0]) == 384
    with pytest.raises(ollama.ResponseError) as oe:
        o.generate(model="minilm", prompt="Hi")
    assert oe.value.status_code == 400 and "embedding model" in str(oe.value)
    assert o.generate(model="minilm", prompt="").done  # an empty prompt only loads it
    assert o.show("minilm").capabilities == ["embedding"]
    assert "completion" in (o.show("smollm2").capabilities or [])
    o._client.close()
    r2 = http.get(srv.url + "/api/ps", headers=AUTH)
    assert {m["name"] for m in r2.json()["models"]} == {"minilm", "smollm2"}
