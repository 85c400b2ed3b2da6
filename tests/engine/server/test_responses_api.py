"""OpenAI's Responses API (POST /v1/responses) through the official `openai` client, on the
real SmolLM2 (no tool support in its template: the generic format, every answer JSON under a
grammar), plus the builder, the input conversion and the store on their own."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from engine.decoding.reply_reader import ReplyResult
from engine.decoding.tool_calls import ToolCall
from engine.host.runtime import Model
from engine.host.stats import GenerationStats
from engine.model.templates import ChatTemplate
from engine.server import ServedModel, ServerConfig, ServerState, ServerThread
from engine.server.agent_run import Done
from engine.server.errors import ApiError
from engine.server.protocol.parse import parse_body
from engine.server.protocol.responses import ResponseObject, ResponsesRequest
from engine.server.response_store import ResponseStore
from engine.server.responses_routes import ResponseBuilder, chat_messages
from engine.settings import LoadParams
from tests.engine.server.conftest import API_KEY, assert_no_leak, doc_valid, http, make_config
from tests.engine.server.test_structured_api import THINKING_CHATML

WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIME: dict[str, Any] = {
    "type": "function",
    "name": "get_time",
    "description": "The local time in a time zone.",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "maxLength": 40}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}
ASK = "What is the weather in Paris?"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def srv(served: ServedModel) -> Iterator[ServerThread]:
    state = ServerState(make_config(max_tokens_cap=128))
    state.set_loaded(served)
    with ServerThread(state) as s:
        yield s


@pytest.fixture
def client(srv: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, timeout=120, max_retries=0) as c:
        yield c


def raw(srv: ServerThread, body: dict[str, Any]) -> httpx.Response:
    return http.post(srv.url + "/v1/responses", json=body, headers=AUTH)


def check_args(tool: dict[str, Any], arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), tool["parameters"])


def test_a_text_answer_is_one_message_item(srv: ServerThread, client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="smollm2",
        input="Say hello.",
        max_output_tokens=12,
        temperature=0,
        instructions="You are terse.",
        metadata={"ticket": "7"},
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert [o.type for o in r.output] == ["message"]
    assert r.output_text
    assert r.instructions == "You are terse." and r.metadata == {"ticket": "7"}
    assert r.usage is not None and r.usage.input_tokens > 0
    assert 0 < r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"
    # The raw answer is what the OpenAPI document promises.
    body = raw(srv, {"input": "Say hello.", "max_output_tokens": 4}).json()
    ResponseObject.model_validate(body)


def test_stream_events_come_in_order(client: openai.OpenAI, served: ServedModel) -> None:
    events = list(
        client.responses.create(
            model="smollm2", input="Say hello.", max_output_tokens=10, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    n = kinds.count("response.output_text.delta")
    assert n >= 1 and kinds[4 : 4 + n] == ["response.output_text.delta"] * n
    assert kinds[4 + n :] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if events[-1].type == "response.incomplete" else "response.completed",
    ]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response  # type: ignore[union-attr]
    assert done.output_text == text and done.usage is not None
    assert events[0].response.status == "in_progress"  # type: ignore[union-attr]
    assert_no_leak(served)


def test_function_call_round_trip_stateless(client: openai.OpenAI, served: ServedModel) -> None:
    """The client sends the whole conversation back: its output items, then the results."""
    first = client.responses.create(
        model="smollm2",
        input=ASK,
        tools=[WEATHER, TIME],  # type: ignore
        tool_choice="required",
        # One call: with no repeat penalty (the API's default) SmolLM2 repeats its calls up
        # to the 8 an answer may hold, past the test server's 64-token cap.
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=100,
        store=False,
    )
    assert first.status == "completed"
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and len(calls) == len(first.output)
    for c in calls:
        assert c.call_id and c.id and c.status == "completed"
        check_args(WEATHER if c.name == "get_weather" else TIME, c.arguments)
    history: list[Any] = [{"role": "user", "content": ASK}, *first.output]
    history += [
        {
            "type": "function_call_output",
            "call_id": c.call_id,
            "output": '{"temperature": 21, "sky": "sunny"}',
        }
        for c in calls
    ]
    second = client.responses.create(
        model="smollm2",
        input=history,
        tools=[WEATHER, TIME],  # type: ignore
        temperature=0,
        max_output_tokens=80,
    )
    assert second.status in ("completed", "incomplete")
    # The generic format keeps every answer JSON: a reply, or another (valid) call.
    for o in second.output:
        if o.type == "function_call":
            check_args(WEATHER if o.name == "get_weather" else TIME, o.arguments)
        else:
            assert o.type == "message"
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the history was read
    assert_no_leak(served)


def test_previous_response_id_continues_from_the_store(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="smollm2",
        input=ASK,
        tools=[WEATHER],  # type: ignore
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=100,
    )
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    check_args(WEATHER, call.arguments)
    second = client.responses.create(
        model="smollm2",
        previous_response_id=first.id,
        tools=[WEATHER],  # type: ignore[list-item]
        input=[
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": '{"temperature": 21}',
            }
        ],
        temperature=0,
        max_output_tokens=40,
    )
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    # The stored turn (question, call) came before the result.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_a_response_not_in_the_store_is_a_clear_400(client: openai.OpenAI) -> None:
    unkept = client.responses.create(model="smollm2", input="Hi", max_output_tokens=2, store=False)
    assert unkept.store is False
    for rid in ("resp_never_made", unkept.id):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="smollm2", input="Hi", previous_response_id=rid)
        err = e.value.body
        assert isinstance(err, dict)
        assert err["code"] == "previous_response_not_found"
        assert err["param"] == "previous_response_id" and "stateless" in err["message"]


def test_streamed_function_call(client: openai.OpenAI, served: ServedModel) -> None:
    events = list(
        client.responses.create(
            model="smollm2",
            input=ASK,
            tools=[WEATHER, TIME],
            stream=True,  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_time"},
            parallel_tool_calls=False,
            temperature=0,
            max_output_tokens=100,
        )
    )
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    delta, done, item = events[3], events[4], events[5]
    assert delta.delta == done.arguments  # type: ignore[union-attr]
    check_args(TIME, done.arguments)  # type: ignore[union-attr]
    assert item.item.type == "function_call" and item.item.name == "get_time"  # type: ignore
    final = events[-1].response  # type: ignore[union-attr]
    assert [o.type for o in final.output] == ["function_call"]
    assert_no_leak(served)


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_text_format_json_schema(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="smollm2",
        input="Invent a person.",
        temperature=0,
        max_output_tokens=60,
        text={
            "format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
        },
    )
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert r.text is not None and r.text.format is not None
    assert r.text.format.type == "json_schema"


def test_a_stream_left_early_frees_its_slot(srv: ServerThread, served: ServedModel) -> None:
    body = {"input": "Write a long story about a dragon.", "stream": True, "max_output_tokens": 128}
    with httpx.stream("POST", srv.url + "/v1/responses", json=body, headers=AUTH, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        seen = [line for _, line in zip(range(40), lines, strict=False)]
    assert any("response.output_text.delta" in line for line in seen)
    assert_no_leak(served)


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"background": True}, "background", "not supported"),
        ({"include": ["reasoning.encrypted_content"]}, "include", "not supported"),
        ({"tools": [{"type": "web_search"}]}, "tools", "type 'web_search'"),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}
                ]
            },
            "input",
            "text only",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input", "item_reference"),
        (
            {"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}]},
            "input",
            "encrypted",
        ),
        ({"reasoning": {"effort": "extreme"}}, "reasoning", "effort"),
        ({"reasoning": {"summary": "auto"}}, "reasoning", "summarised"),
        ({"truncation": "auto"}, "truncation", "auto"),
        ({"text": {"verbosity": "low"}}, "text", "verbosity"),
        ({"top_logprobs": 21}, "top_logprobs", "at most 20"),
        ({"conversation": "conv_1"}, "conversation", "not supported"),
        ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
        (
            {"tools": [WEATHER], "text": {"format": {"type": "json_object"}}},
            "text",
            "cannot be combined with tools",
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"not": {}}}}},
            "text",
            "not",
        ),
        ({"temperature": 2.5}, "temperature", "at most 2"),
        ({"input": []}, "input", "empty"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(
    srv: ServerThread, body: dict[str, Any], param: str, says: str
) -> None:
    r = raw(srv, {"input": "Hi", "max_output_tokens": 2, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert says in err["message"]


def test_harmless_fields_are_taken(srv: ServerThread) -> None:
    r = raw(
        srv,
        {
            "input": "Hi",
            "max_output_tokens": 2,
            "user": "u",
            "safety_identifier": "s",
            "prompt_cache_key": "k",
            "service_tier": "auto",
            "background": False,
            "include": [],
            "truncation": "disabled",
            "stream_options": None,
        },
    )
    assert r.status_code == 200, r.text


def test_key_rules_and_metrics(srv: ServerThread) -> None:
    r = http.post(srv.url + "/v1/responses", json={"input": "Hi"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert raw(srv, {"input": "Hi", "max_output_tokens": 2}).status_code == 200
    text = http.get(srv.url + "/metrics", headers=AUTH).text
    m = re.search(
        r'^candlewick_requests_total\{route="/v1/responses",status="200"\} (\d+)', text, re.M
    )
    assert m and int(m[1]) >= 1


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


def test_thinking_comes_out_as_a_reasoning_item(thinker: tuple[ServedModel, ServerThread]) -> None:
    with openai.OpenAI(base_url=thinker[1].url + "/v1", api_key="none", timeout=120) as c:
        kw: dict[str, Any] = {
            "model": "thinker",
            "input": "What is the capital of France?",
            "max_output_tokens": 24,
            "temperature": 0,
        }
        r = c.responses.create(**kw)
        first = r.output[0]
        assert first.type == "reasoning" and first.content and first.content[0].text
        assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens > 0
        events = list(c.responses.create(stream=True, **kw))
        thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        assert thought and events[2].item.type == "reasoning"  # type: ignore[union-attr]
        final = events[-1].response  # type: ignore[union-attr]
        assert final.output[0].type == "reasoning" and final.output[0].content[0].text == thought
        # The reasoning item goes back as the assistant turn's thinking.
        again = c.responses.create(
            **{
                **kw,
                "input": [
                    {"role": "user", "content": "Hi"},
                    *r.output,
                    {"role": "user", "content": "And?"},
                ],
            }
        )
        assert again.status in ("completed", "incomplete")
        assert_no_leak(thinker[0])


# -- the pieces on their own ----------------------------------------------------------------


def test_input_items_become_chat_turns() -> None:
    req = parse_body(
        ResponsesRequest,
        {
            "input": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {
                    "type": "reasoning",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "Call the tool."}],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
                },
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": "{}",
                },
                {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [{"type": "input_text", "text": "noon"}],
                },
            ]
        },
    )
    convo: list[dict[str, Any]] = []
    chat_messages(req.input, convo)
    assert convo == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Call the tool.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny", "name": "get_weather"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon", "name": "get_time"},
    ]


TAKEN: list[dict[str, Any]] = [
    {"input": "Hi"},
    {
        "input": [{"role": "user", "content": "Hi"}],
        "tools": [WEATHER, TIME],
        "tool_choice": {"type": "function", "name": "get_time"},
        "parallel_tool_calls": False,
    },
    {
        "input": [
            {
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "id": "msg_1",
                "content": [{"type": "output_text", "text": "x", "annotations": []}],
            },
            {
                "type": "function_call",
                "call_id": "c",
                "name": "f",
                "arguments": "{}",
                "id": "fc_1",
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "t"}],
            },
        ]
    },
    {
        "input": "Hi",
        "background": False,
        "include": [],
        "truncation": "disabled",
        "reasoning": {"effort": "none"},
        "text": {"format": {"type": "json_object"}},
        "store": False,
        "metadata": {"a": "b"},
        "max_output_tokens": 5,
        "temperature": 1,
        "top_p": 0.5,
        "stream": True,
        "stream_options": {"include_obfuscation": False},
        "top_logprobs": 0,
        "prompt_cache_retention": "24h",
    },
]
REFUSED: list[dict[str, Any]] = [
    {},
    {"input": 5},
    {"input": [{"role": "robot", "content": "x"}]},
    {"input": [{"type": "function_call", "name": "f"}]},
    {"input": "x", "temperature": -1},
    {"input": "x", "top_p": 0},
    {"input": "x", "max_output_tokens": 0},
    {"input": "x", "reasoning": {"effort": "extreme"}},
    {"input": "x", "truncation": "auto"},
    {"input": "x", "tools": [{"type": "function", "name": "bad name"}]},
    {"input": "x", "text": {"format": {"type": "yaml"}}},
    {"input": "x", "unknown": [1]},
    {"input": [{"role": "user", "content": [{"type": "input_text", "text": "x", "lang": "en"}]}]},
]


@pytest.mark.parametrize("body", TAKEN)
def test_the_document_takes_what_the_server_takes(body: dict[str, Any]) -> None:
    """A schema stricter than the server fails the fuzz test's negative-data check."""
    parse_body(ResponsesRequest, body)
    assert doc_valid("ResponsesRequest", body)


@pytest.mark.parametrize("body", REFUSED)
def test_the_document_refuses_what_it_can_say(body: dict[str, Any]) -> None:
    with pytest.raises(ApiError):
        parse_body(ResponsesRequest, body)
    assert not doc_valid("ResponsesRequest", body)


def _done(reply: ReplyResult, reason: str = "stop") -> Done:
    st = GenerationStats(prompt_tokens=10, cached_tokens=4, gen_tokens=7, stop_reason=reason)  # type: ignore[arg-type]
    st.thinking_tokens = 3
    return Done(reply, st, None)


def _builder(rid: str) -> ResponseBuilder:
    return ResponseBuilder(ResponseObject.model_construct(id=rid, output=[]))


def _read(events: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The builder's events' data, read from the JSON sent."""
    return [json.loads(data) for _, data in events]


def test_builder_reasoning_then_text_then_calls() -> None:
    """A thinking model's answer: a reasoning item, a message, function calls, in order."""
    b = _builder("resp_1")
    events = _read(
        b.start() + b.push([("reasoning", "Hm"), ("reasoning", "m."), ("content", "Ok")])
    )
    call = ToolCall("get_time", '{"zone": "UTC"}', "call_1")
    events += _read(b.finish(_done(ReplyResult("Ok", "Hmm.", [call]))))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    out = b.response.wire()["output"]
    assert [o["type"] for o in out] == ["reasoning", "message", "function_call"]
    assert out[0]["content"] == [{"type": "reasoning_text", "text": "Hmm."}]
    assert out[1]["content"][0]["text"] == "Ok"
    assert out[2]["call_id"] == "call_1" and out[2]["arguments"] == '{"zone": "UTC"}'
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [
        0,
        1,
        2,
    ]
    assert b.response.wire()["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}
    assert b.response.wire()["usage"]["input_tokens_details"] == {"cached_tokens": 4}
    assert b.response.wire()["status"] == "completed"


def test_builder_cut_short_is_incomplete() -> None:
    b = _builder("resp_1")
    b.push([("content", "Once upon")])
    events = _read(b.finish(_done(ReplyResult("Once upon", ""), "length")))
    assert events[-1]["type"] == "response.incomplete"
    assert b.response.wire()["incomplete_details"] == {"reason": "max_output_tokens"}
    assert b.response.wire()["output"][0]["status"] == "incomplete"
    b = _builder("resp_2")
    failed = _read(b.fail("the reply left its grammar"))
    assert [e["type"] for e in failed] == ["error", "response.failed"]
    assert b.response.wire()["status"] == "failed"


def test_store_is_a_bounded_lru_of_copies() -> None:
    s = ResponseStore(max_responses=2, max_chars=200)
    s.put("a", [{"role": "user", "content": "1"}])
    s.put("b", [{"role": "user", "content": "2"}])
    got = s.get("a")  # a is now the most recent
    assert got == [{"role": "user", "content": "1"}]
    assert got is not None
    got[0]["content"] = "changed"
    assert s.get("a") == [{"role": "user", "content": "1"}]
    s.put("c", [{"role": "user", "content": "3"}])
    assert s.get("b") is None and s.get("a") is not None and len(s) == 2
    s.put("big", [{"role": "user", "content": "x" * 150}])  # pushes the others out
    assert s.get("big") is not None and s.get("a") is None and s.get("c") is None
    s.put("huge", [{"role": "user", "content": "x" * 500}])  # larger than the store
    assert s.get("huge") is None
