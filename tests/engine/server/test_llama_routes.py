"""llama-server's utility routes and what its web UI needs, over the fake model
(tests/fake_server_engine.py) on a real socket: /tokenize, /detokenize, /apply-template,
/props, the timings and prompt progress of a chat answer, the pings of a silent stream,
and the 404 of a route the server does not have. Every answer is checked against the
OpenAPI document. The same routes over SmolLM2 are in test_llama_routes_model.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from engine.host.requests import Event, Piece
from engine.host.stats import GenerationStats
from engine.server.config import ServerError
from engine.server.engine_state import AsyncGeneration
from engine.server.llama_stream import LlamaStream
from engine.server.protocol.llama import LlamaChatFields, Timings
from tests.engine.server.conftest import API_KEY, http, make_config
from tests.engine.server.test_answers_documented import check, check_event
from tests.fake_server_engine import FakeModel, fake_model, serve_fake

AUTH = {"Authorization": f"Bearer {API_KEY}"}
REPLY = "Paris is the capital of France."  # six word-tokens for the fake
MSG = [{"role": "user", "content": "What is the capital of France?"}]
CHATML = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
# What llama-server's web UI sends with a message (tools/ui's chat.service.ts, defaults).
UI_CHAT = {
    "messages": MSG,
    "stream": True,
    "timings_per_token": True,
    "return_progress": True,
    "sse_ping_interval": 1,
    "reasoning_format": "auto",
    "reasoning_control": True,
    "backend_sampling": False,
    # The UI's own tools, which it runs in the browser when the model calls them.
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_datetime",
                "description": "Returns the current local date and time in ISO 8601 format",
                "parameters": {"type": "object", "properties": {}, "required": []},
            },
        }
    ],
}
TIMINGS = {
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
}


@pytest.fixture(scope="module")
def module_fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeModel]:
    with fake_model(tmp_path_factory.mktemp("models")) as model:
        yield model


@pytest.fixture(scope="module")
def url(module_fake: FakeModel) -> Iterator[str]:
    with serve_fake(module_fake, make_config(model_id="fake")) as srv:
        # A name the host must look up starts the event loop's executor thread: now, so that
        # no test is blamed for leaving it running.
        http.post(srv.url + "/tokenize", headers=AUTH, json={"content": "x", "model": "warm-up"})
        yield srv.url


@pytest.fixture
def fake(module_fake: FakeModel) -> Iterator[FakeModel]:
    module_fake.reset()
    yield module_fake
    assert module_fake.loop.wait_idle(10), "a request was still running after the test"


def llama_error(r: httpx.Response, status: int, kind: str) -> str:
    """The message of llama-server's error answer `r`, checked for its shape."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "type"}
    assert body["error"]["code"] == status and body["error"]["type"] == kind
    return str(body["error"]["message"])


def sse(text: str) -> list[dict[str, Any]]:
    data = [x[len("data: ") :] for x in text.split("\n\n") if x.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(x) for x in data[:-1]]


# -- /tokenize, /detokenize ------------------------------------------------------------------


def test_tokenize_and_detokenize(url: str, fake: FakeModel) -> None:
    r = http.post(url + "/tokenize", headers=AUTH, json={"content": REPLY})
    tokens = check("/tokenize", "post", r)["tokens"]
    assert tokens == fake.tokenize(REPLY)
    r = http.post(url + "/tokenize", headers=AUTH, json={"content": REPLY, "with_pieces": True})
    pieces = check("/tokenize", "post", r)["tokens"]
    assert [p["id"] for p in pieces] == tokens
    assert "".join(p["piece"] for p in pieces) == REPLY
    r = http.post(url + "/detokenize", headers=AUTH, json={"tokens": tokens, "model": "fake"})
    assert check("/detokenize", "post", r) == {"content": REPLY}
    # llama-server's defaults: nothing to tokenize or detokenize is an empty answer.
    assert http.post(url + "/detokenize", headers=AUTH, json={}).json() == {"content": ""}


def test_tokenize_keeps_the_ids_of_mixed_content(url: str, fake: FakeModel) -> None:
    paris, france = fake.tokenize("Paris")[0], fake.tokenize(" France")[0]
    r = http.post(url + "/tokenize", headers=AUTH, json={"content": ["Paris is", france, paris]})
    assert r.json()["tokens"] == [*fake.tokenize("Paris is"), france, paris]


def test_a_token_the_model_does_not_have_is_a_400_in_llama_servers_shape(url: str) -> None:
    r = http.post(url + "/detokenize", headers=AUTH, json={"tokens": [1, 99999]})
    message = llama_error(r, 400, "invalid_request_error")
    assert (
        message
        == "'tokens' holds 99999, which is not a token of this model (its vocabulary has 16384)"
    )
    check("/detokenize", "post", r)
    r = http.post(url + "/tokenize", headers=AUTH, json={"content": "hi", "pieces": True})
    assert "'pieces'" in llama_error(r, 400, "invalid_request_error")
    r = http.post(url + "/tokenize", headers=AUTH, json={"content": "hi", "model": "nope"})
    assert "model 'nope' not found" in llama_error(r, 404, "not_found_error")


# -- /apply-template -------------------------------------------------------------------------


def test_apply_template_is_the_prompt_a_chat_is_sent_as(url: str, fake: FakeModel) -> None:
    r = http.post(url + "/apply-template", headers=AUTH, json={"messages": MSG})
    assert check("/apply-template", "post", r) == {"prompt": CHATML}
    http.post(url + "/v1/chat/completions", headers=AUTH, json={"messages": MSG, "max_tokens": 2})
    assert fake.seen[-1].prompt == CHATML
    r = http.post(url + "/apply-template", headers=AUTH, json={"messages": []})
    assert "'messages'" in llama_error(r, 400, "invalid_request_error")


# -- /props ----------------------------------------------------------------------------------


def test_props_has_what_the_web_ui_reads(url: str, fake: FakeModel) -> None:
    r = http.get(url + "/props", headers=AUTH, params={"autoload": "false"})
    props = check("/props", "get", r)
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 512 and props["total_slots"] == 2
    params = settings["params"]
    # A chat request that sets nothing: the API's defaults (no repeat penalty, as llama-server).
    assert (params["temperature"], params["top_k"], params["top_p"], params["min_p"]) == (
        0.8,
        40,
        0.95,
        0.05,
    )
    assert (params["repeat_penalty"], params["max_tokens"], params["seed"]) == (1.0, 512, -1)
    assert props["modalities"] == {"vision": False, "audio": False, "video": False}
    assert props["model_path"] == str(fake.path) and props["model_alias"] == "fake"
    assert props["chat_template"] == fake.template.source
    assert props["build_info"].startswith("candlewick ") and props["is_sleeping"] is False
    assert "role" not in props  # one model's server: the UI's MODEL mode
    # The UI asks per model too, without loading one (autoload=false).
    r = http.get(url + "/props", headers=AUTH, params={"model": "fake", "autoload": "false"})
    assert r.json() == props


def test_props_refusals(url: str) -> None:
    r = http.get(url + "/props", headers=AUTH, params={"model": "nope"})
    assert "model 'nope' not found" in llama_error(r, 404, "not_found_error")
    check("/props", "get", r)
    r = http.get(url + "/props", headers=AUTH, params={"autoload": "maybe"})
    assert llama_error(r, 400, "invalid_request_error") == "'autoload' must be true or false"
    r = http.get(url + "/props", headers=AUTH, params={"slot": "1"})
    assert "'slot' is not a parameter" in llama_error(r, 400, "invalid_request_error")
    # The properties are set when the server starts: POST /props is not a route here.
    r = http.post(url + "/props", headers=AUTH, json={"n_ctx": 1})
    assert llama_error(r, 405, "invalid_request_error") == "method not allowed"
    assert set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}
    r = http.get(url + "/props")
    assert llama_error(r, 401, "authentication_error") == "missing or invalid API key"


# -- a route the server does not have ----------------------------------------------------------


def test_a_route_the_server_lacks_is_llama_servers_404(url: str) -> None:
    """The web UI shows the message and stops; a 404 in another shape it reads alike. What
    made it ask for /props without end was that /props failed at all: its effects ask
    again whenever an earlier ask ends, whatever the error (docs/server.md)."""
    r = http.post(url + "/v1/chat/completions/control", headers=AUTH, json={})
    message = llama_error(r, 404, "not_found_error")
    assert message == "no such route: POST /v1/chat/completions/control"
    r = http.post(url + "/v1/streams/lookup", headers=AUTH, json={})
    assert llama_error(r, 404, "not_found_error") == "no such route: POST /v1/streams/lookup"
    # llama-server's features this server lacks get its 403 "disabled", which the UI keeps
    # for the life of the server: it asks for /tools again only if the answer is another.
    for method, path in (("GET", "/tools"), ("POST", "/tools"), ("GET", "/cors-proxy")):
        r = httpx.request(method, url + path, headers=AUTH, timeout=120)
        assert llama_error(r, 403, "feature_disabled").startswith("this feature is disabled: ")
    # The Ollama and Anthropic paths keep their dialect's shape.
    assert http.get(url + "/api/nope", headers=AUTH).json() == {
        "error": "no such route: GET /api/nope"
    }


# -- the chat, as the web UI sends it ------------------------------------------------------------


def test_the_web_uis_first_requests_and_a_message(url: str, fake: FakeModel) -> None:
    """What the UI asks on opening (tools/ui: serverStore, modelsStore, the active model's
    props) and when a message is sent: every answer a 200 it can read."""
    props = http.get(url + "/props", headers=AUTH, params={"autoload": "false"}).json()
    models = http.get(url + "/v1/models", headers=AUTH).json()["data"]
    model_id = models[0]["id"]
    again = http.get(url + "/props", headers=AUTH, params={"model": model_id, "autoload": "false"})
    assert again.status_code == 200 and again.json() == props
    fake.script(REPLY)
    r = http.post(url + "/v1/chat/completions", headers=AUTH, json=UI_CHAT)
    assert r.status_code == 200, r.text
    chunks = sse(r.text)
    for c in chunks:
        check_event("/v1/chat/completions", c)
    # The prompt's progress: when the request got its slot, and read whole with the first token.
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    # The prompt with the UI's tools: what /apply-template says it is.
    asked = {"messages": MSG, "tools": UI_CHAT["tools"]}
    prompt = http.post(url + "/apply-template", headers=AUTH, json=asked).json()["prompt"]
    assert fake.seen[-1].prompt == prompt and "get_datetime" in prompt
    total = len(fake.tokenize(prompt))
    assert [p["total"] for p in progress] == [total, total]
    assert progress[0]["processed"] == progress[0]["cache"] and progress[1]["processed"] == total
    assert progress[1]["time_ms"] >= 0
    # Every piece of the answer carries the timings so far (timings_per_token).
    said = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert "".join(c["choices"][0]["delta"]["content"] for c in said) == REPLY
    assert all(set(c["timings"]) == TIMINGS for c in said)
    counts = [c["timings"]["predicted_n"] for c in said]
    assert counts == sorted(counts) and counts[-1] <= 6
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "stop"
    t = last["timings"]
    assert t["predicted_n"] == 6 and t["cache_n"] + t["prompt_n"] == total
    assert t["prompt_per_second"] == pytest.approx(1000 * t["prompt_n"] / t["prompt_ms"])


def test_timings_on_the_answer_and_the_last_chunk(url: str, fake: FakeModel) -> None:
    fake.script(REPLY, REPLY)
    body = {"messages": MSG, "max_tokens": 24}
    answer = check(
        "/v1/chat/completions",
        "post",
        http.post(url + "/v1/chat/completions", headers=AUTH, json=body),
    )
    t = answer["timings"]
    assert set(t) == TIMINGS and t["predicted_n"] == answer["usage"]["completion_tokens"]
    assert t["cache_n"] + t["prompt_n"] == answer["usage"]["prompt_tokens"]
    if t["predicted_ms"] > 0:
        assert t["predicted_per_second"] == pytest.approx(1000 * 6 / t["predicted_ms"])
        assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / 6)
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse(http.post(url + "/v1/chat/completions", headers=AUTH, json=stream).text)
    # Without timings_per_token, only the last chunk (here the usage's) has them.
    assert [i for i, c in enumerate(chunks) if "timings" in c] == [len(chunks) - 1]
    assert chunks[-1]["timings"]["predicted_n"] == chunks[-1]["usage"]["completion_tokens"] == 6
    assert not any("prompt_progress" in c for c in chunks)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timings_per_token", "yes"),
        ("return_progress", 1),
        ("sse_ping_interval", -2),
        ("sse_ping_interval", 1.5),
        ("backend_sampling", True),
    ],
)
def test_a_bad_llama_server_field_is_a_400_naming_it(url: str, field: str, value: Any) -> None:
    r = http.post(url + "/v1/chat/completions", headers=AUTH, json={"messages": MSG, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field


# -- pings ---------------------------------------------------------------------------------------


class _Held:
    """A generation whose events come when the test lets them."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.closed = False

    async def events(self) -> AsyncIterator[Event]:
        try:
            await self.release.wait()
            yield Piece(1, "Hi", 1)
        finally:
            self.closed = True


def test_a_silent_stream_pings_and_loses_no_event() -> None:
    async def main() -> tuple[list[Event | None], bool]:
        held = _Held()
        # A tenth of a second (the field takes whole seconds; built unvalidated to wait less).
        fields = LlamaChatFields.model_construct(sse_ping_interval=0.1)
        extras = LlamaStream(fields, cast(AsyncGeneration, held))
        got: list[Event | None] = []
        async for ev in extras.events():
            got.append(ev)
            if ev is None and got.count(None) == 2:
                held.release.set()  # two pings while it waited; now the event
        return got, held.closed

    got, closed = asyncio.run(main())
    assert got == [None, None, Piece(1, "Hi", 1)] and closed


def test_timings_are_llama_servers_formulas() -> None:
    st = GenerationStats(
        prompt_tokens=30,
        cached_tokens=10,
        n_prompt_eval=20,
        prompt_eval_ms=40.0,
        gen_tokens=9,
        eval_ms=90.0,
        draft_tokens=4,
        draft_accepted=3,
    )
    t = Timings.of(st).wire()
    assert t == {
        "cache_n": 10,
        "prompt_n": 20,
        "prompt_ms": 40.0,
        "prompt_per_token_ms": 2.0,
        "prompt_per_second": 500.0,
        "predicted_n": 9,
        "predicted_ms": 90.0,
        "predicted_per_token_ms": 10.0,
        "predicted_per_second": 100.0,
        "draft_n": 4,
        "draft_n_accepted": 3,
    }
    # Nothing measured yet: rates of 0, never a division by zero.
    assert Timings.of(GenerationStats()).wire()["predicted_per_second"] == 0.0


# -- the web UI at the server's origin (serve --webui) --------------------------------------------


def test_a_built_web_ui_is_served_at_the_servers_origin(
    module_fake: FakeModel, tmp_path: Path
) -> None:
    """Its files need no key, as llama-server serves its UI; the API behind them does."""
    ui = tmp_path / "ui"
    (ui / "_app").mkdir(parents=True)
    (ui / "index.html").write_text("<!doctype html><title>llama.cpp</title>")
    (ui / "_app" / "bundle.js").write_text("console.log('ui')")
    with serve_fake(module_fake, make_config(model_id="fake", webui_dir=str(ui))) as srv:
        page = http.get(srv.url + "/")
        assert page.status_code == 200 and "<title>llama.cpp</title>" in page.text
        assert page.headers["content-type"].startswith("text/html")
        assert http.get(srv.url + "/_app/bundle.js").text == "console.log('ui')"
        assert http.get(srv.url + "/props").status_code == 401  # the API keeps its key
        assert http.get(srv.url + "/props", headers=AUTH).status_code == 200
        r = http.get(srv.url + "/nothing-here.js", headers=AUTH)
        assert llama_error(r, 404, "not_found_error") == "no such route: GET /nothing-here.js"
        r = http.post(srv.url + "/v1/streams/lookup", headers=AUTH, json={})
        assert llama_error(r, 404, "not_found_error") == "no such route: POST /v1/streams/lookup"
        assert http.get(srv.url + "/nothing-here.js").status_code == 401  # not a file of it


def test_a_web_ui_folder_without_its_page_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match=r"no index\.html there"):
        make_config(webui_dir=str(tmp_path)).validate()
