"""Unknown request keys (issue #35): on every route a key the body's model does not declare is
a 400 naming it, in the dialect's error shape, before the model sees anything; the short
allow-list of harmless keys official clients send (`body_model.IGNORED`) is taken."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine.server import ServerThread
from engine.server.body_model import IGNORED, UNKNOWN
from engine.server.protocol import anthropic, embeddings, infill, ollama, openai, responses
from engine.server.protocol.anthropic import AnthropicMessagesRequest
from engine.server.protocol.embeddings import EmbeddingRequest
from engine.server.protocol.infill import InfillRequest
from engine.server.protocol.ollama import OllamaChatRequest
from engine.server.protocol.openai import ChatCompletionRequest
from engine.server.protocol.parse import parse_body
from engine.server.protocol.responses import ResponsesRequest
from tests.engine.server.conftest import API_KEY, http, make_config, open_document
from tests.fake_server_engine import FakeModel, fake_model, serve_fake

# The modules whose models the allow-list names.
DIALECTS = (openai, embeddings, ollama, responses, anthropic, infill)
AUTH = {"Authorization": f"Bearer {API_KEY}"}
M = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
INFILL = {"input_prefix": "def f(", "input_suffix": ")"}


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeModel]:
    with fake_model(tmp_path_factory.mktemp("models")) as model:
        yield model


@pytest.fixture(scope="module")
def srv(fake: FakeModel) -> Iterator[ServerThread]:
    with serve_fake(fake, make_config(model_id="fake")) as s:
        yield s


# (path, a valid body, the same body with an unknown nested key, where that key is)
ROUTES: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    (
        "/v1/chat/completions",
        {"messages": M},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "x": 1}]}]},
        "messages[0].content[0].x",
    ),
    (
        "/v1/chat/completions",
        {"messages": M, "tools": [TOOL]},
        {"messages": M, "tools": [{**TOOL, "function": {**TOOL["function"], "x": 1}}]},
        "tools[0].function.x",
    ),
    ("/v1/completions", {"prompt": "Once"}, {"prompt": "Once", "stream_options": {"x": 1}}, ""),
    ("/v1/embeddings", {"input": "a"}, {"input": "a"}, ""),
    (
        "/v1/rerank",
        {"query": "q", "documents": ["a"]},
        {"query": "q", "documents": [{"text": "a", "x": 1}]},
        "documents[0].x",
    ),
    (
        "/api/chat",
        {"model": "fake", "messages": M},
        {"model": "fake", "messages": M, "options": {"x": 1}},
        "options.x",
    ),
    (
        "/api/chat",
        {"model": "fake", "messages": M},
        {"model": "fake", "messages": [{"role": "user", "content": "Hi", "x": 1}]},
        "messages[0].x",
    ),
    (
        "/api/generate",
        {"model": "fake", "prompt": "Hi"},
        {"model": "fake", "prompt": "Hi", "options": {"x": 1}},
        "options.x",
    ),
    ("/api/embed", {"model": "fake", "input": "a"}, {"model": "fake", "input": "a"}, ""),
    ("/api/show", {"model": "fake"}, {"model": "fake"}, ""),
    ("/v1/models/fake/load", {}, {}, ""),
    (
        "/v1/responses",
        {"input": "Hi"},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi", "x": 1}]}]},
        "input[0].content[0].x",
    ),
    (
        "/v1/messages",
        {"max_tokens": 5, "messages": M},
        {"max_tokens": 5, "messages": M, "tools": [{"name": "t", "input_schema": {}, "x": 1}]},
        "tools[0].x",
    ),
    (
        "/v1/messages/count_tokens",
        {"messages": M},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "x": 1}]}]},
        "messages[0].content[0].x",
    ),
]


def _error(path: str, r: Any) -> tuple[str, str | None]:
    """The message and the param of a 400 in the path's dialect."""
    assert r.status_code == 400, (path, r.text)
    body = r.json()
    if path.startswith("/api/"):
        assert set(body) == {"error"}
        return body["error"], None
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return body["error"]["message"], None
    assert body["error"]["type"] == "invalid_request_error"
    return body["error"]["message"], body["error"]["param"]


@pytest.mark.parametrize(("path", "ok", "nested", "where"), ROUTES, ids=lambda x: str(x)[:40])
def test_an_unknown_key_is_a_400_naming_it(
    srv: ServerThread,
    fake: FakeModel,
    path: str,
    ok: dict[str, Any],
    nested: dict[str, Any],
    where: str,
) -> None:
    fake.reset()
    bodies = [({**ok, "frobnicate": True}, "frobnicate", "frobnicate")]
    if where:
        bodies.append((nested, where, where.split(".")[0].split("[")[0]))
    for body, named, param in bodies:
        r = http.post(srv.url + path, headers=AUTH, json=body)
        message, got = _error(path, r)
        assert message == f"'{named}' {UNKNOWN}", (path, message)
        if got is not None or not path.startswith(("/api/", "/v1/messages")):
            assert got == param
    assert fake.seen == []


def _known(name: str) -> type[BaseModel]:
    found = [getattr(m, name) for m in DIALECTS if hasattr(m, name)]
    assert len(found) == 1, name
    return found[0]  # type: ignore[no-any-return]


# Where each model of the allow-list sits in a body: model name -> (request model, body with
# the key put in that model's place).
PLACES: dict[str, Callable[[str], tuple[type[BaseModel], dict[str, Any]]]] = {
    "_OpenAISampling": lambda k: (ChatCompletionRequest, {"messages": M, k: "v"}),
    "LlamaChatFields": lambda k: (ChatCompletionRequest, {"messages": M, k: True}),
    "InfillRequest": lambda k: (InfillRequest, {**INFILL, k: 0}),
    "InfillChunk": lambda k: (InfillRequest, {**INFILL, "input_extra": [{"text": "t", k: 1.5}]}),
    "ChatMessage": lambda k: (
        ChatCompletionRequest,
        {"messages": [{"role": "assistant", "content": "x", k: []}, *M]},
    ),
    "EmbeddingRequest": lambda k: (EmbeddingRequest, {"input": "a", k: "v"}),
    "OllamaFunctionCall": lambda k: (
        OllamaChatRequest,
        {
            "model": "m",
            "messages": [
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", k: 0}}]},
                *M,
            ],
        },
    ),
    "ResponsesRequest": lambda k: (ResponsesRequest, {"input": "x", k: "24h"}),
    "ResponsesMessageItem": lambda k: (
        ResponsesRequest,
        {"input": [{"type": "message", "role": "assistant", "content": "x", k: "v"}]},
    ),
    "ResponsesTextPart": lambda k: (
        ResponsesRequest,
        {
            "input": [
                {"role": "assistant", "content": [{"type": "output_text", "text": "x", k: []}]}
            ]
        },
    ),
    "ResponsesFunctionCallItem": lambda k: (
        ResponsesRequest,
        {
            "input": [
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", k: "v"}
            ]
        },
    ),
    "ResponsesFunctionCallOutputItem": lambda k: (
        ResponsesRequest,
        {"input": [{"type": "function_call_output", "call_id": "c", "output": "r", k: "v"}]},
    ),
    "ResponsesReasoningItem": lambda k: (
        ResponsesRequest,
        {"input": [{"type": "reasoning", "summary": [], k: "v"}]},
    ),
    "AnthropicMessagesRequest": lambda k: (
        AnthropicMessagesRequest,
        {"max_tokens": 1, "messages": M, k: "eu"},
    ),
    "AnthropicTextBlock": lambda k: (
        AnthropicMessagesRequest,
        {
            "max_tokens": 1,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x", k: None}]}],
        },
    ),
    "AnthropicTool": lambda k: (
        AnthropicMessagesRequest,
        {"max_tokens": 1, "messages": M, "tools": [{"name": "t", "input_schema": {}, k: True}]},
    ),
}


def _parse(model: type[BaseModel], body: dict[str, Any]) -> Any:
    return parse_body(model, body)


@pytest.mark.parametrize(
    ("owner", "key"), [(o, k) for o, keys in IGNORED.items() for k in keys], ids=str
)
def test_each_allowed_key_is_taken_and_documented(owner: str, key: str) -> None:
    assert issubclass(_known(owner), BaseModel)
    model, body = PLACES[owner](key)
    _parse(model, body)
    # The same body with the key misspelt is refused: the allow-list is by model and key.
    if owner in (
        "_OpenAISampling",
        "LlamaChatFields",
        "InfillRequest",
        "EmbeddingRequest",
        "ResponsesRequest",
        "AnthropicMessagesRequest",
    ):
        with pytest.raises(Exception, match=UNKNOWN):
            _parse(model, {**{k: v for k, v in body.items() if k != key}, key + "_": "v"})
    doc = open_document()["components"]["schemas"]
    documented = [
        s
        for n, s in doc.items()
        if n == owner or n in {c.__name__ for c in _known(owner).__subclasses__()}
    ]
    assert any(key in s.get("properties", {}) for s in documented), owner


def test_the_docs_list_every_allowed_key() -> None:
    text = (Path(__file__).parents[3] / "docs" / "server.md").read_text()
    section = text.split("### Unknown keys")[1].split("\n## ")[0]
    for keys in IGNORED.values():
        for key in keys:
            assert f"`{key}`" in section, key


def test_request_models_forbid_and_answers_stay_open() -> None:
    """The document says additionalProperties: false for every request model, and nothing
    of the kind for answers (clients read answers with keys they do not know)."""
    doc = open_document()["components"]["schemas"]
    assert doc["ChatCompletionRequest"]["additionalProperties"] is False
    assert doc["ChatMessage"]["additionalProperties"] is False
    assert doc["AnthropicTextBlock"]["additionalProperties"] is False
    assert "additionalProperties" not in doc["ChatCompletion"]
    assert "additionalProperties" not in doc["ResponseObject"]
