"""Tool calls, JSON-schema answers and reasoning through the official `openai` and `ollama`
clients, on the real SmolLM2 (whose template has no tool support: the generic format)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import ollama
import openai
import pytest

from engine.host.runtime import Model
from engine.model.templates import ChatTemplate
from engine.server import ServedModel, ServerConfig, ServerState, ServerThread
from engine.settings import LoadParams
from tests.engine.server.conftest import assert_no_leak

WEATHER = {
    "type": "function",
    "function": {
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
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 40}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def schema_of(name: str) -> dict[str, Any]:
    fn = next(t["function"] for t in TOOLS if t["function"]["name"] == name)
    return fn["parameters"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def served(smollm2_path: Path) -> Iterator[tuple[ServedModel, ServerThread]]:
    model = Model(smollm2_path, LoadParams(n_ctx=2 * 2048, n_seq_max=2, n_threads=2))
    loaded = ServedModel.build(model, "smollm2", max_queue=8, embeddings=False)
    state = ServerState(ServerConfig(port=0, model_id="smollm2", max_tokens_cap=256))
    state.set_loaded(loaded)
    with ServerThread(state) as srv:
        yield loaded, srv
    loaded.close()
    model.close()


@pytest.fixture
def client(served: tuple[ServedModel, ServerThread]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served[1].url + "/v1", api_key="none", timeout=120) as c:
        yield c


@pytest.fixture
def oclient(served: tuple[ServedModel, ServerThread]) -> Iterator[ollama.Client]:
    with ollama.Client(host=served[1].url) as c:
        yield c


def check_call(name: str, arguments: str | dict[str, Any]) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, schema_of(name))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_required_returns_a_valid_call(client: openai.OpenAI, temperature: float) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        messages=ASK,  # type: ignore[arg-type]
        tools=TOOLS,
        tool_choice="required",  # type: ignore
        # One call, which its grammar closes well within max_tokens: with parallel calls
        # SmolLM2 may call again and again until the limit, as other rounding decides.
        parallel_tool_calls=False,
        temperature=temperature,
        seed=3,
        max_tokens=200,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and choice.message.content is None
    for c in calls:
        assert c.type == "function" and c.id
        assert c.function.name in ("get_weather", "get_time")
        check_call(c.function.name, c.function.arguments)


def test_named_tool_streamed(
    client: openai.OpenAI, served: tuple[ServedModel, ServerThread]
) -> None:
    stream = client.chat.completions.create(
        model="smollm2",
        messages=ASK,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=200,
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    reasons = []
    content = ""
    for chunk in stream:
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": ""})
            if tc.id:
                entry["id"] = tc.id
            if tc.function and tc.function.name:
                entry["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                entry["arguments"] += tc.function.arguments
        if chunk.choices[0].finish_reason:
            reasons.append(chunk.choices[0].finish_reason)
    assert reasons == ["tool_calls"]
    assert content == ""
    assert len(calls) == 1 and calls[0]["name"] == "get_time" and calls[0]["id"]
    check_call("get_time", calls[0]["arguments"])
    assert_no_leak(served[0])


def test_tool_result_in_the_history_is_answered(
    client: openai.OpenAI, served: tuple[ServedModel, ServerThread]
) -> None:
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "unit": "celsius"}',
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": '{"temperature": 21, "sky": "sunny"}',
        },
    ]
    r = client.chat.completions.create(
        model="smollm2",
        messages=history,  # type: ignore
        tools=TOOLS,
        temperature=0,
        max_tokens=120,
    )
    choice = r.choices[0]
    # The generic format keeps every answer JSON: a reply, or another (valid) call.
    if choice.message.tool_calls:
        for c in choice.message.tool_calls:
            check_call(c.function.name, c.function.arguments)
    else:
        assert choice.finish_reason == "stop" and choice.message.content
    # The model saw the call and its result.
    from engine.server.chat_reply import plan_chat
    from engine.server.protocol.openai import ChatCompletionRequest
    from engine.server.protocol.parse import parse_body

    loaded = served[0]
    messages = parse_body(ChatCompletionRequest, {"messages": history}).chat_messages()
    plan = plan_chat(
        loaded,
        messages,
        tools=[],
        choice="none",
        parallel=True,
        grammar=None,
        grammar_param="response_format",
        think=None,
    )
    prompt = loaded.model.detokenize(plan.prompt)
    assert "sunny" in prompt and "get_weather" in prompt


def test_tool_choice_none_and_bad_choices(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        messages=ASK,  # type: ignore
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=16,
    )
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="not in 'tools'"):
        client.chat.completions.create(
            model="smollm2",
            messages=ASK,
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    with pytest.raises(openai.BadRequestError, match="needs 'tools'"):
        client.chat.completions.create(
            model="smollm2",
            messages=ASK,  # type: ignore
            tool_choice="required",
        )
    bad = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "not": {"required": ["a"]}}},
    }
    with pytest.raises(openai.BadRequestError, match="not") as e:
        client.chat.completions.create(
            model="smollm2",
            messages=ASK,  # type: ignore
            tools=[bad],
            tool_choice="required",
        )
    assert e.value.body["param"] == "tools"  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_answers_validate(client: openai.OpenAI, stream: bool) -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }
    msgs = [{"role": "user", "content": "Invent a person."}]
    if stream:
        text = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model="smollm2",
                messages=msgs,
                response_format=fmt,  # type: ignore[arg-type]
                temperature=0,
                max_tokens=120,
                stream=True,
            )
        )
    else:
        r = client.chat.completions.create(
            model="smollm2",
            messages=msgs,  # type: ignore
            response_format=fmt,
            temperature=0,  # type: ignore
            max_tokens=120,
        )
        assert r.choices[0].finish_reason == "stop"
        text = r.choices[0].message.content or ""
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_and_gbnf(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        messages=ASK,  # type: ignore
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=120,
    )
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)
    r = client.chat.completions.create(
        model="smollm2",
        messages=ASK,  # type: ignore
        temperature=0,
        max_tokens=8,
        extra_body={"grammar": 'root ::= "sunny" | "rainy"'},
    )
    assert r.choices[0].message.content in ("sunny", "rainy")
    c = client.completions.create(
        model="smollm2",
        prompt="The sky is",
        max_tokens=8,
        temperature=0,
        extra_body={"grammar": 'root ::= " blue" | " grey"'},
    )
    assert c.choices[0].text in (" blue", " grey")


def test_unsupported_and_hostile_schemas_are_refused(client: openai.OpenAI) -> None:
    def ask(schema: Any) -> None:
        client.chat.completions.create(
            model="smollm2",
            messages=ASK,
            max_tokens=8,  # type: ignore[arg-type]
            response_format={
                "type": "json_schema",  # type: ignore[arg-type]
                "json_schema": {"name": "x", "schema": schema},
            },
        )

    with pytest.raises(openai.BadRequestError, match="not") as e:
        ask({"type": "object", "not": {"required": ["a"]}})
    assert e.value.body["param"] == "response_format"  # type: ignore[index]
    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(200):
        deep = {"type": "array", "items": deep}
    t0 = time.perf_counter()
    with pytest.raises(openai.BadRequestError, match="nested"):
        ask(deep)
    # Deeper than any JSON parser should follow: refused as a body, before any schema work.
    n = 100_000
    body = (
        '{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], '
        '"response_format": {"type": "json_schema", "json_schema": {"name": "x", '
        '"schema": ' + '{"items": ' * n + "{}" + "}" * n + "}}}"
    )
    r = httpx.post(
        str(client.base_url) + "chat/completions",
        content=body,
        timeout=60,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code in (400, 413)
    with pytest.raises(openai.BadRequestError):
        ask({"enum": list(range(100_000))})
    assert time.perf_counter() - t0 < 60  # bounded, not a speed goal: a hang would time out
    with pytest.raises(openai.BadRequestError, match="exclude each other"):
        client.chat.completions.create(
            model="smollm2",
            messages=ASK,  # type: ignore[arg-type]
            response_format={"type": "json_object"},
            extra_body={"grammar": 'root ::= "a"'},
        )
    with pytest.raises(openai.BadRequestError, match="cannot be combined with tools"):
        client.chat.completions.create(
            model="smollm2",
            messages=ASK,
            tools=TOOLS,  # type: ignore[arg-type]
            response_format={"type": "json_object"},
        )


def test_ollama_tools_format_and_think(
    oclient: ollama.Client, served: tuple[ServedModel, ServerThread]
) -> None:
    r = oclient.chat(
        model="smollm2",
        messages=ASK,
        tools=TOOLS,
        stream=False,
        options={"temperature": 0, "num_predict": 200},
    )
    calls = r.message.tool_calls or []
    if calls:
        # Against the schema as the ollama client sends it: its Tool model keeps `type`,
        # `properties` and `required`, and drops the rest (`additionalProperties: false`
        # among them, so other keys are valid there).
        sent = {
            t["function"]["name"]: ollama.Tool.model_validate(t).model_dump(exclude_none=True)[
                "function"
            ]["parameters"]
            for t in TOOLS
        }
        for c in calls:
            jsonschema.validate(dict(c.function.arguments), sent[c.function.name])
    else:
        assert r.message.content
    r = oclient.chat(
        model="smollm2",
        messages=[{"role": "user", "content": "Invent a person."}],
        format=PERSON,
        stream=False,
        options={"temperature": 0, "num_predict": 120},
    )
    jsonschema.validate(json.loads(r.message.content or ""), PERSON)
    text = "".join(
        p.message.content or ""
        for p in oclient.chat(
            model="smollm2",
            messages=[{"role": "user", "content": "Invent a person."}],
            format="json",
            stream=True,
            options={"temperature": 0, "num_predict": 120},
        )
    )
    assert isinstance(json.loads(text), dict)
    g = oclient.generate(
        model="smollm2",
        prompt="Invent a person.",
        format=PERSON,
        options={"temperature": 0, "num_predict": 120},
    )
    jsonschema.validate(json.loads(g.response), PERSON)
    with pytest.raises(ollama.ResponseError, match="does not think"):
        oclient.chat(model="smollm2", messages=ASK, think=True, stream=False)
    # (the client itself refuses this one, so it goes raw)
    r2 = httpx.post(
        served[1].url + "/api/chat",
        timeout=60,
        json={"model": "smollm2", "messages": ASK, "format": "yaml", "stream": False},
    )
    assert r2.status_code == 400 and "'format'" in r2.json()["error"]


# ChatML whose generation prompt opens a thinking block and whose history drops earlier
# thinking, as DeepSeek-R1 distills' templates do.
THINKING_CHATML = (
    "{% for m in messages %}{% set c = m['content'] %}"
    "{% if m['role'] == 'assistant' and '</think>' in c %}"
    "{% set c = c.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def thinker(smollm2_path: Path) -> Iterator[ServerThread]:
    """SmolLM2 behind a thinking template: the prompt opens a thinking block."""
    model = Model(smollm2_path, LoadParams(n_ctx=1024, n_threads=2))
    model.template = ChatTemplate(
        THINKING_CHATML, bos_token=model.template.bos_token, eos_token=model.template.eos_token
    )
    loaded = ServedModel.build(model, "thinker", max_queue=4, embeddings=False)
    state = ServerState(ServerConfig(port=0, model_id="thinker", max_tokens_cap=128))
    state.set_loaded(loaded)
    with ServerThread(state) as srv:
        yield srv
    loaded.close()
    model.close()


# The reply forced through a thinking block and an answer, so the split is known.
THOUGHT = 'root ::= "Paris is large." "</think>" "\\n\\nParis."'


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_separated(thinker: ServerThread, stream: bool) -> None:
    with openai.OpenAI(base_url=thinker.url + "/v1", api_key="none", timeout=120) as c:
        kw: dict[str, Any] = {
            "model": "thinker",
            "messages": ASK,
            "temperature": 0,
            "max_tokens": 64,
            "extra_body": {"grammar": THOUGHT},
        }
        if stream:
            reasoning = content = ""
            usage = None
            for chunk in c.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, **kw
            ):
                if chunk.usage:
                    usage = chunk.usage
                if chunk.choices:
                    d = chunk.choices[0].delta
                    reasoning += getattr(d, "reasoning_content", None) or ""
                    content += d.content or ""
        else:
            r = c.chat.completions.create(**kw)
            reasoning = getattr(r.choices[0].message, "reasoning_content", "")
            content = r.choices[0].message.content or ""
            usage = r.usage
        assert reasoning.strip() == "Paris is large."
        assert content == "Paris."
        assert usage is not None and usage.completion_tokens_details is not None
        assert 0 < (usage.completion_tokens_details.reasoning_tokens or 0) < usage.completion_tokens
        raw = c.chat.completions.create(
            **{**kw, "extra_body": {"grammar": THOUGHT, "reasoning_format": "none"}}
        )
        assert "</think>" in (raw.choices[0].message.content or "")
        with ollama.Client(host=thinker.url) as oc:
            r2 = oc.chat(
                model="thinker",
                messages=ASK,
                stream=False,
                options={"temperature": 0, "num_predict": 64},
            )
            assert r2.message.thinking  # SmolLM2 never closes the block: all of it is thinking


def test_penalties_honoured_and_logit_bias_refused(client: openai.OpenAI) -> None:
    story = [{"role": "user", "content": "Write a long story about a cat and a cat."}]

    def text(**kw: Any) -> str:
        r = client.chat.completions.create(
            model="smollm2",
            messages=story,  # type: ignore
            temperature=0,
            max_tokens=48,
            **kw,
        )
        return r.choices[0].message.content or ""

    # Once first, so every request below finds the prompt cached: on a CPU whose kernels
    # are not batch-exact (Model.exactness; AVX2-only EPYCs), a cold prompt and a cached one
    # are evaluated in other batch splits, and greedy text may differ between them.
    text()
    plain = text()
    assert text(presence_penalty=2.0, frequency_penalty=2.0) != plain
    assert text(presence_penalty=0.0) == plain
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        text(presence_penalty=3.0)
    with pytest.raises(openai.BadRequestError, match="needs 'logprobs'") as e:
        text(top_logprobs=2)
    assert e.value.body["param"] == "top_logprobs"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        text(logit_bias={"42": 5})
