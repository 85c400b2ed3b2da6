"""Log probabilities in the answers, without a model: the shaping functions (chat entries,
completions' columns and their offsets, which part of a read reply a token goes with), and
the routes over the fake model: OpenAI chat and completions, Ollama chat and generate, each
whole and streamed, against the document and each other; the fields' refusals."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest

from engine.decoding.reasoning import ThinkMarkers
from engine.decoding.reply_reader import ReplyReader
from engine.host.logprobs import TokenLogprob, TopLogprob
from engine.server import ServerThread
from engine.server.protocol.logprobs import TextColumns, entries
from engine.server.reply_logprobs import CONTENT, SHOWN, PartLogprobs
from tests.engine.server.conftest import API_KEY, http, make_config
from tests.engine.server.test_answers_documented import check, check_event, check_line
from tests.fake_server_engine import SCRIPT_LOGIT, FakeModel, fake_model, serve_fake

AUTH = {"Authorization": f"Bearer {API_KEY}"}
M = [{"role": "user", "content": "What is the capital of France?"}]
REPLY = "Paris is the capital of France."


def tok(piece: bytes, logprob: float = -0.5, top: tuple[TopLogprob, ...] = ()) -> TokenLogprob:
    return TokenLogprob(token=len(piece), piece=piece, logprob=logprob, top=top)


# -- the shapes --------------------------------------------------------------------------------


def test_chat_entries_carry_text_bytes_and_alternatives() -> None:
    alt = (TopLogprob(5, b" Paris", -0.1), TopLogprob(0, b"</s>", -3.0))
    [e] = entries([tok(b" Paris", -0.1, alt)])
    assert e.wire() == {
        "token": " Paris",
        "logprob": -0.1,
        "bytes": list(b" Paris"),
        "top_logprobs": [
            {"token": " Paris", "logprob": -0.1, "bytes": list(b" Paris")},
            {"token": "</s>", "logprob": -3.0, "bytes": list(b"</s>")},
        ],
    }
    # A token that ends inside a character: its bytes exactly, its text escaped.
    [part] = entries([tok(b"\xe2\x80")])
    assert part.token == "\\xe2\\x80" and part.bytes == [0xE2, 0x80]


def test_completion_columns_count_characters_across_chunks() -> None:
    cols = TextColumns()
    # "Caf" "\xc3" "\xa9 ok": the é spans two tokens; offsets are characters of the text.
    first = cols.take([tok(b"Caf", -0.2, (TopLogprob(1, b"Caf", -0.2),))])
    second = cols.take([tok(b"\xc3"), tok(b"\xa9 ok")])
    assert first.wire() == {
        "tokens": ["Caf"],
        "token_logprobs": [-0.2],
        "top_logprobs": [{"Caf": -0.2}],
        "text_offset": [0],
    }
    assert second.tokens == ["\\xc3", "\\xa9 ok"]
    assert second.text_offset == [3, 3]  # the é starts where its first byte's token does
    assert cols.take([tok(b"!")]).text_offset == [7]  # after "Café ok", 7 characters


def test_two_alternatives_that_read_alike_keep_the_likelier() -> None:
    same = (TopLogprob(1, b"a", -0.5), TopLogprob(2, b"a", -1.5), TopLogprob(3, b"b", -2.0))
    assert TextColumns().take([tok(b"a", -0.5, same)]).top_logprobs == [{"a": -0.5, "b": -2.0}]


def test_tokens_go_with_the_part_that_shows_them() -> None:
    reader = ReplyReader(ThinkMarkers("<think>", "</think>"))
    pieces = ["<think>", "hm", "</think>", "Hi", " there"]
    lps = [tok(p.encode()) for p in pieces]
    content, shown = PartLogprobs(CONTENT), PartLogprobs(SHOWN)
    got_content: list[list[bytes]] = []
    got_shown: list[list[bytes]] = []
    for text, lp in zip(pieces, lps, strict=True):
        parts = reader.push(text)
        got_content += [[t.piece for t in own] for own in content.push(parts, [lp]) if own]
        got_shown += [[t.piece for t in own] for own in shown.push(parts, [lp]) if own]
    tail, reply = reader.finish()
    content.push(tail, ())
    shown.push(tail, ())
    assert reply.content == "Hi there" and reply.reasoning == "hm"
    # The chat's content: the thinking's tokens are left out, the block's end goes with the
    # text it let through.
    assert got_content == [[b"</think>", b"Hi"], [b" there"]]
    assert [t.piece for t in content.taken] == [b"</think>", b"Hi", b" there"]
    # Ollama shows the thinking too: the markers go with the text they let through.
    assert got_shown == [[b"<think>", b"hm"], [b"</think>", b"Hi"], [b" there"]]


# -- the routes, over the fake model -----------------------------------------------------------


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


def sse(text: str) -> list[dict[str, Any]]:
    data = [x[len("data: ") :] for x in text.split("\n\n") if x.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(x) for x in data[:-1]]


def chosen(fake: FakeModel) -> float:
    """The fake's row: the scripted token's logit, 0 for every other piece, -inf past them."""
    return SCRIPT_LOGIT - math.log(math.exp(SCRIPT_LOGIT) + len(fake.vocab) - 1)


def assert_entries(fake: FakeModel, content: list[dict[str, Any]], text: str, n_top: int) -> None:
    assert b"".join(bytes(e["bytes"]) for e in content).decode() == text
    assert [e["token"] for e in content] == [p.decode() for p in pieces(fake, text)]
    for e in content:
        assert e["logprob"] == pytest.approx(chosen(fake), abs=1e-6)
        assert len(e["top_logprobs"]) == n_top
        if n_top:
            assert e["top_logprobs"][0]["token"] == e["token"]


def pieces(fake: FakeModel, text: str) -> list[bytes]:
    return [fake.vocab.piece(t) for t in fake.vocab.tokenize(text)]


def test_openai_chat_whole_and_streamed(srv: ServerThread, fake: FakeModel) -> None:
    fake.script(REPLY, REPLY)
    body = {"messages": M, "logprobs": True, "top_logprobs": 2, "temperature": 0}
    whole = check("/v1/chat/completions", "post", post(srv, "/v1/chat/completions", body))
    content = whole["choices"][0]["logprobs"]["content"]
    assert whole["choices"][0]["logprobs"]["refusal"] is None
    assert_entries(fake, content, REPLY, 2)
    # With llama-server's timings on every chunk too.
    streaming = {**body, "stream": True, "timings_per_token": True}
    chunks = sse(post(srv, "/v1/chat/completions", streaming).text)
    for c in chunks:
        check_event("/v1/chat/completions", c)
    streamed: list[dict[str, Any]] = []
    for c in chunks:
        for choice in c["choices"]:
            lp, delta = choice["logprobs"], choice["delta"]
            if delta.get("content"):
                own = lp["content"]
                assert b"".join(bytes(e["bytes"]) for e in own).decode() == delta["content"]
                assert "timings" in c
                streamed += own
            else:
                assert lp is None  # the role's chunk, the finish
    assert streamed == content


def test_openai_completions_whole_and_streamed(srv: ServerThread, fake: FakeModel) -> None:
    fake.script(REPLY, REPLY)
    body = {"prompt": "The capital of France", "logprobs": 3, "temperature": 0}
    whole = check("/v1/completions", "post", post(srv, "/v1/completions", body))
    lp = whole["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == REPLY
    assert lp["text_offset"][0] == 0 and lp["text_offset"][1] == len(lp["tokens"][0])
    assert all(len(d) == 3 for d in lp["top_logprobs"])
    assert lp["token_logprobs"] == pytest.approx([chosen(fake)] * len(lp["tokens"]), abs=1e-6)
    chunks = sse(post(srv, "/v1/completions", {**body, "stream": True}).text)
    merged: dict[str, list[Any]] = {k: [] for k in lp}
    for c in chunks:
        check_event("/v1/completions", c)
        for choice in c["choices"]:
            if choice["text"]:
                for k in merged:
                    merged[k] += choice["logprobs"][k]
    assert merged == lp


def test_ollama_chat_and_generate(srv: ServerThread, fake: FakeModel) -> None:
    fake.script(REPLY, REPLY, REPLY)
    chat = {"model": "fake", "messages": M, "logprobs": True, "top_logprobs": 1}
    whole = check("/api/chat", "post", post(srv, "/api/chat", {**chat, "stream": False}))
    assert_entries(fake, whole["logprobs"], REPLY, 1)
    lines = [json.loads(x) for x in post(srv, "/api/chat", chat).text.splitlines()]
    streamed = []
    for line in lines:
        check_line("/api/chat", line)
        if line["message"]["content"]:
            streamed += line["logprobs"]
    assert streamed == whole["logprobs"]
    gen = {"model": "fake", "prompt": "Capital?", "logprobs": True, "stream": False}
    answer = check("/api/generate", "post", post(srv, "/api/generate", gen))
    assert_entries(fake, answer["logprobs"], REPLY, 0)


def test_nothing_asked_nothing_given(srv: ServerThread, fake: FakeModel) -> None:
    fake.script(REPLY, REPLY)
    chat = post(srv, "/v1/chat/completions", {"messages": M, "top_logprobs": 0}).json()
    assert chat["choices"][0]["logprobs"] is None
    ollama = post(srv, "/api/chat", {"model": "fake", "messages": M, "stream": False}).json()
    assert "logprobs" not in ollama


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/v1/chat/completions", {"messages": M, "top_logprobs": 2}, "top_logprobs", "needs"),
        (
            "/v1/chat/completions",
            {"messages": M, "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
            "at most 20",
        ),
        ("/v1/chat/completions", {"messages": M, "logprobs": 2}, "logprobs", "true or false"),
        ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs", "at most 20"),
        ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs", "whole number"),
        ("/v1/completions", {"prompt": "x", "top_logprobs": 2}, "top_logprobs", "not supported"),
        ("/api/chat", {"model": "fake", "messages": M, "top_logprobs": 3}, "top_logprobs", "needs"),
    ],
)
def test_refusals_name_the_field(
    srv: ServerThread, path: str, body: dict[str, Any], param: str, words: str
) -> None:
    r = post(srv, path, body)
    assert r.status_code == 400
    text = r.text
    assert param in text and words in text
    if path.startswith("/v1"):
        assert r.json()["error"]["param"] == param


def test_responses_whole_and_streamed(srv: ServerThread, fake: FakeModel) -> None:
    fake.script(REPLY, REPLY)
    body = {"input": "Capital?", "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    whole = check("/v1/responses", "post", post(srv, "/v1/responses", body))
    [message] = [i for i in whole["output"] if i["type"] == "message"]
    [text] = message["content"]
    assert text["text"] == REPLY
    assert_entries(fake, text["logprobs"], REPLY, 2)
    r = post(srv, "/v1/responses", {**body, "stream": True})
    events = [
        json.loads(x[len("data: ") :])
        for block in r.text.split("\n\n")
        for x in block.splitlines()
        if x.startswith("data: ")
    ]
    streamed = []
    for ev in events:
        check_event("/v1/responses", ev)
        if ev["type"] == "response.output_text.delta":
            own = ev["logprobs"]
            assert b"".join(bytes(e["bytes"]) for e in own).decode() == ev["delta"]
            streamed += own
    [done] = [ev for ev in events if ev["type"] == "response.output_text.done"]
    assert streamed == done["logprobs"] == text["logprobs"]
    # Without the include, top_logprobs alone asks; with neither, nothing is given.
    fake.script(REPLY, REPLY)
    alone = post(srv, "/v1/responses", {"input": "Capital?", "top_logprobs": 1}).json()
    assert len(alone["output"][-1]["content"][0]["logprobs"][0]["top_logprobs"]) == 1
    plain = post(srv, "/v1/responses", {"input": "Capital?"}).json()
    assert "logprobs" not in plain["output"][-1]["content"][0]


def test_responses_refuses_other_includes(srv: ServerThread) -> None:
    r = post(srv, "/v1/responses", {"input": "Hi", "include": ["reasoning.encrypted_content"]})
    assert r.status_code == 400
    assert "'include' 'reasoning.encrypted_content' is not supported" in r.text
    r = post(srv, "/v1/responses", {"input": "Hi", "top_logprobs": 21})
    assert r.status_code == 400 and "'top_logprobs' must be at most 20" in r.text
