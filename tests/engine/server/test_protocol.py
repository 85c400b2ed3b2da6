"""The pydantic request models against the routes' hand-written checks, and the OpenAPI
document built from the models.

Each row is a body the hand checks and `parse_body` must both accept, or both refuse naming
the same field. The hand checks run as each route calls them (the helpers of parsing.py and
chat_reply.py, and the routes' own `_common`/`_sampling`/`_think`); the few checks written
inline in a route are repeated here. Checks that need the loaded model (a template, a grammar
compiled for its vocabulary) are the routes' alone and not compared.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, get_args

import jsonschema
import pytest
from pydantic import BaseModel

from engine.server import ServerConfig, ServerState
from engine.server import protocol as p
from engine.server.chat_reply import (
    check_tool_choice,
    check_tools,
    ollama_grammar,
    openai_grammar,
)
from engine.server.errors import ApiError
from engine.server.ollama_routes import OllamaRoutes
from engine.server.openai_routes import OpenAIRoutes, embedding_inputs
from engine.server.openapi import openapi_schema
from engine.server.parsing import ROLES, get_bool, get_messages, get_str

_STATE = ServerState(ServerConfig(port=0, max_tokens_cap=64))
_OPENAI = OpenAIRoutes(_STATE)
_OLLAMA = OllamaRoutes(_STATE)


def hand_chat(body: dict[str, Any]) -> None:
    get_messages(body)
    _OPENAI._common(body)
    tools = check_tools(body.get("tools"))
    check_tool_choice(body.get("tool_choice"), tools)
    get_bool(body, "parallel_tool_calls", True)
    openai_grammar(body)
    if get_str(body, "reasoning_format", "auto") not in ("auto", "deepseek", "none"):
        raise ApiError(400, "bad reasoning_format", param="reasoning_format")


def hand_completions(body: dict[str, Any]) -> None:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "bad prompt", param="prompt")
    _OPENAI._common(body)
    if get_bool(body, "echo", False):
        raise ApiError(400, "echo", param="echo")
    openai_grammar(body)


def hand_embeddings(body: dict[str, Any]) -> None:
    get_str(body, "model")
    if get_str(body, "encoding_format", "float") not in ("float", "base64"):
        raise ApiError(400, "bad encoding_format", param="encoding_format")
    embedding_inputs(body, "input")


def hand_ollama_chat(body: dict[str, Any]) -> None:
    get_str(body, "model", required=True)
    get_messages(body, "ollama")
    _OLLAMA._sampling(body)
    get_bool(body, "stream", True)
    check_tools(body.get("tools"))
    _OLLAMA._think(body)
    ollama_grammar(body)


def hand_ollama_generate(body: dict[str, Any]) -> None:
    get_str(body, "model", required=True)
    get_str(body, "prompt", "")
    get_str(body, "system")
    get_bool(body, "raw", False)
    get_bool(body, "stream", True)
    _OLLAMA._sampling(body)
    _OLLAMA._think(body)
    ollama_grammar(body)


def hand_ollama_show(body: dict[str, Any]) -> None:
    if get_str(body, "model") is None and get_str(body, "name") is None:
        raise ApiError(400, "'model' is required")


def hand_ollama_embed(body: dict[str, Any]) -> None:
    get_str(body, "model", required=True)
    embedding_inputs(body, "input")


ROUTES: dict[str, tuple[Callable[[dict[str, Any]], None], type[BaseModel]]] = {
    "chat": (hand_chat, p.ChatCompletionRequest),
    "completions": (hand_completions, p.CompletionRequest),
    "embeddings": (hand_embeddings, p.EmbeddingRequest),
    "ollama_chat": (hand_ollama_chat, p.OllamaChatRequest),
    "ollama_generate": (hand_ollama_generate, p.OllamaGenerateRequest),
    "ollama_show": (hand_ollama_show, p.OllamaShowRequest),
    "ollama_embed": (hand_ollama_embed, p.OllamaEmbedRequest),
}

M = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                         "parameters": {"type": "object", "properties": {
                                             "city": {"type": "string"}}}}}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
HISTORY = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": None, "reasoning_content": "Look it up.",
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "get_weather",
                                         "arguments": '{"city": "Paris"}'}}]},
           {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "Sunny"}]
OLLAMA_HISTORY = [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "thinking": "Look it up.",
                   "tool_calls": [{"function": {"name": "get_weather",
                                                "arguments": {"city": "Paris"}}}]},
                  {"role": "tool", "tool_name": "get_weather", "content": "Sunny"}]

# (route, body, accepted, param): `param` is the field parse_body names where it differs from
# the hand check's (parse_body always names the top-level field).
Row = tuple[str, dict[str, Any], bool] | tuple[str, dict[str, Any], bool, str]
ROWS: list[Row] = [
    # -- /v1/chat/completions: what it took before tools --
    ("chat", {"messages": M}, True),
    ("chat", {"messages": M, "model": "x", "n": 1, "max_tokens": 5, "temperature": 0,
              "top_p": 1, "top_k": 0, "min_p": 0, "repeat_penalty": 0.01, "seed": -(2**63),
              "stop": ["a", ""], "stream": True, "stream_options": {"include_usage": True}},
     True),
    ("chat", {"messages": M, "temperature": None, "top_p": None, "seed": 2**64 - 1,
              "stop": None, "stream_options": None, "n": None, "unknown": {"x": 1}}, True),
    ("chat", {"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]},
                           {"role": "user", "content": None, "extra": 1}]}, True),
    ("chat", {}, False),
    ("chat", {"messages": []}, False),
    ("chat", {"messages": "hi"}, False),
    ("chat", {"messages": [5]}, False),
    ("chat", {"messages": [{"content": "x"}]}, False),
    ("chat", {"messages": [{"role": "wizard", "content": "x"}]}, False),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, False),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, False),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
     False),
    ("chat", {"messages": M, "n": 2}, False),
    ("chat", {"messages": M, "n": True}, False),
    ("chat", {"messages": M, "n": 1.0}, False),
    ("chat", {"messages": M, "model": 5}, False),
    ("chat", {"messages": M, "max_tokens": 0}, False),
    ("chat", {"messages": M, "max_tokens": 1.5}, False),
    ("chat", {"messages": M, "max_tokens": "5"}, False),
    ("chat", {"messages": M, "max_completion_tokens": 0}, False),
    ("chat", {"messages": M, "temperature": 2.5}, False),
    ("chat", {"messages": M, "temperature": -0.1}, False),
    ("chat", {"messages": M, "temperature": True}, False),
    ("chat", {"messages": M, "temperature": float("nan")}, False),
    ("chat", {"messages": M, "temperature": float("inf")}, False),
    ("chat", {"messages": M, "top_p": 0}, False, "top_p"),  # hand: SamplingParams, no param
    ("chat", {"messages": M, "top_p": 1.5}, False),
    ("chat", {"messages": M, "top_k": -1}, False),
    ("chat", {"messages": M, "min_p": 2}, False),
    ("chat", {"messages": M, "repeat_penalty": 0}, False),
    ("chat", {"messages": M, "seed": 2**64}, False),
    ("chat", {"messages": M, "seed": -(2**63) - 1}, False),
    ("chat", {"messages": M, "stop": [1]}, False),
    ("chat", {"messages": M, "stop": 5}, False),
    ("chat", {"messages": M, "stop": ["s"] * 17}, False),
    ("chat", {"messages": M, "stream": "yes"}, False),
    ("chat", {"messages": M, "stream": 1}, False),
    ("chat", {"messages": M, "stream_options": []}, False),
    ("chat", {"messages": M, "stream_options": {"include_usage": "yes"}}, False,
     "stream_options"),
    # -- /v1/chat/completions: tools, formats, thinking --
    ("chat", {"messages": HISTORY, "tools": [TOOL]}, True),
    ("chat", {"messages": M, "tools": [TOOL], "tool_choice": "required",
              "parallel_tool_calls": False}, True),
    ("chat", {"messages": M, "tools": [{"function": {"name": "f"}}], "tool_choice": {
        "type": "function", "function": {"name": "f"}}}, True),
    ("chat", {"messages": M, "tools": [], "tool_choice": "none"}, True),
    ("chat", {"messages": M, "tools": None, "tool_choice": None}, True),
    ("chat", {"messages": M, "tools": TOOL}, False),
    ("chat", {"messages": M, "tools": [TOOL] * 129}, False),
    ("chat", {"messages": M, "tools": [5]}, False),
    ("chat", {"messages": M, "tools": [{"type": "retrieval", "function": {"name": "f"}}]},
     False),
    ("chat", {"messages": M, "tools": [{"type": "function"}]}, False),
    ("chat", {"messages": M, "tools": [{"function": {"name": "a b"}}]}, False),
    ("chat", {"messages": M, "tools": [{"function": {"name": "x" * 65}}]}, False),
    ("chat", {"messages": M, "tools": [{"function": {"name": "f", "parameters": 5}}]}, False),
    ("chat", {"messages": M, "tools": [{"function": {"name": "f", "description": 5}}]},
     False),
    ("chat", {"messages": M, "tools": [TOOL, TOOL]}, False),
    ("chat", {"messages": M, "tool_choice": "auto"}, False),
    ("chat", {"messages": M, "tool_choice": "required"}, False),
    ("chat", {"messages": M, "tools": [TOOL], "tool_choice": "sometimes"}, False),
    ("chat", {"messages": M, "tools": [TOOL], "tool_choice": 5}, False),
    ("chat", {"messages": M, "tools": [TOOL], "tool_choice": {"type": "function"}}, False),
    ("chat", {"messages": M, "tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": "other"}}}, False),
    ("chat", {"messages": M, "parallel_tool_calls": "no"}, False),
    ("chat", {"messages": M, "response_format": {"type": "text"}}, True),
    ("chat", {"messages": M, "response_format": {"type": "json_object"}}, True),
    ("chat", {"messages": M, "response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": SCHEMA, "strict": True}}}, True),
    ("chat", {"messages": M, "response_format": {"type": "json_schema",
                                                 "json_schema": {"schema": True}}}, True),
    ("chat", {"messages": M, "response_format": {"type": "text", "json_schema": 5}}, True),
    ("chat", {"messages": M, "response_format": "json"}, False),
    ("chat", {"messages": M, "response_format": {}}, False),
    ("chat", {"messages": M, "response_format": {"type": "xml"}}, False),
    ("chat", {"messages": M, "response_format": {"type": "json_schema"}}, False),
    ("chat", {"messages": M, "response_format": {"type": "json_schema",
                                                 "json_schema": {"name": "a"}}}, False),
    ("chat", {"messages": M, "grammar": 'root ::= "yes" | "no"'}, True),
    ("chat", {"messages": M, "grammar": 'root ::= "yes"', "response_format": {"type": "text"}},
     True),
    ("chat", {"messages": M, "grammar": 5}, False),
    ("chat", {"messages": M, "grammar": 'root ::= "a"',
              "response_format": {"type": "json_object"}}, False),
    ("chat", {"messages": M, "reasoning_format": "none"}, True),
    ("chat", {"messages": M, "reasoning_format": "deepseek"}, True),
    ("chat", {"messages": M, "reasoning_format": "sometimes"}, False),
    ("chat", {"messages": M, "reasoning_format": 1}, False),
    # History: tool fields are read only in the messages of the role they belong to.
    ("chat", {"messages": [{"role": "user", "content": "x", "tool_calls": 5,
                            "tool_call_id": 5}]}, True),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [
        {"function": {"name": "f"}}, {"function": {"name": "g", "arguments": {"a": 1}}}]}]},
     True),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": 5}]}, False),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [5]}]}, False),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}, False),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": 5}}]}]}, False),
    ("chat", {"messages": [{"role": "user", "content": "x", "images": []}]}, True),
    ("chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, False),
    # -- /v1/completions --
    ("completions", {"prompt": "Once"}, True),
    ("completions", {"prompt": ["Once"], "echo": False, "max_tokens": 3, "stop": "\n"}, True),
    ("completions", {"prompt": "Once", "echo": None, "grammar": 'root ::= "a"'}, True),
    ("completions", {"prompt": "Once", "response_format": {"type": "json_object"}}, True),
    ("completions", {}, False),
    ("completions", {"prompt": ""}, False),
    ("completions", {"prompt": [""]}, False),
    ("completions", {"prompt": ["a", "b"]}, False),
    ("completions", {"prompt": [1]}, False),
    ("completions", {"prompt": 5}, False),
    ("completions", {"prompt": "a", "echo": True}, False),
    ("completions", {"prompt": "a", "echo": "no"}, False),
    ("completions", {"prompt": "a", "n": 3}, False),
    ("completions", {"prompt": "a", "temperature": 3}, False),
    ("completions", {"prompt": "a", "grammar": ["x"]}, False),
    ("completions", {"prompt": "a", "response_format": {"type": "yaml"}}, False),
    # -- /v1/embeddings --
    ("embeddings", {"input": "a"}, True),
    ("embeddings", {"input": ["a", "b"], "model": "m", "encoding_format": "base64"}, True),
    ("embeddings", {"input": "a", "encoding_format": None}, True),
    ("embeddings", {}, False),
    ("embeddings", {"input": ""}, False),
    ("embeddings", {"input": []}, False),
    ("embeddings", {"input": ["a", ""]}, False),
    ("embeddings", {"input": [1]}, False),
    ("embeddings", {"input": ["a"] * 65}, False),
    ("embeddings", {"input": "a", "encoding_format": "hex"}, False),
    ("embeddings", {"input": "a", "encoding_format": 1}, False),
    ("embeddings", {"input": "a", "model": 1}, False),
    # -- /api/chat --
    ("ollama_chat", {"model": "m", "messages": M}, True),
    ("ollama_chat", {"model": "m", "messages": M, "stream": False, "options": {
        "num_predict": -1, "temperature": 100, "top_p": 1e-6, "top_k": 0, "min_p": 1,
        "repeat_penalty": 10, "seed": 1, "stop": ["a"], "num_ctx": 99}}, True),
    ("ollama_chat", {"model": "m", "messages": OLLAMA_HISTORY, "tools": [TOOL],
                     "think": False, "options": None}, True),
    ("ollama_chat", {"model": "m", "messages": M, "format": "json"}, True),
    ("ollama_chat", {"model": "m", "messages": M, "format": ""}, True),
    ("ollama_chat", {"model": "m", "messages": M, "format": SCHEMA, "think": None}, True),
    ("ollama_chat", {"messages": M}, False),
    ("ollama_chat", {"model": None, "messages": M}, False),
    ("ollama_chat", {"model": 1, "messages": M}, False),
    ("ollama_chat", {"model": "m"}, False),
    ("ollama_chat", {"model": "m", "messages": [{"role": "bot"}]}, False),
    ("ollama_chat", {"model": "m", "messages": M, "stream": "no"}, False),
    ("ollama_chat", {"model": "m", "messages": M, "options": 5}, False, "options"),
    ("ollama_chat", {"model": "m", "messages": M, "options": {"temperature": 101}}, False,
     "options"),
    ("ollama_chat", {"model": "m", "messages": M, "options": {"top_p": 0}}, False, "options"),
    ("ollama_chat", {"model": "m", "messages": M, "options": {"num_predict": 1.5}}, False,
     "options"),
    ("ollama_chat", {"model": "m", "messages": M, "options": {"stop": [1]}}, False,
     "options"),
    ("ollama_chat", {"model": "m", "messages": M, "tools": {}}, False),
    ("ollama_chat", {"model": "m", "messages": M, "tools": [{"function": {}}]}, False),
    ("ollama_chat", {"model": "m", "messages": M, "think": "high"}, False),
    ("ollama_chat", {"model": "m", "messages": M, "format": "xml"}, False),
    ("ollama_chat", {"model": "m", "messages": M, "format": 5}, False),
    ("ollama_chat", {"model": "m", "messages": [{"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": 5}}]}]}, False),
    ("ollama_chat", {"model": "m", "messages": [{"role": "user", "images": ["aGk="]}]},
     False),
    # -- /api/generate --
    ("ollama_generate", {"model": "m"}, True),
    ("ollama_generate", {"model": "m", "prompt": "hi", "system": "be brief", "raw": True,
                         "stream": False, "options": {"seed": 3}, "format": SCHEMA,
                         "think": True}, True),
    ("ollama_generate", {}, False),
    ("ollama_generate", {"model": "m", "prompt": 5}, False),
    ("ollama_generate", {"model": "m", "system": 5}, False),
    ("ollama_generate", {"model": "m", "raw": "yes"}, False),
    ("ollama_generate", {"model": "m", "options": {"min_p": -1}}, False, "options"),
    ("ollama_generate", {"model": "m", "format": ["json"]}, False),
    ("ollama_generate", {"model": "m", "think": 1}, False),
    # -- /api/show, /api/embed --
    ("ollama_show", {"model": "m"}, True),
    ("ollama_show", {"name": "m"}, True),
    ("ollama_show", {}, False),
    ("ollama_show", {"model": None, "name": None}, False),
    ("ollama_show", {"model": 5}, False),
    ("ollama_show", {"name": 5}, False),
    ("ollama_show", {"model": "m", "name": 5}, True),
    ("ollama_show", {"model": None, "name": 5}, False),
    ("ollama_embed", {"model": "m", "input": ["a"]}, True),
    ("ollama_embed", {"input": "a"}, False),
    ("ollama_embed", {"model": "m"}, False),
    ("ollama_embed", {"model": "m", "input": ""}, False),
]


def _outcome(check: Callable[[], Any]) -> tuple[bool, str | None]:
    try:
        check()
    except ApiError as e:
        assert e.status == 400
        return False, e.param
    return True, None


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r[0]}:{json.dumps(r[1])[:60]}")
def test_parse_body_decides_as_the_hand_checks(row: Row) -> None:
    route, body, accepted = row[0], row[1], row[2]
    hand, model = ROUTES[route]
    hand_ok, hand_param = _outcome(lambda: hand(json.loads(json.dumps(body))))
    ok, param = _outcome(lambda: p.parse_body(model, json.loads(json.dumps(body))))
    assert hand_ok == accepted, f"the hand checks {'refused' if accepted else 'took'} it"
    assert ok == accepted, f"parse_body {'refused' if accepted else 'took'} it"
    assert param == (row[3] if len(row) == 4 else hand_param)


@pytest.mark.parametrize(("model", "body", "message"), [
    (p.ChatCompletionRequest, {"messages": M, "temperature": 3},
     "'temperature' must be between 0 and 2"),
    (p.ChatCompletionRequest, {"messages": M, "top_p": 0}, "'top_p' must be greater than 0"),
    (p.ChatCompletionRequest, {"messages": M, "max_tokens": 0}, "'max_tokens' must be at least 1"),
    (p.ChatCompletionRequest, {"messages": M, "top_k": 1.0}, "'top_k' must be a whole number"),
    (p.ChatCompletionRequest, {"messages": M, "stream": 1}, "'stream' must be true or false"),
    (p.ChatCompletionRequest, {"messages": M, "n": 2}, "only n=1 is supported"),
    (p.ChatCompletionRequest, {"messages": M, "stop": [1]},
     "'stop' must be a string or a list of strings"),
    (p.ChatCompletionRequest, {"messages": []}, "'messages' must be a non-empty list"),
    (p.ChatCompletionRequest, {"messages": [{"role": "user", "content": 5}]},
     "'messages[0].content' must be a string or a list of parts"),
    (p.ChatCompletionRequest, {"messages": M, "tool_choice": "auto"},
     "'tool_choice' needs 'tools'"),
    (p.ChatCompletionRequest, {"messages": M, "tools": [{"function": {"name": "f"}}] * 2},
     "tools: the function name 'f' appears twice"),
    (p.CompletionRequest, {"prompt": ""}, "'prompt' is empty"),
    (p.CompletionRequest, {"prompt": "a", "echo": True}, "'echo' is not supported"),
    (p.OllamaChatRequest, {"model": None, "messages": M}, "'model' is required"),
    (p.OllamaChatRequest, {"model": "m", "messages": M, "options": {"temperature": -1}},
     "'options.temperature' must be between 0 and 100"),
    (p.OllamaShowRequest, {}, "'model' is required"),
    (p.EmbeddingRequest, {"input": ["a"] * 65}, "'input' takes at most 64 strings"),
])
def test_messages_are_one_line_in_the_hand_checks_style(model: type[BaseModel],
                                                        body: dict[str, Any],
                                                        message: str) -> None:
    with pytest.raises(ApiError) as e:
        p.parse_body(model, body)
    assert e.value.status == 400 and e.value.message == message


def test_values_come_out_as_the_hand_helpers_return_them() -> None:
    r = p.parse_body(p.ChatCompletionRequest, {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                  {"type": "text", "text": "b"}]}],
        "stop": ["x", ""], "temperature": 1})
    assert r.messages[0].text == "ab" and r.stop == ("x",) and r.temperature == 1.0
    assert r.n == 1 and r.tools is None and r.stream is None
    assert p.parse_body(p.ChatCompletionRequest, {"messages": M, "stop": ""}).stop == ()
    assert p.parse_body(p.CompletionRequest, {"prompt": ["once"]}).prompt == "once"
    assert p.parse_body(p.EmbeddingRequest, {"input": "a"}).input == ["a"]
    rf = p.parse_body(p.ChatCompletionRequest, {"messages": M, "response_format": {
        "type": "json_schema", "json_schema": {"schema": SCHEMA}}}).response_format
    assert rf is not None and rf.json_schema is not None and rf.json_schema.schema_ == SCHEMA
    tools = p.parse_body(p.OllamaChatRequest, {"model": "m", "messages": M, "tools": [
        {"function": {"name": "f"}}]}).tools
    assert tools is not None and tools[0].function.parameters == {"type": "object",
                                                                  "properties": {}}
    # A field of another role is dropped, not checked.
    msg = p.parse_body(p.ChatCompletionRequest, {"messages": [
        {"role": "user", "content": "x", "tool_calls": 5}]}).messages[0]
    assert msg.tool_calls is None


@pytest.mark.parametrize(("model", "body"), [
    (p.ChatCompletionRequest, {"messages": M, "tools": [
        {"function": {"name": "f", "strict": "yes"}}]}),
    (p.ChatCompletionRequest, {"messages": [{"role": "assistant", "reasoning_content": 5}]}),
    (p.ChatCompletionRequest, {"messages": [{"role": "assistant", "tool_calls": [
        {"id": 5, "function": {"name": "f"}}]}]}),
    (p.ChatCompletionRequest, {"messages": [{"role": "assistant", "tool_calls": [
        {"type": "retrieval", "function": {"name": "f"}}]}]}),
    (p.ChatCompletionRequest, {"messages": [{"role": "tool", "tool_call_id": 5}]}),
    (p.OllamaChatRequest, {"model": "m", "messages": [{"role": "tool", "tool_name": 5}]}),
])
def test_typed_where_the_hand_checks_ignore_a_wrong_type(model: type[BaseModel],
                                                         body: dict[str, Any]) -> None:
    """The hand checks read these fields only when they hold the right type and ignore them
    otherwise; the models refuse a wrong type, as OpenAI and Ollama do."""
    hand = next(h for h, m in ROUTES.values() if m is model)
    hand(json.loads(json.dumps(body)))
    with pytest.raises(ApiError):
        p.parse_body(model, body)


def test_the_roles_are_the_hand_checks_roles() -> None:
    for model in (p.ChatMessage, p.OllamaMessage):
        assert get_args(model.model_fields["role"].annotation) == ROLES


def _validator(doc: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    root = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(root)


def test_openapi_is_built_from_the_models() -> None:
    doc = openapi_schema(ServerConfig(port=0, api_key="k"))
    assert doc["openapi"] == "3.1.0" and doc["security"] == [{"bearer": []}]
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["paths"]["/health"]["get"]["security"] == []
    for path in ("/v1/models", "/v1/models/{model_id}", "/v1/chat/completions",
                 "/v1/completions", "/v1/embeddings", "/api/version", "/api/tags", "/api/show",
                 "/api/chat", "/api/generate", "/api/embed", "/health", "/metrics"):
        assert path in doc["paths"], path
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"}
    schemas = doc["components"]["schemas"]
    text = json.dumps(doc)
    for ref in {x.split('"')[0] for x in text.split('"$ref": "#/components/schemas/')[1:]}:
        assert ref in schemas, ref
    assert "x-candlewick-pending" not in text and "$defs" not in text
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["temperature"]["anyOf"][0] == {"type": "number", "minimum": 0, "maximum": 2}
    assert "tools" not in chat  # pending: the routes do not read it through parse_body yet
    open_doc = openapi_schema(ServerConfig(port=0))
    assert "security" not in open_doc and "securitySchemes" not in open_doc["components"]
    jsonschema.Draft202012Validator.check_schema(
        {"$ref": "#/components/schemas/ChatCompletionRequest", **doc})


@pytest.mark.parametrize("row", [r for r in ROWS if r[2]],
                         ids=lambda r: f"{r[0]}:{json.dumps(r[1])[:60]}")
def test_the_document_takes_every_body_the_server_takes(row: Row) -> None:
    """A schema stricter than the server fails the fuzz test's negative-data check."""
    doc = openapi_schema(ServerConfig(port=0))
    _validator(doc, ROUTES[row[0]][1].__name__).validate(row[1])


@pytest.mark.parametrize(("value", "ok"), [
    ({"type": "text"}, True), ({"type": "text", "json_schema": 5}, True),
    ({"type": "json_object"}, True),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, True),
    ({"type": "json_schema"}, False), ({"type": "json_schema", "json_schema": None}, False),
    ({"type": "json_schema", "json_schema": {"name": "a"}}, False), ({"type": "x"}, False)])
def test_response_format_document_and_model_agree(value: dict[str, Any], ok: bool) -> None:
    """Its document is hand-shaped (json_schema counts with its type only), so checked apart;
    it is not in /openapi.json until the routes read it through parse_body."""
    valid = jsonschema.Draft202012Validator(p.ResponseFormat.model_json_schema()).is_valid(value)
    assert valid == ok
    assert _outcome(lambda: p.parse_body(p.ResponseFormat, value))[0] == ok


def test_the_document_describes_the_answers() -> None:
    doc = openapi_schema(ServerConfig(port=0))
    _validator(doc, "ChatCompletion").validate({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "system_fingerprint": "candlewick",
        "choices": [{"index": 0, "logprobs": None, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": None,
                                 "tool_calls": [{"id": "c", "type": "function", "function": {
                                     "name": "f", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3,
                  "prompt_tokens_details": {"cached_tokens": 0},
                  "completion_tokens_details": {"reasoning_tokens": 0}}})
    _validator(doc, "OpenAIError").validate(
        {"error": {"message": "m", "type": "invalid_request_error", "param": None,
                   "code": None}})
    _validator(doc, "OllamaReply").validate(
        {"model": "m", "created_at": "t", "done": True, "done_reason": "stop",
         "message": {"role": "assistant", "content": "", "thinking": "hmm",
                     "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
         "total_duration": 1, "load_duration": 0, "eval_count": 1})
