"""The `context_policy` request field through the real HTTP server: the official `openai`
client on /v1/chat/completions, and the other chat dialects' routes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from engine.host.chat_plan import plan_chat
from engine.host.context_policy import CONTEXT_POLICIES
from engine.server import ServedModel, ServerThread
from tests.engine.server.conftest import API_KEY, http, open_document

MAX_TOKENS = 8


def _conversation(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Question {i}: " + "tell me more " * 20})
        msgs.append({"role": "assistant", "content": f"Answer {i}: " + "here is more " * 20})
    msgs.append({"role": "user", "content": "Final question?"})
    return msgs


LONG = _conversation(20)  # about 1,800 tokens; a slot holds 1,024


@pytest.fixture
def client(server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def _ask(client: openai.OpenAI, policy: str, *, stream: bool = False) -> Any:
    return client.chat.completions.with_raw_response.create(
        model="smollm2",
        messages=LONG,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=stream,  # type: ignore[call-overload]
        extra_body={"context_policy": policy},
    )


@pytest.mark.parametrize("policy", ["drop_oldest", "truncate_middle"])
def test_a_policy_sends_what_it_announces(
    client: openai.OpenAI, served: ServedModel, policy: str
) -> None:
    raw = _ask(client, policy)
    expected = plan_chat(served.model, LONG, policy=policy, reserve=MAX_TOKENS)  # type: ignore[arg-type]
    assert expected.left_out
    assert raw.headers["X-Context-Left-Out"] == str(len(expected.left_out))
    r = raw.parse()
    assert r.usage.prompt_tokens == len(expected.prompt)


def test_the_header_comes_with_a_stream_too(client: openai.OpenAI, served: ServedModel) -> None:
    raw = _ask(client, "drop_oldest", stream=True)
    expected = plan_chat(served.model, LONG, policy="drop_oldest", reserve=MAX_TOKENS)
    assert raw.headers["X-Context-Left-Out"] == str(len(expected.left_out))
    assert any(c.choices and c.choices[0].finish_reason for c in raw.parse())


def test_a_conversation_that_fits_is_sent_whole(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="smollm2",
        messages=_conversation(1),  # type: ignore[arg-type]
        max_tokens=2,
        extra_body={"context_policy": "truncate_middle"},
    )
    assert raw.headers["X-Context-Left-Out"] == "0"


def test_without_a_policy_an_overflow_is_refused_as_before(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=LONG, max_tokens=MAX_TOKENS)  # type: ignore[arg-type]
    assert "the context holds" in str(e.value)


def test_stop_refuses_with_the_sizes(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, "stop")
    body: Any = e.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == "messages"
    assert "the context holds 1024" in body["message"]


def test_an_unknown_policy_is_a_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, "keep_everything")
    body: Any = e.value.body
    assert body["param"] == "context_policy" and "context_policy" in body["message"]


def test_summarise_puts_a_summary_in_place_of_the_left_out_turns(
    client: openai.OpenAI, served: ServedModel
) -> None:
    raw = _ask(client, "summarise")
    without = plan_chat(served.model, LONG, policy="summarise", reserve=MAX_TOKENS)
    assert without.left_out and without.summary is None
    assert raw.headers["X-Context-Left-Out"] == str(len(without.left_out))
    r = raw.parse()
    # The summary is in the prompt: more than the turns kept, and still in the context.
    assert len(without.prompt) < r.usage.prompt_tokens <= served.model.n_ctx_seq - MAX_TOKENS


def _anthropic(policy: str) -> tuple[str, dict[str, Any]]:
    body = {"system": LONG[0]["content"], "messages": LONG[1:], "max_tokens": MAX_TOKENS}
    return "/v1/messages", {**body, "temperature": 0, "context_policy": policy}


def _ollama(policy: str) -> tuple[str, dict[str, Any]]:
    body = {"model": "smollm2", "messages": LONG, "stream": False}
    body["options"] = {"num_predict": MAX_TOKENS, "temperature": 0}
    return "/api/chat", {**body, "context_policy": policy}


def _responses(policy: str) -> tuple[str, dict[str, Any]]:
    body = {"instructions": LONG[0]["content"], "input": LONG[1:], "store": False}
    return "/v1/responses", {**body, "max_output_tokens": MAX_TOKENS, "context_policy": policy}


def _prompt_tokens(answer: dict[str, Any]) -> int:
    if "prompt_eval_count" in answer:
        return int(answer["prompt_eval_count"])
    usage = answer["usage"]
    return int(usage["input_tokens"]) + int(usage.get("cache_read_input_tokens") or 0)


DIALECTS = [_anthropic, _ollama, _responses]


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.__name__[1:])
def test_every_chat_dialect_takes_the_field(
    base_url: str, auth: dict[str, str], served: ServedModel, dialect: Any
) -> None:
    path, body = dialect("truncate_middle")
    r = http.post(base_url + path, json=body, headers=auth)
    assert r.status_code == 200, r.text
    expected = plan_chat(served.model, LONG, policy="truncate_middle", reserve=MAX_TOKENS)
    assert r.headers["X-Context-Left-Out"] == str(len(expected.left_out))
    assert _prompt_tokens(r.json()) == len(expected.prompt)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.__name__[1:])
def test_every_chat_dialect_refuses_an_unknown_policy_naming_it(
    base_url: str, auth: dict[str, str], dialect: Any
) -> None:
    path, body = dialect("most_recent")
    r = http.post(base_url + path, json=body, headers=auth)
    assert r.status_code == 400 and "context_policy" in r.text


@pytest.mark.parametrize(
    "model",
    ["ChatCompletionRequest", "OllamaChatRequest", "AnthropicMessagesRequest", "ResponsesRequest"],
)
def test_the_document_lists_the_field_and_its_values(model: str) -> None:
    doc = open_document()
    field = doc["components"]["schemas"][model]["properties"]["context_policy"]
    values = {v for branch in field["anyOf"] for v in branch.get("enum", ())}
    assert values == set(CONTEXT_POLICIES)
