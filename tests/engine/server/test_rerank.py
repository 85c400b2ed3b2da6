"""Reranking on a reranker GGUF (pooling RANK: the test reranker of tests/reranker_gguf.py, an
untrained head, so only agreement is checked): pairs packed into decodes score as each one
alone does, and /v1/rerank (with llama-server's other names for it) answers in llama-server's
shape, beside a chat model and an embedding model that it refuses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.errors import EngineError
from engine.host.host import Loadable, ModelHost
from engine.host.runtime import Model
from engine.server import ServerState, ServerThread
from engine.server.embeddings import Embedder
from engine.settings import LoadParams
from tests.engine.server.conftest import API_KEY, doc_valid, http, make_config

pytestmark = pytest.mark.slow
PARAMS = LoadParams(n_ctx=1024, n_seq_max=2, n_threads=2)
AUTH = {"Authorization": f"Bearer {API_KEY}"}
QUERY = "How do I bake bread at home?"
DOCS = [
    "Mix flour, water, salt and yeast, knead, let it rise and bake it in a hot oven.",
    "The stock market closed higher today.",
    "hello",
    "Bread needs time: a slow rise gives it flavour.",
    "A man is eating food.",
]


@pytest.fixture(scope="module")
def reranker(reranker_path: Path) -> Iterator[Embedder]:
    model = Model(reranker_path, LoadParams(n_threads=2))
    embedder = Embedder(model)
    yield embedder
    embedder.close()
    model.close()


def test_packed_pairs_score_as_each_alone(reranker: Embedder) -> None:
    # Documents of every size, more tokens than one decode takes (512), so several decodes of
    # several sequences each.
    docs = [DOCS[i % len(DOCS)] * (1 + i % 6) for i in range(24)] + ["word " * 450, "x"]
    alone = [reranker.rerank(QUERY, [d])[0] for d in docs]
    together = reranker.rerank(QUERY, docs)
    groups = reranker._groups([[0] * n for _, n in together])
    assert len(groups) > 2 and max(len(g) for g in groups) > 1  # several, packed
    assert [n for _, n in together] == [n for _, n in alone]
    for (a, _), (b, _) in zip(alone, together, strict=True):
        assert b == pytest.approx(a, abs=1e-3)
    assert reranker.rerank(QUERY, []) == []


def test_pair_overhead_is_what_a_pair_adds_to_its_texts(reranker: Embedder) -> None:
    m = reranker.model
    for doc in DOCS:
        ((_, n),) = reranker.rerank(QUERY, [doc])
        q = len(m.tokenize(QUERY, add_special=False, parse_special=False))
        d = len(m.tokenize(doc, add_special=False, parse_special=False))
        assert n - q - d == reranker.pair_overhead() == 3  # [CLS] q [SEP] d [SEP]


def test_a_pair_too_long_is_named(reranker: Embedder) -> None:
    with pytest.raises(EngineError, match=r"^document 1 is \d+ tokens with the query; .* 512$"):
        reranker.rerank(QUERY, ["fine", "word " * 520])
    with pytest.raises(EngineError, match=r"^the document is \d+ tokens"):
        reranker.rerank("word " * 300, ["word " * 300])


def test_a_reranker_does_not_embed_and_an_embedder_does_not_rerank(
    reranker: Embedder, minilm_path: Path
) -> None:
    with pytest.raises(EngineError, match="is a reranking model; it gives relevance scores"):
        reranker.embed_many(["hello"])
    with Model(minilm_path, LoadParams(n_threads=2)) as m:
        e = Embedder(m)
        try:
            assert not e.is_reranker
            with pytest.raises(EngineError, match="is not a reranking model"):
                e.rerank(QUERY, DOCS)
            assert len(e.embed("hello")[0]) == 384  # its embeddings are still normalised
        finally:
            e.close()


@pytest.fixture
def server(
    smollm2_path: Path, minilm_path: Path, reranker_path: Path
) -> Iterator[tuple[ServerThread, ModelHost]]:
    catalog = [
        Loadable("smollm2", smollm2_path, PARAMS, title="SmolLM2"),
        Loadable("minilm", minilm_path, PARAMS, title="all-MiniLM-L6-v2"),
        Loadable("rerank", reranker_path, PARAMS, aliases=("minilm-rank",), title="MiniLM rank"),
    ]
    host = ModelHost(lambda: catalog)
    state = ServerState(make_config(max_tokens_cap=16), host=host)
    srv = ServerThread(state).start()
    yield srv, host
    srv.stop()
    state.close()
    host.close()


def _post(srv: ServerThread, path: str, body: dict[str, Any]) -> Any:
    return http.post(srv.url + path, headers=AUTH, json=body)


def test_rerank_answers_in_llama_servers_shape(
    server: tuple[ServerThread, ModelHost], reranker: Embedder
) -> None:
    srv, _ = server
    expected = reranker.rerank(QUERY, DOCS)
    r = _post(srv, "/v1/rerank", {"model": "minilm-rank", "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert doc_valid("RerankList", body)
    assert body["model"] == "rerank" and body["object"] == "list"
    n = sum(k for _, k in expected)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
    results = body["results"]
    assert sorted(x["index"] for x in results) == list(range(len(DOCS)))
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)  # best first
    for x in results:
        assert x["relevance_score"] == pytest.approx(expected[x["index"]][0], abs=1e-3)
        assert "document" not in x

    # top_n cuts the same order; return_documents adds each one's text, however sent.
    jina = [{"text": d} for d in DOCS]
    for docs in (DOCS, jina):
        r = _post(
            srv,
            "/v1/rerank",
            {
                "model": "rerank",
                "query": QUERY,
                "documents": docs,
                "top_n": 2,
                "return_documents": True,
            },
        )
        assert r.status_code == 200, r.text
        cut = r.json()["results"]
        assert doc_valid("RerankList", r.json())
        assert [x["index"] for x in cut] == [x["index"] for x in results[:2]]
        assert [x["document"] for x in cut] == [{"text": DOCS[x["index"]]} for x in cut]
    r = _post(
        srv, "/v1/rerank", {"model": "rerank", "query": QUERY, "documents": DOCS, "top_n": 99}
    )
    assert len(r.json()["results"]) == len(DOCS)

    # llama-server's other names for the route.
    for path in ("/v1/reranking", "/rerank", "/reranking"):
        r = _post(srv, path, {"model": "rerank", "query": QUERY, "documents": DOCS})
        assert r.status_code == 200, (path, r.text)
        assert [x["index"] for x in r.json()["results"]] == [x["index"] for x in results]


def _refusal(srv: ServerThread, path: str, body: dict[str, Any]) -> tuple[str | None, str]:
    r = _post(srv, path, body)
    assert r.status_code == 400, (body, r.text)
    err = r.json()["error"]
    if isinstance(err, str):  # Ollama's shape
        return None, err
    return err["param"], err["message"]


def test_rerank_refuses_what_it_cannot_do(server: tuple[ServerThread, ModelHost]) -> None:
    srv, host = server
    ok = {"model": "rerank", "query": QUERY, "documents": DOCS}
    assert _refusal(srv, "/v1/rerank", {"model": "rerank", "documents": DOCS})[0] == "query"
    assert _refusal(srv, "/v1/rerank", {**ok, "query": ""})[0] == "query"
    assert _refusal(srv, "/v1/rerank", {**ok, "documents": []})[0] == "documents"
    assert _refusal(srv, "/v1/rerank", {**ok, "documents": [1]})[0] == "documents"
    assert _refusal(srv, "/v1/rerank", {**ok, "documents": [{"txt": "a"}]})[0] == "documents"
    assert _refusal(srv, "/v1/rerank", {**ok, "top_n": 0})[0] == "top_n"
    assert _refusal(srv, "/v1/rerank", {**ok, "rank_fields": ["text"]})[0] == "rank_fields"
    assert _refusal(srv, "/v1/rerank", {**ok, "return_documents": "yes"})[0] == "return_documents"
    param, msg = _refusal(srv, "/v1/rerank", {**ok, "documents": ["a", "word " * 600]})
    assert param == "documents" and msg.startswith("document 1 is ")
    for name in ("smollm2", "minilm"):
        param, msg = _refusal(srv, "/v1/rerank", {**ok, "model": name})
        assert param == "model" and f"model {name!r} is not a reranking model" in msg

    # A reranker neither embeds nor generates.
    _, msg = _refusal(srv, "/v1/embeddings", {"model": "rerank", "input": "hello"})
    assert "is a reranking model; it gives relevance scores, not embeddings" in msg
    _, msg = _refusal(srv, "/api/embed", {"model": "rerank", "input": "hello"})
    assert "is a reranking model" in msg
    chat = {"model": "rerank", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    param, msg = _refusal(srv, "/v1/chat/completions", chat)
    assert param == "model" and "'rerank' is a reranking model: it answers /v1/rerank" in msg
    show = http.post(srv.url + "/api/show", headers=AUTH, json={"model": "rerank"})
    assert show.json()["capabilities"] == []
    assert sorted(host.names()) == ["minilm", "rerank", "smollm2"]
