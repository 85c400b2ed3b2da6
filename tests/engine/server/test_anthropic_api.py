"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) through the official
`anthropic` client, on the real SmolLM2 (the generic tool format under a grammar), plus the
builder and the content-block conversion on their own."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from engine.decoding.reply_reader import ReplyResult
from engine.decoding.tool_calls import ToolCall
from engine.host.runtime import Model
from engine.host.stats import GenerationStats
from engine.model.templates import ChatTemplate
from engine.server import ServedModel, ServerConfig, ServerState, ServerThread
from engine.server.agent_run import Done
from engine.server.anthropic_routes import MessageBuilder, chat_messages
from engine.server.errors import ApiError
from engine.server.protocol.anthropic import AnthropicMessagesRequest, AnthropicReply
from engine.server.protocol.parse import parse_body
from engine.settings import LoadParams
from tests.engine.server.conftest import API_KEY, assert_no_leak, doc_valid, http, make_config
from tests.engine.server.test_structured_api import THINKING_CHATML

WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
TIME: dict[str, Any] = {
    "name": "get_time",
    "description": "The local time in a time zone.",
    "input_schema": {
        "type": "object",
        "properties": {"zone": {"type": "string", "maxLength": 40}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}
TOOLS = [WEATHER, TIME]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
HELLO: list[Any] = [{"role": "user", "content": "Say hello."}]
KEY = {"x-api-key": API_KEY}
GREEDY = {"temperature": 0}  # not a keyword of this client's create(): sent as extra_body


@pytest.fixture(scope="module")
def srv(served: ServedModel) -> Iterator[ServerThread]:
    state = ServerState(make_config(max_tokens_cap=128))
    state.set_loaded(served)
    with ServerThread(state) as s:
        yield s


@pytest.fixture
def client(srv: ServerThread) -> Iterator[anthropic.Anthropic]:
    # api_key goes out as x-api-key, as Claude Code sends it.
    with anthropic.Anthropic(base_url=srv.url, api_key=API_KEY, timeout=120, max_retries=0) as c:
        yield c


def raw(srv: ServerThread, body: dict[str, Any], path: str = "/v1/messages") -> httpx.Response:
    return http.post(srv.url + path, json=body, headers=KEY)


def schema_of(name: str) -> dict[str, Any]:
    return next(t["input_schema"] for t in TOOLS if t["name"] == name)  # type: ignore


def test_text_answer_and_its_token_counts(
    srv: ServerThread, client: anthropic.Anthropic, served: ServedModel
) -> None:
    m = client.messages.create(
        model="smollm2", max_tokens=12, messages=HELLO, system="You are terse.", extra_body=GREEDY
    )
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text  # type: ignore
    assert 0 < m.usage.output_tokens <= 12
    counted = client.messages.count_tokens(model="smollm2", messages=HELLO, system="You are terse.")
    # Anthropic counts cache reads apart; together they are the whole prompt.
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == counted.input_tokens
    with_tools = client.messages.count_tokens(model="smollm2", messages=HELLO, tools=TOOLS)  # type: ignore
    assert with_tools.input_tokens > counted.input_tokens
    AnthropicReply.model_validate(raw(srv, {"max_tokens": 3, "messages": HELLO}).json())
    assert_no_leak(served)


def test_stream_events_come_in_order(client: anthropic.Anthropic, served: ServedModel) -> None:
    with client.messages.stream(
        model="smollm2", max_tokens=10, messages=HELLO, extra_body=GREEDY
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    raw_kinds = [
        e.type
        for e in events
        if e.type
        in (
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        )
    ]
    n = raw_kinds.count("content_block_delta")
    assert n >= 1
    assert raw_kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * n,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    text = "".join(
        e.delta.text
        for e in events  # type: ignore[union-attr]
        if e.type == "content_block_delta"
    )
    assert final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens <= 10
    assert_no_leak(served)


def test_tool_use_then_tool_result(client: anthropic.Anthropic, served: ServedModel) -> None:
    first = client.messages.create(
        model="smollm2",
        max_tokens=100,
        messages=ASK,
        tools=TOOLS,
        # One call: its grammar closes it within max_tokens whatever the logits are. With
        # parallel calls allowed, one shuffled run under load (other cached prefixes, other
        # batch shapes, other rounding) led greedy decoding to call again until max_tokens.
        tool_choice={"type": "any", "disable_parallel_tool_use": True},  # type: ignore
        extra_body=GREEDY,
    )
    assert first.stop_reason == "tool_use"
    uses = [b for b in first.content if b.type == "tool_use"]
    assert uses and len(uses) == len(first.content)
    for u in uses:
        assert u.id.startswith("toolu_")
        jsonschema.validate(u.input, schema_of(u.name))
    history = [
        *ASK,
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": u.id,
                    "content": [{"type": "text", "text": '{"temperature": 21}'}],
                }
                for u in uses
            ],
        },
    ]
    second = client.messages.create(
        model="smollm2",
        max_tokens=80,
        messages=history,  # type: ignore
        tools=TOOLS,
        extra_body=GREEDY,
    )  # type: ignore[arg-type]
    # The generic format keeps every answer JSON: a reply, or another (valid) call.
    for b in second.content:
        if b.type == "tool_use":
            jsonschema.validate(b.input, schema_of(b.name))
        else:
            assert b.type == "text"
    assert second.stop_reason in ("end_turn", "tool_use", "max_tokens")
    assert second.usage.input_tokens + (second.usage.cache_read_input_tokens or 0) > (
        first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    )
    assert_no_leak(served)


def test_streamed_tool_use(client: anthropic.Anthropic, served: ServedModel) -> None:
    with client.messages.stream(
        model="smollm2",
        max_tokens=100,
        messages=ASK,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
        extra_body=GREEDY,
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]  # type: ignore
    assert [d.type for d in deltas] == ["input_json_delta"]
    [use] = final.content
    assert use.type == "tool_use" and use.name == "get_time"
    assert use.input == json.loads(deltas[0].partial_json)  # type: ignore[union-attr]
    jsonschema.validate(use.input, schema_of("get_time"))
    assert final.stop_reason == "tool_use"
    assert_no_leak(served)


def test_stop_sequences(client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model="smollm2",
        max_tokens=30,
        messages=HELLO,
        stop_sequences=["zzz", " "],
        extra_body=GREEDY,
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == " "
    assert " " not in m.content[0].text  # type: ignore[union-attr]


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_output_format_json_schema(client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model="smollm2",
        max_tokens=60,
        messages=[{"role": "user", "content": "Invent a person."}],
        output_config={"format": {"type": "json_schema", "schema": PERSON}},
        extra_body=GREEDY,
    )
    assert m.stop_reason == "end_turn"
    jsonschema.validate(json.loads(m.content[0].text), PERSON)  # type: ignore[union-attr]


def test_a_stream_left_early_frees_its_slot(srv: ServerThread, served: ServedModel) -> None:
    body = {
        "max_tokens": 128,
        "stream": True,
        "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
    }
    with httpx.stream("POST", srv.url + "/v1/messages", json=body, headers=KEY, timeout=120) as r:
        seen = [line for _, line in zip(range(20), r.iter_lines(), strict=False)]
    assert "event: content_block_delta" in seen
    assert_no_leak(served)


def test_key_rules_error_shape_and_metrics(srv: ServerThread, client: anthropic.Anthropic) -> None:
    r = http.post(srv.url + "/v1/messages", json={"max_tokens": 2, "messages": HELLO})
    assert r.status_code == 401
    assert r.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "missing or invalid API key"},
    }
    bearer = http.post(
        srv.url + "/v1/messages",
        json={"max_tokens": 2, "messages": HELLO},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert bearer.status_code == 200  # ANTHROPIC_AUTH_TOKEN's way
    with (
        anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0) as wrong,
        pytest.raises(anthropic.AuthenticationError),
    ):
        wrong.messages.create(model="smollm2", max_tokens=2, messages=HELLO)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="smollm2", max_tokens=2, messages=[])
    assert e.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "'messages' must not be empty"},
    }
    r = raw(srv, {}, "/v1/messages/batches")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    # Its own count, whatever ran before it (in a shuffled order this test may run first).
    assert client.messages.count_tokens(model="smollm2", messages=HELLO).input_tokens > 0
    text = http.get(srv.url + "/metrics", headers=KEY).text
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        m = re.search(
            rf'^candlewick_requests_total\{{route="{route}",status="200"\}} (\d+)', text, re.M
        )
        assert m and int(m[1]) >= 1, route


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            {"thinking": {"type": "enabled", "budget_tokens": 2048}},
            "'max_tokens' must be greater than 'thinking.budget_tokens'",
        ),
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "at least 1024"),
        ({"thinking": {"type": "enabled"}}, "'thinking.budget_tokens' is required"),
        ({"thinking": {"type": "disabled", "budget_tokens": 2048}}, "with type 'enabled' only"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "AA==",
                                },
                            }
                        ],
                    }
                ]
            },
            "text only",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool"),
        ({"messages": [*HELLO, {"role": "assistant", "content": "Hel"}]}, "prefilled"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}],
                    },
                    *HELLO,
                ]
            },
            "cannot hold tool_result",
        ),
        ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "MCP"),
        ({"output_config": {"effort": "high"}}, "not supported"),
        ({"container": "c1"}, "not supported"),
        ({"thinking": {"type": "adaptive", "display": "omitted"}}, "not supported"),
        ({"tool_choice": {"type": "any"}}, "needs 'tools'"),
        (
            {
                "tools": [WEATHER],
                "output_config": {"format": {"type": "json_schema", "schema": PERSON}},
            },
            "cannot be combined with tools",
        ),
        ({"temperature": 1.5}, "at most 1"),
        ({"max_tokens": 0}, "at least 1"),
        ({"stop_sequences": ["a"] * 17}, "at most 16"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(
    srv: ServerThread, body: dict[str, Any], says: str
) -> None:
    r = raw(srv, {"max_tokens": 2, "messages": HELLO, **body})
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert says in err["error"]["message"]


def test_harmless_fields_are_taken(srv: ServerThread) -> None:
    r = raw(
        srv,
        {
            "max_tokens": 2,
            "metadata": {"user_id": "u"},
            "service_tier": "auto",
            "top_k": 5,
            "top_p": 0.9,
            "thinking": {"type": "disabled"},
            "cache_control": {"type": "ephemeral"},
            "system": [
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
            ],
            "messages": HELLO,
        },
    )
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def thinker(smollm2_path: Path) -> Iterator[tuple[ServedModel, ServerThread]]:
    """SmolLM2 behind a thinking template: the prompt opens a thinking block."""
    model = Model(smollm2_path, LoadParams(n_ctx=1024, n_threads=2))
    model.template = ChatTemplate(
        THINKING_CHATML, bos_token=model.template.bos_token, eos_token=model.template.eos_token
    )
    loaded = ServedModel.build(model, "thinker", max_queue=4, embeddings=False)
    state = ServerState(ServerConfig(port=0, model_id="thinker", max_tokens_cap=64))
    state.set_loaded(loaded)
    with ServerThread(state) as srv:
        yield loaded, srv
    loaded.close()
    model.close()


def test_thinking_comes_out_as_thinking_blocks(thinker: tuple[ServedModel, ServerThread]) -> None:
    with anthropic.Anthropic(
        base_url=thinker[1].url, api_key="none", max_retries=0, timeout=120
    ) as c:
        ask = [{"role": "user", "content": "What is the capital of France?"}]
        kw: dict[str, Any] = {
            "model": "thinker",
            "max_tokens": 24,
            "messages": ask,
            "thinking": {"type": "adaptive"},
            "extra_body": GREEDY,
        }
        m = c.messages.create(**kw)
        assert m.content[0].type == "thinking" and m.content[0].thinking
        with c.messages.stream(**kw) as stream:
            events = list(stream)
            final = stream.get_final_message()
        thought = "".join(
            e.delta.thinking
            for e in events  # type: ignore[union-attr]
            if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
        )
        assert thought and final.content[0].thinking == thought  # type: ignore[union-attr]
        # The thinking block goes back as the assistant turn's thinking.
        again = c.messages.create(
            **{
                **kw,
                "messages": [
                    *ask,
                    {"role": "assistant", "content": m.content},
                    {"role": "user", "content": "And?"},
                ],
            }
        )
        assert again.stop_reason in ("end_turn", "max_tokens")
        assert_no_leak(thinker[0])


# -- the pieces on their own ----------------------------------------------------------------


def test_content_blocks_become_chat_turns() -> None:
    req = parse_body(
        AnthropicMessagesRequest,
        {
            "max_tokens": 5,
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "user", "content": [{"type": "text", "text": "In Paris."}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Call it.", "signature": ""},
                        {"type": "text", "text": "Checking."},
                        {
                            "type": "tool_use",
                            "id": "t1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "t9",
                            "content": "boom",
                            "is_error": True,
                        },
                        {"type": "text", "text": "Thanks."},
                    ],
                },
            ],
        },
    )
    assert chat_messages(req) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?\n\nIn Paris."},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Call it.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "sunny", "name": "get_weather"},
        {"role": "tool", "tool_call_id": "t9", "content": "Error: boom"},
        {"role": "user", "content": "Thanks."},
    ]


TAKEN: list[dict[str, Any]] = [
    {"max_tokens": 1, "messages": HELLO},
    {"max_tokens": 2000, "messages": HELLO, "thinking": {"type": "enabled", "budget_tokens": 1024}},
    {
        "max_tokens": 1,
        "messages": [
            *ASK,
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "t", "signature": "s"},
                    {"type": "text", "text": "x", "citations": None},
                    {"type": "tool_use", "id": "t1", "name": "get_time", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": "x",
                        "is_error": False,
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
        "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "get_time"},
    },
    {
        "max_tokens": 1,
        "messages": HELLO,
        "system": [{"type": "text", "text": "s"}],
        "thinking": {"type": "disabled"},
        "stop_sequences": ["x"],
        "temperature": 0,
        "top_k": 3,
        "top_p": 1,
        "metadata": {"user_id": "u"},
        "service_tier": "standard_only",
        "output_config": {"format": {"type": "json_schema", "schema": {}}},
        "stream": False,
        "mcp_servers": [],
        "inference_geo": "eu",
    },
]
REFUSED: list[dict[str, Any]] = [
    {"messages": HELLO},
    {"max_tokens": 1, "messages": []},
    {"max_tokens": 1, "messages": [{"role": "system", "content": "x"}]},
    {"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
    {"max_tokens": 1, "messages": HELLO, "thinking": {"type": "enabled", "budget_tokens": 100}},
    {"max_tokens": 1, "messages": HELLO, "temperature": 2},
    {"max_tokens": 1, "messages": HELLO, "stop_sequences": [""]},
    {"max_tokens": 1, "messages": HELLO, "tools": [{"name": "x"}]},
    {"max_tokens": 1, "messages": HELLO, "unknown": 1},
    {"max_tokens": 1, "messages": [{"role": "user", "content": "x", "name": "bob"}]},
]


@pytest.mark.parametrize("body", TAKEN)
def test_the_document_takes_what_the_server_takes(body: dict[str, Any]) -> None:
    """A schema stricter than the server fails the fuzz test's negative-data check."""
    parse_body(AnthropicMessagesRequest, body)
    assert doc_valid("AnthropicMessagesRequest", body)


@pytest.mark.parametrize("body", REFUSED)
def test_the_document_refuses_what_it_can_say(body: dict[str, Any]) -> None:
    with pytest.raises(ApiError):
        parse_body(AnthropicMessagesRequest, body)
    assert not doc_valid("AnthropicMessagesRequest", body)


def _done(reply: ReplyResult, reason: str = "stop", stop: str | None = None) -> Done:
    st = GenerationStats(prompt_tokens=10, cached_tokens=4, gen_tokens=7, stop_reason=reason)  # type: ignore[arg-type]
    return Done(reply, st, stop)


def _builder() -> MessageBuilder:
    return MessageBuilder(AnthropicReply.model_construct(id="msg_1", content=[]))


def _read(events: list[tuple[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    """The builder's events as (name, data), its data read from the JSON sent."""
    return [(name, json.loads(data)) for name, data in events]


def test_builder_thinking_then_text_then_tool_use() -> None:
    b = _builder()
    events = _read(
        b.start() + b.push([("reasoning", "Hm"), ("reasoning", "m."), ("content", "Ok")])
    )
    call = ToolCall("get_time", '{"zone": "UTC"}', "call_abc")
    events += _read(b.finish(_done(ReplyResult("Ok", "Hmm.", [call]))))
    assert [(name, data.get("index")) for name, data in events] == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[2][1]["delta"] == {"type": "thinking_delta", "thinking": "Hm"}
    assert b.message.wire()["content"] == [
        {"type": "thinking", "thinking": "Hmm.", "signature": ""},
        {"type": "text", "text": "Ok"},
        {"type": "tool_use", "id": "toolu_abc", "name": "get_time", "input": {"zone": "UTC"}},
    ]
    assert b.message.wire()["stop_reason"] == "tool_use"
    assert b.message.wire()["usage"] == {
        "input_tokens": 6,
        "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 0,
        "output_tokens": 7,
    }


@pytest.mark.parametrize(
    ("reason", "stop", "expected"),
    [
        ("stop", None, "end_turn"),
        ("length", None, "max_tokens"),
        ("stop_string", "###", "stop_sequence"),
        ("context_full", None, "model_context_window_exceeded"),
    ],
)
def test_builder_stop_reasons(reason: str, stop: str | None, expected: str) -> None:
    b = _builder()
    b.finish(_done(ReplyResult("", ""), reason, stop))
    assert b.message.wire()["stop_reason"] == expected and b.message.wire()["stop_sequence"] == stop
    assert b.message.wire()["content"] == [{"type": "text", "text": ""}]
