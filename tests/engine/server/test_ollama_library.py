"""Ollama's model management through the official `ollama` client: /api/pull from the local
Hub emulator (progress lines, verified), /api/tags, /api/copy, /api/create, /api/show,
/api/delete, and Ollama's error shape; one test chats with a created model on SmolLM2."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import ollama
import openai
import pytest

from app.services.discovery import DiscoveryRoots
from app.services.download_manager import DownloadManager
from app.services.hub import HubClient
from app.services.library import ModelLibrary
from app.services.model_catalog import library_catalog
from app.services.server_models import LibraryModelStore
from engine.host.host import ModelHost
from engine.server import ServerState, ServerThread
from engine.settings import LoadParams
from tests.engine.server.conftest import API_KEY, make_config, open_document
from tests.fake_server_engine import fake_model, serve_fake
from tests.hub_emulator import HubEmulator, file_sha256, running_hub, tiny_gguf

TINY = "owner/Tiny-GGUF"
SMOL = "bartowski/SmolLM2-135M-Instruct-GGUF"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", name="tiny")


@pytest.fixture
def hub(tiny: Path) -> Iterator[HubEmulator]:
    with running_hub() as emu:
        emu.repo(TINY).add("Tiny-Q4_K_M.gguf", source=tiny)
        yield emu


class Served:
    def __init__(self, url: str, library: ModelLibrary, host: ModelHost) -> None:
        self.url, self.library, self.host = url, library, host
        self.client = ollama.Client(host=url, headers=AUTH, timeout=300)


def _serve(tmp_path: Path, hub: HubEmulator) -> Iterator[Served]:
    library = ModelLibrary(tmp_path / "models", bundled=False, discovery=DiscoveryRoots())
    downloads = DownloadManager(
        library.downloads_state, HubClient(hub.url), cache_dir=tmp_path / "hf"
    )
    params = LoadParams(n_ctx=2048, n_seq_max=2, n_threads=2)
    host = ModelHost(library_catalog(library, lambda e: params))
    state = ServerState(
        make_config(model_id="none"), host=host, store=LibraryModelStore(library, downloads)
    )
    try:
        with ServerThread(state) as srv:
            served = Served(srv.url, library, host)
            with served.client:
                yield served
    finally:
        state.close()
        host.close()
        downloads.close()


@pytest.fixture
def served(tmp_path: Path, hub: HubEmulator) -> Iterator[Served]:
    yield from _serve(tmp_path, hub)


def test_pull_list_copy_create_show_delete(served: Served, tiny: Path) -> None:
    c = served.client
    lines = list(c.pull(f"hf.co/{TINY}", stream=True))
    statuses = [p.status for p in lines]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    digest = f"sha256:{file_sha256(tiny)}"
    layer = [p for p in lines if p.digest == digest]
    assert layer and layer[-1].status == f"pulling {digest[7:19]}"
    assert layer[-1].completed == layer[-1].total == tiny.stat().st_size
    names = {m.model for m in c.list().models}
    assert f"hf.co/{TINY}:latest" in names
    # Pulled again: already there, nothing downloaded; stream=false answers once.
    assert c.pull(f"hf.co/{TINY}:Q4_K_M").status == "success"
    # Each line is the documented status object.
    for line in _lines(served, "/api/pull", {"model": f"hf.co/{TINY}"}):
        _documented("/api/pull", line)

    assert c.copy(f"hf.co/{TINY}", "tiny-copy").status == "success"
    made = list(
        c.create(
            model="pirate",
            from_="tiny-copy",
            system="You are a pirate.",
            parameters={"temperature": 0.3, "stop": ["Arr"]},
            stream=True,
        )
    )
    assert [p.status for p in made] == [
        "reading model metadata",
        "creating system layer",
        "creating parameters layer",
        "writing manifest",
        "success",
    ]
    listed = {m.model: m for m in c.list().models}
    assert {"tiny-copy:latest", "pirate:latest"} <= set(listed)
    assert listed["pirate:latest"].size == tiny.stat().st_size  # the same file, no copy
    shown = c.show("pirate")
    assert shown.modelfile is not None and 'SYSTEM """You are a pirate."""' in shown.modelfile
    assert shown.parameters == 'temperature 0.3\nstop "Arr"'
    answer = httpx.post(served.url + "/api/show", headers=AUTH, json={"model": "pirate"})
    assert answer.json()["system"] == "You are a pirate."
    # Over a created model: its parameters kept, its system prompt replaced.
    body = {"model": "parrot", "from": "pirate", "system": "Squawk."}
    for line in _lines(served, "/api/create", body):
        _documented("/api/create", line)
    parrot = c.show("parrot")
    assert parrot.modelfile is not None and 'SYSTEM """Squawk."""' in parrot.modelfile
    assert parrot.parameters == shown.parameters

    # The OpenAI client lists every name too; a created model's text completion is refused
    # (its recipe is a chat's), not answered plainly.
    with openai.OpenAI(base_url=served.url + "/v1", api_key=API_KEY, max_retries=0) as oai:
        ids = {m.id for m in oai.models.list()}
        assert {f"hf.co/{TINY}:latest", "tiny-copy:latest", "pirate:latest", "parrot:latest"} <= ids
        assert oai.models.retrieve("pirate:latest").id == "pirate:latest"
        with pytest.raises(openai.BadRequestError, match="/api/chat"):
            oai.completions.create(model="pirate", prompt="hi", max_tokens=2)

    files = sorted(p for p in (served.library.models_dir.parent / "hf").rglob("*") if p.is_file())
    with pytest.raises(ollama.ResponseError) as e:  # the base of 'tiny-copy' and 'pirate'
        c.delete(served.library.entries()[0].id)
    assert e.value.status_code == 400
    for name in ("parrot", "pirate", "tiny-copy", f"hf.co/{TINY}:Q4_K_M"):
        assert c.delete(name).status == "success"
    assert sorted(p for p in files if p.exists()) == files  # names only so far
    assert c.delete(f"hf.co/{TINY}:latest").status == "success"  # its last name: the file
    assert [p for p in files if p.exists()] == []
    assert served.library.entries() == []
    with pytest.raises(ollama.ResponseError) as e:
        c.delete("pirate")
    assert e.value.status_code == 404


def _lines(served: Served, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", served.url + path, headers=AUTH, json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        return [json.loads(x) for x in r.iter_lines() if x]


def _documented(path: str, line: dict[str, Any]) -> None:
    doc = open_document()
    answer = doc["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]
    schema = {**answer["schema"], "components": doc["components"]}
    jsonschema.Draft202012Validator(schema).validate(line)


def test_refusals_in_ollamas_shape(served: Served) -> None:
    c = served.client
    with pytest.raises(ollama.ResponseError) as e:
        list(c.pull("hf.co/nobody/Missing-GGUF:Q4_K_M", stream=True))
    assert e.value.status_code == 404 and "not found" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        c.pull("llama3")
    assert e.value.status_code == 400 and "hf.co/owner/repo:QUANT" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        c.copy("missing", "other")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        c.create(model="x", from_="missing")
    assert e.value.status_code == 404
    for body, param in (
        ({"model": "x", "from": "y", "quantize": "q4_K_M"}, "quantize"),
        ({"model": "x", "from": "y", "files": {"a.gguf": "sha256:00"}}, "files"),
        ({"model": "x", "from": "y", "adapters": {"a": "sha256:00"}}, "adapters"),
        ({"model": "x", "from": "y", "template": "{{ .Prompt }}"}, "template"),
        ({"model": "x", "from": "y", "parameters": {"num_ctx": 8192}}, "parameters.num_ctx"),
        ({"model": "x"}, "from"),
    ):
        r = httpx.post(served.url + "/api/create", headers=AUTH, json=body)
        assert r.status_code == 400 and f"'{param}'" in r.json()["error"], (body, r.text)


def test_a_server_without_a_library_says_so(tmp_path: Path) -> None:
    with fake_model(tmp_path) as model, serve_fake(model, make_config(model_id="fake")) as srv:
        for method, path, body in (
            ("POST", "/api/pull", {"model": "hf.co/a/b"}),
            ("DELETE", "/api/delete", {"model": "fake"}),
            ("POST", "/api/copy", {"source": "fake", "destination": "b"}),
            ("POST", "/api/create", {"model": "b", "from": "fake"}),
        ):
            r = httpx.request(method, srv.url + path, headers=AUTH, json=body)
            assert r.status_code == 501 and "does not manage models" in r.json()["error"]


def _chat(c: ollama.Client, model: str, messages: list[dict[str, Any]]) -> Any:
    return c.chat(
        model=model, messages=messages, options={"temperature": 0, "seed": 1, "num_predict": 8}
    )


def test_a_created_model_answers_with_its_system_prompt(tmp_path: Path, smollm2_path: Path) -> None:
    with running_hub() as hub:
        hub.repo(SMOL).add("SmolLM2-135M-Instruct-Q4_K_M.gguf", source=smollm2_path)
        for served in _serve(tmp_path, hub):
            c = served.client
            assert list(c.pull(f"hf.co/{SMOL}", stream=True))[-1].status == "success"
            system = "You are a pirate. Answer in one short sentence."
            c.create(model="pirate", from_=f"hf.co/{SMOL}", system=system)
            ask = [{"role": "user", "content": "Where is the treasure?"}]
            made = _chat(c, "pirate", ask)
            plain = _chat(c, f"hf.co/{SMOL}:latest", [{"role": "system", "content": system}, *ask])
            bare = _chat(c, f"hf.co/{SMOL}", ask)
            # The created model's prompt is the base's with its system prompt: the same
            # tokens, the same greedy answer; without it, another prompt.
            assert made.model == "pirate"
            assert made.prompt_eval_count == plain.prompt_eval_count != bare.prompt_eval_count
            assert made.message.content == plain.message.content
            # The OpenAI routes apply it too: the same prompt, the same greedy answer.
            with openai.OpenAI(base_url=served.url + "/v1", api_key=API_KEY) as oai:
                assert "pirate:latest" in {m.id for m in oai.models.list()}
                # (Ollama's repeat penalty, which the OpenAI routes do not apply by default)
                greedy: dict[str, Any] = {"temperature": 0, "seed": 1, "max_tokens": 8}
                greedy["extra_body"] = {"repeat_penalty": 1.1}
                via = oai.chat.completions.create(model="pirate", messages=ask, **greedy)  # type: ignore[arg-type]
                assert via.model == "pirate" and via.usage is not None
                assert via.usage.prompt_tokens == made.prompt_eval_count
                assert via.choices[0].message.content == made.message.content
            assert len(served.host.names()) == 1  # one file, loaded once for every name
            path = served.library.entries()[0].path
            c.delete("pirate")  # a name: the model stays loaded
            assert len(served.host.names()) == 1
            c.delete(f"hf.co/{SMOL}")  # its file's last name: unloaded, as Ollama does
            assert served.host.names() == [] and not path.exists()


@pytest.mark.model  # the child process loads the bundled model
def test_candlewick_serve_pulls_and_names(
    tmp_path: Path, hub: HubEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`candlewick serve` as users run it: its library (the process's own folders) takes a
    pull from the Hub emulator, a copy, and deletes, through the ollama client."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", "0", "--parallel", "1"]
    with subprocess.Popen([*cmd, "--ctx", "256"], stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()  # printed once the model is loaded
            m = re.search(r"on (http://127\.0\.0\.1:\d+) ", line)
            assert m, line
            with ollama.Client(host=m.group(1), timeout=300) as c:
                assert list(c.pull(f"hf.co/{TINY}", stream=True))[-1].status == "success"
                c.copy(f"hf.co/{TINY}", "tiny")
                names = {x.model for x in c.list().models}
                assert {f"hf.co/{TINY}:latest", "tiny:latest", "default"} <= names
                c.delete("tiny")
                c.delete(f"hf.co/{TINY}")
                assert not {f"hf.co/{TINY}:latest", "tiny:latest"} & {
                    x.model for x in c.list().models
                }
        finally:
            proc.send_signal(signal.SIGINT)
            rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest
