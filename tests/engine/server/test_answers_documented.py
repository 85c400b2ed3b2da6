"""Every route's answer is what the OpenAPI document says it is: real answers of the routes
(over the fake model; embeddings over SmolLM2) are checked against the schema their route
advertises, and streamed events against the schema it gives their data, with every object
closed: a key the document does not name fails as a wrong type does. The routes build their
answers from the protocol models, so this fails when a route sends a shape of its own."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from engine.server import ServerConfig, ServerThread
from engine.server.openapi import openapi_schema
from tests.engine.server.conftest import API_KEY, http, make_config
from tests.fake_server_engine import FakeModel, fake_model, serve_fake

AUTH = {"Authorization": f"Bearer {API_KEY}"}
REPLY = "Paris is the capital of France."
M = [{"role": "user", "content": "What is the capital of France?"}]
CALL = '{"tool_calls": [{"name": "f", "arguments": {"a": 1}}]}'
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _closed(schema: Any) -> Any:
    """`schema` with every object that names its properties closed to others."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(x) for x in schema]
    return schema


@functools.cache
def _doc() -> dict[str, Any]:
    return openapi_schema(ServerConfig(port=0))


def _answer_schema(path: str, method: str, status: int) -> dict[str, Any]:
    doc = _doc()
    content = doc["paths"][path][method]["responses"][str(status)]["content"]
    return {**content["application/json"]["schema"], "components": _closed(doc["components"])}


def check(path: str, method: str, r: Any, *, route: str | None = None) -> dict[str, Any]:
    """The answer `r` of `path` (its route's template: `route`), checked against the
    schema the document gives its status; its JSON."""
    body: dict[str, Any] = r.json()
    schema = _answer_schema(route or path, method, r.status_code)
    jsonschema.Draft202012Validator(schema).validate(body)
    return body


def check_event(path: str, event: dict[str, Any]) -> None:
    """A streamed event's data, checked against the schema the document gives the data of
    `path`'s server-sent events (one of the stream's event models)."""
    doc = _doc()
    sse = doc["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]
    data = sse["schema"]["properties"]["data"]
    # OpenAI's streams end with a data that is not JSON ([DONE]): the JSON ones' branch.
    events = next(x for x in data.get("anyOf", [data]) if "contentSchema" in x)["contentSchema"]
    schema = {**events, "components": _closed(doc["components"])}
    jsonschema.Draft202012Validator(schema).validate(event)


def check_line(path: str, line: dict[str, Any]) -> None:
    """An NDJSON line of `path`'s stream: each is the route's documented JSON answer."""
    jsonschema.Draft202012Validator(_answer_schema(path, "post", 200)).validate(line)


def sse_chunks(text: str) -> list[dict[str, Any]]:
    data = [x[len("data: ") :] for x in text.split("\n\n") if x.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(x) for x in data[:-1]]


@pytest.fixture(scope="module")
def module_fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeModel]:
    with fake_model(tmp_path_factory.mktemp("models")) as model:
        yield model


@pytest.fixture(scope="module")
def srv(module_fake: FakeModel) -> Iterator[ServerThread]:
    with serve_fake(module_fake, make_config(model_id="fake")) as s:
        yield s


@pytest.fixture
def fake(module_fake: FakeModel) -> Iterator[FakeModel]:
    module_fake.reset()
    yield module_fake
    assert module_fake.loop.wait_idle(10)


def post(srv: ServerThread, path: str, body: dict[str, Any]) -> Any:
    return http.post(srv.url + path, headers=AUTH, json=body)


def get(srv: ServerThread, path: str) -> Any:
    return http.get(srv.url + path, headers=AUTH)


def test_the_model_routes_and_health(srv: ServerThread, fake: FakeModel) -> None:
    assert check("/v1/models", "get", get(srv, "/v1/models"))["data"][0]["id"] == "fake"
    card = check("/v1/models/{model_id}", "get", get(srv, "/v1/models/fake"))
    assert card["loaded"] is True
    loaded = post(srv, "/v1/models/fake/load", {"keep_alive": -1})
    assert check("/v1/models/{model_id}/load", "post", loaded)["id"] == "fake"
    health = check("/health", "get", http.get(srv.url + "/health"))
    assert health["status"] == "ok" and health["slots_total"] == 2


def test_openai_answers(srv: ServerThread, fake: FakeModel) -> None:
    fake.script(REPLY, REPLY, REPLY, REPLY)
    chat = check("/v1/chat/completions", "post", post(srv, "/v1/chat/completions", {"messages": M}))
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": REPLY}
    assert chat["choices"][0]["logprobs"] is None
    text = check("/v1/completions", "post", post(srv, "/v1/completions", {"prompt": "Once"}))
    assert text["choices"][0]["text"] == REPLY
    stream = {"stream": True, "stream_options": {"include_usage": True}}
    r = post(srv, "/v1/chat/completions", {"messages": M, **stream})
    chunks = sse_chunks(r.text)
    for c in chunks:
        check_event("/v1/chat/completions", c)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    said = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert said == REPLY
    r = post(srv, "/v1/completions", {"prompt": "Once", **stream})
    chunks = sse_chunks(r.text)
    for c in chunks:
        check_event("/v1/completions", c)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == REPLY


def test_openai_tool_calls(srv: ServerThread, fake: FakeModel) -> None:
    fake.script(CALL, CALL)
    body = {"messages": M, "tools": [TOOL]}
    chat = check("/v1/chat/completions", "post", post(srv, "/v1/chat/completions", body))
    message = chat["choices"][0]["message"]
    assert message["content"] is None and message["tool_calls"][0]["function"]["name"] == "f"
    r = post(srv, "/v1/chat/completions", {**body, "stream": True})
    chunks = sse_chunks(r.text)
    for c in chunks:
        check_event("/v1/chat/completions", c)
    calls = [c for c in chunks if c["choices"][0]["delta"].get("tool_calls")]
    assert calls[0]["choices"][0]["delta"]["tool_calls"][0]["index"] == 0


def test_ollama_answers(srv: ServerThread, fake: FakeModel) -> None:
    fake.script(REPLY, REPLY, REPLY, REPLY)
    assert check("/api/version", "get", get(srv, "/api/version"))["version"]
    assert check("/api/tags", "get", get(srv, "/api/tags"))["models"][0]["name"] == "fake"
    assert check("/api/ps", "get", get(srv, "/api/ps"))["models"][0]["name"] == "fake"
    show = check("/api/show", "post", post(srv, "/api/show", {"model": "fake"}))
    assert "completion" in show["capabilities"]
    whole = {"model": "fake", "stream": False}
    chat = check("/api/chat", "post", post(srv, "/api/chat", {**whole, "messages": M}))
    assert chat["message"]["content"] == REPLY and chat["done"] is True
    gen = check("/api/generate", "post", post(srv, "/api/generate", {**whole, "prompt": "Hi"}))
    assert gen["response"] == REPLY and gen["eval_count"] == 6
    empty = check("/api/generate", "post", post(srv, "/api/generate", {"model": "fake"}))
    assert empty["done_reason"] == "load"
    for path, body in (("/api/chat", {"messages": M}), ("/api/generate", {"prompt": "Hi"})):
        r = post(srv, path, {"model": "fake", **body})
        lines = [json.loads(x) for x in r.text.splitlines()]
        for line in lines:
            check_line(path, line)
        assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"


def test_agent_answers(srv: ServerThread, fake: FakeModel) -> None:
    fake.script(REPLY, REPLY)
    resp = check("/v1/responses", "post", post(srv, "/v1/responses", {"input": "Hi"}))
    assert resp["status"] == "completed"
    msg = {"max_tokens": 32, "messages": M}
    reply = check("/v1/messages", "post", post(srv, "/v1/messages", msg))
    assert reply["content"][0] == {"type": "text", "text": REPLY}
    count = post(srv, "/v1/messages/count_tokens", {"messages": M})
    assert check("/v1/messages/count_tokens", "post", count)["input_tokens"] > 0


@pytest.mark.parametrize("reply", [REPLY, CALL])
def test_each_responses_event_is_its_model(srv: ServerThread, fake: FakeModel, reply: str) -> None:
    fake.script(reply)
    body: dict[str, Any] = {"input": "Hi", "stream": True}
    if reply == CALL:
        body["tools"] = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
        body["tool_choice"] = "required"
    got = post(srv, "/v1/responses", body)
    names = []
    for block in got.text.strip().split("\n\n"):
        name, data = (line.split(": ", 1)[1] for line in block.split("\n"))
        event = json.loads(data)
        assert event["type"] == name and event["sequence_number"] == len(names)
        check_event("/v1/responses", event)
        names.append(name)
    assert names[-1] == "response.completed"
    if reply == CALL:
        assert "response.function_call_arguments.done" in names


@pytest.mark.parametrize("reply", [REPLY, "<think>Hmm.</think>" + REPLY, CALL])
def test_each_anthropic_event_is_its_model(srv: ServerThread, fake: FakeModel, reply: str) -> None:
    fake.script(reply)
    body = {"max_tokens": 64, "messages": M, "stream": True}
    if reply == CALL:
        body["tools"] = [{"name": "f", "input_schema": {"type": "object"}}]
        body["tool_choice"] = {"type": "any"}
    r = post(srv, "/v1/messages", body)
    names = []
    for block in r.text.strip().split("\n\n"):
        name, data = (line.split(": ", 1)[1] for line in block.split("\n"))
        event = json.loads(data)
        assert event["type"] == name
        check_event("/v1/messages", event)
        names.append(name)
    assert names[0] == "message_start" and names[-1] == "message_stop"


def test_embedding_answers(server: ServerThread) -> None:
    """Over SmolLM2: the fake model has no embeddings."""
    for fmt in ("float", "base64"):
        body = {"input": ["a", "b"], "encoding_format": fmt}
        out = check("/v1/embeddings", "post", post(server, "/v1/embeddings", body))
        assert [e["index"] for e in out["data"]] == [0, 1]
    body = {"model": "smollm2", "input": "a"}
    assert len(check("/api/embed", "post", post(server, "/api/embed", body))["embeddings"]) == 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": []}),
        ("/api/chat", {"model": "fake", "messages": []}),
        ("/v1/messages", {"max_tokens": 1, "messages": []}),
    ],
)
def test_each_dialects_errors(srv: ServerThread, path: str, body: dict[str, Any]) -> None:
    r = post(srv, path, body)
    assert r.status_code == 400
    check(path, "post", r)


def test_the_check_fails_on_a_shape_the_document_does_not_name(
    srv: ServerThread, fake: FakeModel
) -> None:
    fake.script(REPLY, REPLY)
    r = post(srv, "/v1/chat/completions", {"messages": M})
    schema = _answer_schema("/v1/chat/completions", "post", 200)
    good = r.json()
    jsonschema.Draft202012Validator(schema).validate(good)
    for bad in (
        {**good, "extra": 1},
        {**good, "created": "now"},
        {**good, "choices": [{**good["choices"][0], "logprobs": {"content": []}}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft202012Validator(schema).validate(bad)
    chunk = {**sse_chunks(post(srv, "/v1/completions", {"prompt": "x", "stream": True}).text)[0]}
    with pytest.raises(jsonschema.ValidationError):
        check_event("/v1/completions", {**chunk, "text": "at the top"})
    with pytest.raises(jsonschema.ValidationError):
        check_event("/v1/completions", {**chunk, "object": "chat.completion.chunk"})
