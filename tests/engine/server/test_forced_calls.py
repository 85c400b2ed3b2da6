"""A forced tool call (tool_choice required or a named function) is calls, never text: on the
real SmolLM2 (the generic format: its grammar bounds the calls and their strings) and, cut at
a known point, on the fake model for each API's shape of a call the token limit cut.
`parallel_tool_calls: false` means one call, forced or not."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from engine.decoding.tool_calls import MAX_PARALLEL_CALLS
from engine.server import ServedModel, ServerThread
from tests.engine.server.conftest import API_KEY, assert_no_leak, doc_valid, http, make_config
from tests.fake_server_engine import FakeModel, fake_model, serve_fake

WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
CHAT_WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {k: WEATHER[k] for k in ("name", "description", "parameters")},
}
ASK = "What is the weather in London?"
CALL = '{"name": "get_weather", "arguments": {"city": "London, England"}}'
# Two calls, the second cut inside its string by the token limit: the answer, as the
# fake writes it (a token is a word with the whitespace before it).
CUT = '{"tool_calls": [' + CALL + ', {"name": "get_weather", "arguments": {"city": "London,'
REPLY = CUT + ' England"}}]}'
LIMIT = len(re.findall(r"\s*\S+|\s+", CUT))  # the tokens of CUT


@pytest.fixture(scope="module")
def real(server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=120) as c:
        yield c


def test_a_forced_call_is_never_a_message(real: openai.OpenAI, served: ServedModel) -> None:
    """The issue's case: plain requests first, then forced calls with a small token budget.
    Sampled at the default temperature, SmolLM2 often repeats its call until the limit."""
    for _ in range(2):
        real.responses.create(model="smollm2", input="Say hello.", max_output_tokens=16)
    for _ in range(4):
        r = real.responses.create(
            model="smollm2",
            input=ASK,
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice="required",
            max_output_tokens=64,
        )
        assert r.output and all(o.type == "function_call" for o in r.output), r.output
        assert len(r.output) <= MAX_PARALLEL_CALLS
        assert all(o.status == "completed" for o in r.output[:-1])  # type: ignore[union-attr]
        last = r.output[-1]
        assert last.type == "function_call" and last.name == "get_weather"
        assert isinstance(json.loads(last.arguments), dict)
        assert r.status == ("incomplete" if last.status == "incomplete" else "completed")
    assert_no_leak(served)


def test_parallel_false_is_one_call(real: openai.OpenAI, served: ServedModel) -> None:
    for seed in range(2):
        r = real.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": ASK}],
            tools=[CHAT_WEATHER],  # type: ignore[list-item]
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=64,
            seed=seed,
        )
        choice = r.choices[0]
        assert choice.message.content is None
        assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
        assert choice.finish_reason in ("tool_calls", "length")
    assert_no_leak(served)


# -- a call the token limit cut, per API (the fake model: the cut comes where the test says) --


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeModel, ServerThread]]:
    with (
        fake_model(tmp_path_factory.mktemp("models")) as model,
        serve_fake(model, make_config(model_id="fake")) as srv,
    ):
        yield model, srv


@pytest.fixture
def fake_oai(fake: tuple[FakeModel, ServerThread]) -> Iterator[openai.OpenAI]:
    fake[0].reset()
    with openai.OpenAI(base_url=fake[1].url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c
    assert fake[0].loop.wait_idle(10)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completion_cut_call_is_length_with_the_partial_call(
    fake_oai: openai.OpenAI, fake: tuple[FakeModel, ServerThread], stream: bool
) -> None:
    fake[0].script(REPLY)
    kw: dict[str, Any] = {
        "model": "fake",
        "messages": [{"role": "user", "content": ASK}],
        "tools": [CHAT_WEATHER],
        "tool_choice": "required",
        "max_tokens": LIMIT,
    }
    if stream:
        content, calls, reason = "", {}, None
        for chunk in fake_oai.chat.completions.create(**kw, stream=True):
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for c in delta.tool_calls or []:
                assert c.function is not None
                calls[c.index] = (c.function.name, c.function.arguments)
            reason = chunk.choices[0].finish_reason or reason
        got = [calls[k] for k in sorted(calls)]
    else:
        r = fake_oai.chat.completions.create(**kw)
        msg, reason = r.choices[0].message, r.choices[0].finish_reason
        content = msg.content or ""
        assert msg.content is None and msg.tool_calls is not None
        got = [(c.function.name, c.function.arguments) for c in msg.tool_calls]
    assert content == "" and reason == "length"
    assert [(n, json.loads(a)) for n, a in got] == [
        ("get_weather", {"city": "London, England"}),
        ("get_weather", {"city": "London,"}),
    ]


def test_responses_cut_call_is_an_incomplete_function_call(
    fake_oai: openai.OpenAI, fake: tuple[FakeModel, ServerThread]
) -> None:
    fake[0].script(REPLY)
    r = fake_oai.responses.create(
        model="fake",
        input=ASK,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=LIMIT,
    )
    assert [(o.type, o.status) for o in r.output] == [  # type: ignore[union-attr]
        ("function_call", "completed"),
        ("function_call", "incomplete"),
    ]
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert json.loads(r.output[1].arguments) == {"city": "London,"}  # type: ignore[union-attr]
    # Cut before any call was named: still no message, an incomplete answer with no output.
    fake[0].script('{"tool_calls": [{"name": "get_wea')
    body = http.post(
        fake[1].url + "/v1/responses",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": "fake", "input": ASK, "tools": [WEATHER], "tool_choice": "required"},
    ).json()
    assert body["output"] == [] and body["status"] == "incomplete"
    assert doc_valid("ResponseObject", body)


def test_anthropic_cut_tool_use_is_max_tokens(fake: tuple[FakeModel, ServerThread]) -> None:
    fake[0].reset()
    fake[0].script(REPLY)
    with anthropic.Anthropic(base_url=fake[1].url, api_key=API_KEY, max_retries=0) as c:
        m = c.messages.create(
            model="fake",
            max_tokens=LIMIT,
            messages=[{"role": "user", "content": ASK}],
            tools=[{"name": "get_weather", "input_schema": WEATHER["parameters"]}],
            tool_choice={"type": "any"},
        )
    assert m.stop_reason == "max_tokens"
    assert [(b.type, getattr(b, "input", None)) for b in m.content] == [
        ("tool_use", {"city": "London, England"}),
        ("tool_use", {"city": "London,"}),
    ]


def test_auto_without_parallel_calls_reads_the_first_call(
    fake_oai: openai.OpenAI, fake: tuple[FakeModel, ServerThread]
) -> None:
    fake[0].script(
        '{"tool_calls": [' + CALL + ", " + CALL.replace("London, England", "Oslo") + "]}"
    )
    r = fake_oai.chat.completions.create(
        model="fake",
        messages=[{"role": "user", "content": ASK}],
        tools=[CHAT_WEATHER],  # type: ignore[list-item]
        parallel_tool_calls=False,
    )
    calls = r.choices[0].message.tool_calls
    assert calls is not None and [json.loads(c.function.arguments) for c in calls] == [
        {"city": "London, England"}
    ]
    assert r.choices[0].finish_reason == "tool_calls"
