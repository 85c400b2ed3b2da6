"""The server's routes over a fake model (tests/fake_server_engine.py), driven by the
official clients over a real socket: the wire format of each API, the request checks and
the errors, with no model loaded. The same routes over SmolLM2 are tested in the other files
here; these pin down what does not depend on the model's words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from engine.server import ServerThread
from tests.engine.server.conftest import API_KEY, http, make_config
from tests.fake_server_engine import FakeModel, fake_model, serve_fake

AUTH = {"Authorization": f"Bearer {API_KEY}"}
REPLY = "Paris is the capital of France."  # six word-tokens for the fake
MSG = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
]
CHATML = (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def module_fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeModel]:
    with fake_model(tmp_path_factory.mktemp("models")) as model:
        yield model


@pytest.fixture(scope="module")
def fake_server(module_fake: FakeModel) -> Iterator[ServerThread]:
    with serve_fake(module_fake, make_config(model_id="fake")) as srv:
        # A name the host must look up starts the event loop's executor thread: now, so
        # that no test is blamed for leaving it running.
        http.post(
            srv.url + "/v1/chat/completions",
            headers=AUTH,
            json={"model": "warm-up", "messages": MSG},
        )
        yield srv


@pytest.fixture
def fake(module_fake: FakeModel) -> Iterator[FakeModel]:
    """The served fake, its script and what it saw emptied for each test."""
    module_fake.reset()
    yield module_fake
    assert module_fake.loop.wait_idle(10), "a request was still running after the test"


@pytest.fixture
def oai(fake_server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fake_server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


@pytest.fixture
def oll(fake_server: ServerThread) -> Iterator[ollama.Client]:
    with ollama.Client(host=fake_server.url, headers=AUTH) as c:
        yield c


# -- OpenAI ----------------------------------------------------------------------------------


def test_models_list_and_retrieve(oai: openai.OpenAI, fake_server: ServerThread) -> None:
    models = oai.models.list()
    assert [(m.id, m.object, m.owned_by) for m in models.data] == [("fake", "model", "candlewick")]
    assert oai.models.retrieve("fake").id == "fake"
    # By its file name too, as the host resolves names.
    assert oai.models.retrieve("fake-135m-q4.gguf").id == "fake"
    raw = http.get(fake_server.url + "/v1/models", headers=AUTH).json()
    assert raw["object"] == "list"
    meta = raw["data"][0]["meta"]
    assert raw["data"][0]["loaded"] is True
    assert (meta["slots"], meta["ctx_per_slot"]) == (2, 512)
    with pytest.raises(openai.NotFoundError) as e:
        oai.models.retrieve("nope")
    assert e.value.status_code == 404
    assert "model 'nope' not found; available: fake" in str(e.value)


def test_chat_completion(oai: openai.OpenAI, fake: FakeModel) -> None:
    fake.script(REPLY)
    r = oai.chat.completions.create(
        model="fake",
        messages=MSG,  # type: ignore[arg-type]
        max_tokens=24,
        temperature=0.2,
        top_p=0.9,
        seed=7,
    )
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == "fake" and r.system_fingerprint == "candlewick"
    choice = r.choices[0]
    assert (choice.index, choice.message.role, choice.message.content) == (0, "assistant", REPLY)
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    seen = fake.seen[-1]
    assert seen.prompt == CHATML  # the model's chat template rendered the messages
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(fake.tokenize(CHATML)), 6)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    s = seen.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.seed) == (24, 0.2, 0.9, 7)
    assert seen.stream is False
    # A field the request leaves out means what OpenAI and llama-server do: no repeat penalty
    # (the desktop chat's 1.1 is not the API's), so the penalties sampler is not in the chain.
    assert s.repeat_penalty == 1.0 and not s.penalizes


def test_length_stop_strings_and_the_token_cap(oai: openai.OpenAI, fake: FakeModel) -> None:
    fake.script(REPLY, REPLY, REPLY)
    cut = oai.chat.completions.create(
        model="fake",
        messages=MSG,  # type: ignore[arg-type]
        max_tokens=3,
    )
    assert cut.choices[0].message.content == "Paris is the"
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None and cut.usage.completion_tokens == 3
    stopped = oai.chat.completions.create(
        model="fake",
        messages=MSG,  # type: ignore[arg-type]
        stop=[" capital"],
    )
    assert stopped.choices[0].message.content == "Paris is the"
    assert stopped.choices[0].finish_reason == "stop"
    # More than the server's cap (64 in these tests' config) is clamped, not refused.
    oai.chat.completions.create(
        model="fake",
        messages=MSG,  # type: ignore[arg-type]
        max_tokens=100_000,
    )
    assert [x.sampling.max_tokens for x in fake.seen] == [3, 64, 64]


def test_streaming_chunks(oai: openai.OpenAI, fake: FakeModel) -> None:
    fake.script(REPLY)
    chunks = list(
        oai.chat.completions.create(  # type: ignore[call-overload]
            model="fake", messages=MSG, stream=True, stream_options={"include_usage": True}
        )
    )
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    first, *pieces, last, usage = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    # One chunk per generated token, in order, then the finish reason on its own.
    assert [p.choices[0].delta.content for p in pieces] == [
        "Paris",
        " is",
        " the",
        " capital",
        " of",
        " France.",
    ]
    assert all(p.choices[0].finish_reason is None for p in pieces)
    assert last.choices[0].finish_reason == "stop" and last.choices[0].delta.content is None
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.completion_tokens == 6
    assert fake.seen[-1].stream is True


def test_streaming_wire_format(fake_server: ServerThread, fake: FakeModel) -> None:
    fake.script("One two")
    body = {"model": "fake", "messages": MSG, "stream": True}
    with httpx.stream(
        "POST", fake_server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        text = r.read().decode()
    events = text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]  # the stream ends with the sentinel
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert ["".join(c["choices"][0]["delta"].get("content", "")) for c in payloads] == [
        "",
        "One",
        " two",
        "",
    ]
    assert [c["choices"][0]["finish_reason"] for c in payloads] == [None, None, None, "stop"]


def test_completions_route(oai: openai.OpenAI, fake: FakeModel) -> None:
    fake.script("3, 4, 5", "3, 4, 5")
    r = oai.completions.create(model="fake", prompt="1, 2,", max_tokens=2)
    assert r.object == "text_completion" and r.choices[0].text == "3, 4,"
    assert r.choices[0].finish_reason == "length"
    assert fake.seen[-1].prompt == "1, 2,"  # a raw prompt: no chat template
    pieces = list(oai.completions.create(model="fake", prompt="1, 2,", stream=True))
    assert "".join(p.choices[0].text for p in pieces) == "3, 4, 5"
    assert pieces[-1].choices[0].finish_reason == "stop"


def test_bad_fields_are_400s_naming_the_field(
    oai: openai.OpenAI, fake_server: ServerThread, fake: FakeModel
) -> None:
    url = fake_server.url + "/v1/chat/completions"
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"logit_bias": {"42": 5}}, "logit_bias", "'logit_bias' is not supported"),
        ({"temperature": 5}, "temperature", "'temperature'"),
        ({"max_tokens": "many"}, "max_tokens", "'max_tokens' must be a whole number"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages", "'messages[0]"),
    ]
    for extra, param, message in cases:
        r = http.post(url, headers=AUTH, json={"model": "fake", "messages": MSG, **extra})
        assert r.status_code == 400, extra
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param, extra
        assert err["message"].startswith(message), err
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model="fake",
            messages=MSG,  # type: ignore[arg-type]
            logit_bias={"42": 5},
        )
    assert e.value.status_code == 400 and e.value.param == "logit_bias"
    assert fake.seen == []  # refused before the model saw anything
    # A key the server does not know is refused by name, not ignored.
    r = http.post(url, headers=AUTH, json={"model": "fake", "messages": MSG, "frobnicate": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate"
    assert "'frobnicate' is not a field of this API" in r.json()["error"]["message"]
    assert fake.seen == []


def test_unknown_model_is_a_404_listing_the_known_ones(oai: openai.OpenAI, fake: FakeModel) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="llama3", messages=MSG)  # type: ignore[arg-type]
    assert e.value.status_code == 404 and e.value.code == "model_not_found"
    assert e.value.param == "model"
    assert isinstance(e.value.body, dict)
    assert e.value.body["message"] == "model 'llama3' not found; available: fake"
    assert fake.seen == []


def test_the_api_key_is_required(fake_server: ServerThread) -> None:
    with (
        openai.OpenAI(
            base_url=fake_server.url + "/v1", api_key="wrong-key-123", max_retries=0
        ) as bad,
        pytest.raises(openai.AuthenticationError),
    ):
        bad.models.list()
    assert http.get(fake_server.url + "/health").json()["model"] == "fake"


# -- Ollama ----------------------------------------------------------------------------------


def test_ollama_chat(oll: ollama.Client, fake: FakeModel) -> None:
    fake.script(REPLY, REPLY)
    whole = oll.chat(
        model="fake", messages=MSG, options={"num_predict": 32, "seed": 3}, stream=False
    )
    assert whole.done and whole.done_reason == "stop" and whole.model == "fake"
    assert whole.message.role == "assistant" and whole.message.content == REPLY
    assert whole.eval_count == 6 and whole.prompt_eval_count == len(fake.tokenize(CHATML))
    assert fake.seen[-1].prompt == CHATML
    assert (fake.seen[-1].sampling.max_tokens, fake.seen[-1].sampling.seed) == (32, 3)
    assert fake.seen[-1].sampling.repeat_penalty == 1.1  # Ollama's own default
    parts = list(oll.chat(model="fake", messages=MSG, stream=True))
    assert [p.done for p in parts] == [False] * 6 + [True]
    assert "".join(p.message.content or "" for p in parts) == REPLY
    assert parts[-1].message.content == "" and parts[-1].eval_count == 6


def test_ollama_generate(oll: ollama.Client, fake: FakeModel) -> None:
    fake.script(REPLY, "3, 4, 5")
    r = oll.generate(
        model="fake",
        prompt="What is the capital of France?",
        system="Be brief.",
        options={"num_predict": 2},
    )
    assert r.done and r.response == "Paris is" and r.done_reason == "length"
    assert fake.seen[-1].prompt == CHATML  # system and prompt through the template
    raw = "".join(
        p.response or "" for p in oll.generate(model="fake", prompt="1, 2,", raw=True, stream=True)
    )
    assert raw == "3, 4, 5" and fake.seen[-1].prompt == "1, 2,"
    # An empty prompt loads the model and says so, generating nothing (as Ollama does).
    loaded = oll.generate(model="fake", prompt="")
    assert loaded.done and loaded.done_reason == "load" and len(fake.seen) == 2


def test_ollama_tags_and_errors(
    oll: ollama.Client, fake_server: ServerThread, module_fake: FakeModel
) -> None:
    (entry,) = oll.list().models
    assert entry.model == "fake" and entry.size == module_fake.path.stat().st_size
    assert entry.details is not None and entry.details.format == "gguf"
    assert entry.digest and len(entry.digest) == 64
    with pytest.raises(ollama.ResponseError) as e:
        oll.chat(model="llama3", messages=MSG)
    assert e.value.status_code == 404 and "not found" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        oll.chat(model="fake", messages=MSG, options={"temperature": -3})
    assert e.value.status_code == 400 and "temperature" in e.value.error
    r = http.post(
        fake_server.url + "/api/chat", headers=AUTH, json={"model": "fake", "messages": "hi"}
    )
    assert r.status_code == 400 and isinstance(r.json()["error"], str)  # Ollama's shape


# -- Anthropic and Responses -----------------------------------------------------------------


def test_anthropic_messages(fake_server: ServerThread, fake: FakeModel) -> None:
    fake.script(REPLY, REPLY)
    with anthropic.Anthropic(base_url=fake_server.url, api_key=API_KEY, max_retries=0) as c:
        m = c.messages.create(
            model="fake",
            max_tokens=32,
            system="Be brief.",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        assert m.role == "assistant" and m.stop_reason == "end_turn"
        assert [(b.type, getattr(b, "text", None)) for b in m.content] == [("text", REPLY)]
        assert m.usage.output_tokens == 6
        assert fake.seen[-1].prompt == CHATML
        assert fake.seen[-1].sampling.repeat_penalty == 1.0
        with c.messages.stream(
            model="fake", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
        ) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert text == "Paris is" and final.stop_reason == "max_tokens"
        with pytest.raises(anthropic.NotFoundError):
            c.messages.create(
                model="llama3", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
            )


def test_responses_api(oai: openai.OpenAI, fake: FakeModel) -> None:
    fake.script(REPLY)
    r = oai.responses.create(
        model="fake", input="What is the capital of France?", instructions="Be brief."
    )
    assert r.status == "completed" and r.output_text == REPLY
    assert r.usage is not None and r.usage.output_tokens == 6
    assert fake.seen[-1].prompt == CHATML
    assert fake.seen[-1].sampling.repeat_penalty == 1.0
