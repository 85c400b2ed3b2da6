"""Several models behind one server, through the official openai and ollama clients: requests
name their model, one not loaded is loaded on demand (once, however many ask), it goes when
idle (keep_alive, ttl) unless pinned, the least recently used idle one makes room, and a load
that cannot fit or fails is refused with the reason. `/v1/models`, `/api/ps` and `/health`
say what is loaded at each step."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from engine.host.budget import MemoryBudget
from engine.host.host import Loadable, ModelHost, estimate_need, load_model
from engine.host.runtime import Model
from engine.server import ServerState, ServerThread
from engine.settings import LoadParams
from tests.engine.server.conftest import API_KEY, http, make_config
from tests.waiting import until

pytestmark = pytest.mark.slow
# No RAM prompt cache: the budgets below are sized from llama.cpp's buffers alone (the host
# reserves a cache's whole budget besides them: tests/engine/test_host_memory_figures.py).
PARAMS = LoadParams(n_ctx=1024, n_seq_max=2, n_threads=2, state_cache_mb=0)
AUTH = {"Authorization": f"Bearer {API_KEY}"}
HELLO = [{"role": "user", "content": "Say hello."}]
MiB = 1 << 20


class Slow:
    """The real loader, slowed so that requests pile up while it runs."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, spec: Loadable) -> Model:
        time.sleep(self.delay_s)
        return load_model(spec)


@pytest.fixture
def serve(
    smollm2_path: Path, gemma_path: Path, tmp_path: Path
) -> Iterator[Callable[..., ServerThread]]:
    started: list[tuple[ServerThread, ServerState, ModelHost]] = []
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(smollm2_path.read_bytes()[: 4 << 20])
    catalog = [
        Loadable("smollm2", smollm2_path, PARAMS, title="SmolLM2"),
        Loadable("gemma", gemma_path, PARAMS, aliases=("gemma3:270m",), title="Gemma 3 270M"),
        Loadable("broken", broken, PARAMS),
    ]

    def start(budget_mib: int | None = None, **kw: Any) -> ServerThread:
        budget = MemoryBudget({"CPU": budget_mib * MiB}) if budget_mib else None
        host = ModelHost(lambda: catalog, budget, **kw)
        state = ServerState(make_config(max_tokens_cap=16), host=host)
        srv = ServerThread(state).start()
        started.append((srv, state, host))
        return srv

    yield start
    for srv, state, host in started:
        srv.stop()
        state.close()
        host.close()


def ram_need(spec: Loadable) -> int:
    """What the host plans for loading `spec` (its estimate), in bytes of RAM."""
    return estimate_need(spec).devices["CPU"]


def oai(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)


def ps(srv: ServerThread) -> dict[str, dict[str, Any]]:
    r = http.get(srv.url + "/api/ps", headers=AUTH)
    assert r.status_code == 200
    return {m["name"]: m for m in r.json()["models"]}


def listed(srv: ServerThread) -> dict[str, bool]:
    r = http.get(srv.url + "/v1/models", headers=AUTH)
    return {m["id"]: m["loaded"] for m in r.json()["data"]}


def test_two_models_answer_interleaved_requests(serve: Callable[..., ServerThread]) -> None:
    srv = serve()
    assert listed(srv) == {"smollm2": False, "gemma": False, "broken": False}
    assert ps(srv) == {}
    answers: dict[str, list[str]] = {"smollm2": [], "gemma": []}
    errors: list[BaseException] = []

    def ask(model: str) -> None:
        try:
            with oai(srv) as c:
                for _ in range(2):
                    chunks = c.chat.completions.create(
                        model=model, messages=HELLO, max_tokens=8, temperature=0, stream=True
                    )
                    text, names = "", set()
                    for ch in chunks:
                        names.add(ch.model)
                        if ch.choices:
                            text += ch.choices[0].delta.content or ""
                    assert names == {model}
                    answers[model].append(text)
        except BaseException as e:  # collected: asserted below
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(m,)) for m in ("smollm2", "gemma")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert all(len(a) == 2 and all(a) for a in answers.values())
    assert listed(srv) == {"smollm2": True, "gemma": True, "broken": False}
    running = ps(srv)
    assert set(running) == {"smollm2", "gemma"}
    assert running["gemma"]["size"] > running["smollm2"]["size"] > 100 * MiB
    assert running["gemma"]["size_vram"] == 0 and running["gemma"]["requests_in_flight"] == 0
    # An alias and a file name reach the same model; Ollama's client too.
    with ollama.Client(host=srv.url, headers=AUTH) as oc:
        r = oc.chat(model="gemma3:270m", messages=HELLO, options={"num_predict": 4})
        assert r.model == "gemma" and r.message.content
        r2 = oc.generate(model="gemma-3-270m-q4_k_m.gguf", prompt="Hi", options={"num_predict": 2})
        assert r2.model == "gemma"
    assert set(ps(srv)) == {"smollm2", "gemma"}  # nothing loaded twice


def test_eight_simultaneous_requests_wait_for_one_load(
    serve: Callable[..., ServerThread], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="candlewick.host")
    srv = serve(loader=Slow(1.0))
    results: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def ask() -> None:
        try:
            with oai(srv) as c:
                r = c.chat.completions.create(model="gemma", messages=HELLO, max_tokens=4)
            with lock:
                results.append(r.model)
        except BaseException as e:  # collected: asserted below
            errors.append(e)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    # While it loads, /health says so and /api/ps does not list it yet.
    assert until(
        lambda: http.get(srv.url + "/health").json()["loading"] == ["gemma"], 20, poll=0.05
    )
    assert "gemma" not in ps(srv)
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert results == ["gemma"] * 8
    loads = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loading ")]
    assert loads == ["loading gemma from gemma-3-270m-q4_k_m.gguf"]
    health = http.get(srv.url + "/health").json()
    assert health["loading"] == [] and [m["name"] for m in health["models"]] == ["gemma"]
    assert "candlewick_model_loads_total 1" in http.get(srv.url + "/metrics", headers=AUTH).text


def test_keep_alive_ttl_and_pin(serve: Callable[..., ServerThread]) -> None:
    srv = serve()
    # Ollama's keep_alive: 0: unloaded once the answer is done.
    with ollama.Client(host=srv.url, headers=AUTH) as oc:
        r = oc.generate(model="smollm2", prompt="Hi", keep_alive=0, options={"num_predict": 2})
        assert r.response is not None
        assert until(lambda: "smollm2" not in ps(srv), 10, poll=0.05)
        # An empty prompt loads (and with keep_alive 0 unloads), as in Ollama.
        r = oc.generate(model="smollm2", prompt="", keep_alive="10m")
        assert r.done_reason == "load"
        left = ps(srv)["smollm2"]
        assert left["keep_alive_s"] == 600 and left["expires_at"] > "2026"
        r = oc.generate(model="smollm2", prompt="", keep_alive=0)
        assert r.done_reason == "unload"
        assert until(lambda: "smollm2" not in ps(srv), 10, poll=0.05)
    # LM Studio's ttl on an OpenAI request: gone a second after it went idle.
    with oai(srv) as c:
        c.chat.completions.create(
            model="smollm2", messages=HELLO, max_tokens=2, extra_body={"ttl": 1}
        )
        assert "smollm2" in ps(srv)
        assert until(lambda: "smollm2" not in ps(srv), 15, poll=0.05)
    # Pinned: stays past its keep-alive; unloading it by hand frees it.
    r = http.post(
        srv.url + "/v1/models/smollm2/load", headers=AUTH, json={"keep_alive": 0, "pinned": True}
    )
    assert r.status_code == 200 and r.json()["pinned"] and r.json()["loaded"]
    time.sleep(1.0)
    assert ps(srv)["smollm2"]["pinned"]
    r = http.post(srv.url + "/v1/models/smollm2/unload", headers=AUTH)
    assert r.status_code == 200 and r.json() == {"id": "smollm2", "loaded": False}
    assert ps(srv) == {}
    bad = http.post(
        srv.url + "/api/generate",
        headers=AUTH,
        json={"model": "smollm2", "prompt": "", "keep_alive": "soon"},
    )
    assert bad.status_code == 400 and "keep_alive" in bad.json()["error"]


def test_lru_eviction_and_503_when_nothing_can_go(
    serve: Callable[..., ServerThread], smollm2_path: Path, gemma_path: Path
) -> None:
    # Room for Gemma (~0.8-1 GiB at these settings: its AMX or repacked copies depend on the
    # CPU) or SmolLM2 (~0.2 GiB) with some to spare, not both: sized by the host's own estimate.
    gemma = ram_need(Loadable("gemma", gemma_path, PARAMS))
    smol = ram_need(Loadable("smollm2", smollm2_path, PARAMS))
    assert smol < gemma
    srv = serve(budget_mib=(gemma + smol // 2) // MiB)
    with oai(srv) as c:
        c.chat.completions.create(model="smollm2", messages=HELLO, max_tokens=2)
        assert set(ps(srv)) == {"smollm2"}
        c.chat.completions.create(model="gemma", messages=HELLO, max_tokens=2)
        assert set(ps(srv)) == {"gemma"}  # SmolLM2 was idle: it made room
        assert listed(srv) == {"smollm2": False, "gemma": True, "broken": False}

        # Gemma busy (a stream held open): SmolLM2 cannot load, and the reason is given.
        stream = c.chat.completions.create(
            model="gemma", messages=HELLO, max_tokens=16, stream=True
        )
        next(iter(stream))
        with pytest.raises(openai.InternalServerError) as e:
            c.chat.completions.create(model="smollm2", messages=HELLO, max_tokens=2)
        assert e.value.status_code == 503
        msg = e.value.body["message"]  # type: ignore[index]
        assert msg.startswith("loading SmolLM2 needs ") and "of RAM; " in msg
        assert msg.endswith("every loaded model is busy, pinned or held by a client")
        stream.close()
        assert until(lambda: ps(srv)["gemma"]["requests_in_flight"] == 0, 30, poll=0.05)
        assert set(ps(srv)) == {"gemma"}


def test_unknown_names_and_broken_files(serve: Callable[..., ServerThread]) -> None:
    srv = serve()
    with oai(srv) as c:
        with pytest.raises(openai.NotFoundError) as e:
            c.chat.completions.create(model="llama3", messages=HELLO, max_tokens=2)
        assert e.value.body["message"] == (  # type: ignore[index]
            "model 'llama3' not found; available: broken, gemma, smollm2"
        )
        with pytest.raises(openai.InternalServerError) as e2:
            c.chat.completions.create(model="broken", messages=HELLO, max_tokens=2)
        assert e2.value.status_code == 503
        assert "broken" in e2.value.body["message"]  # type: ignore[index]
        assert "\n" not in e2.value.body["message"]  # type: ignore[index]
        # The host goes on serving the others.
        assert (
            c.chat.completions.create(model="smollm2", messages=HELLO, max_tokens=2)
            .choices[0]
            .message.content
        )
    with ollama.Client(host=srv.url, headers=AUTH) as oc, pytest.raises(ollama.ResponseError) as e3:
        oc.chat(model="llama3", messages=HELLO)
    assert e3.value.status_code == 404
    assert http.get(srv.url + "/v1/models/llama3", headers=AUTH).status_code == 404
    assert http.get(srv.url + "/v1/models/gemma", headers=AUTH).json()["loaded"] is False
    # Clients show every model they list: details come from the file, nothing is loaded.
    with ollama.Client(host=srv.url, headers=AUTH) as oc:
        shown = oc.show("gemma3:270m")
        assert shown.details is not None and shown.details.family == "gemma3"
        names = {m.model for m in oc.list().models}
        assert names == {"smollm2", "gemma", "broken"}
        assert set(ps(srv)) == {"smollm2"}
        oc.generate(model="gemma", prompt="Hi", options={"num_predict": 1})
        loaded = oc.show("gemma")  # the same answer once it is loaded
        assert (loaded.template, loaded.details, loaded.modelinfo, loaded.capabilities) == (
            shown.template,
            shown.details,
            shown.modelinfo,
            shown.capabilities,
        )
