"""LoRA adapters over HTTP, as llama-server has them: GET/POST /lora-adapters and a request's
own `lora`, on SmolLM2 with the seeded random adapter of tests/lora_gguf.py (at scale 1 its
greedy answer changes; at 0 it is the base model's, tests/engine/test_lora.py)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from engine.host.runtime import Model
from engine.server import ServedModel, ServerState, ServerThread
from engine.server.config import ServerConfig
from engine.server.openapi import openapi_schema
from engine.settings import LoadParams
from tests.engine.server.conftest import API_KEY, assert_no_leak, http, make_config

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def lora_served(smollm2_path: Path, smollm2_lora_path: Path) -> Iterator[ServedModel]:
    params = LoadParams(
        n_ctx=2048, n_seq_max=2, n_threads=2, loras=((str(smollm2_lora_path), 1.0),)
    )
    model = Model(smollm2_path, params)
    loaded = ServedModel.build(model, "smollm2", max_queue=8)
    yield loaded
    loaded.close()
    model.close()


@pytest.fixture(scope="module")
def url(lora_served: ServedModel) -> Iterator[str]:
    state = ServerState(make_config())
    state.set_loaded(lora_served)
    with ServerThread(state) as srv:
        yield srv.url


def valid(name: str, body: Any) -> bool:
    doc = openapi_schema(ServerConfig(port=0))
    root = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(root).is_valid(body)


@contextlib.contextmanager
def restored_scales(loaded: ServedModel) -> Iterator[None]:
    """The fuzzer sets scales at random: the other tests start from the load's."""
    try:
        yield
    finally:
        loaded.model.lora_scales = (1.0,)


def set_scales(url: str, body: Any) -> Any:
    return http.post(url + "/lora-adapters", headers=AUTH, json=body)


def complete(url: str, **extra: Any) -> str:
    r = http.post(url + "/v1/completions", headers=AUTH, json={**PROMPT, **extra})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def test_list_and_set_scales(url: str, smollm2_lora_path: Path) -> None:
    r = http.get(url + "/lora-adapters", headers=AUTH)
    assert r.status_code == 200
    listed = r.json()
    assert listed == [
        {
            "id": 0,
            "path": str(smollm2_lora_path),
            "scale": 1.0,
            "task_name": "",
            "prompt_prefix": "",
        }
    ]
    assert valid("LoraAdapters", listed)
    try:
        r = set_scales(url, [{"id": 0, "scale": 0.5}])
        assert r.status_code == 200 and r.json() == {"success": True}
        assert valid("LoraApplied", r.json())
        assert http.get(url + "/lora-adapters", headers=AUTH).json()[0]["scale"] == 0.5
        # An empty list sets every adapter to 0, as llama-server's does.
        assert set_scales(url, []).status_code == 200
        assert http.get(url + "/lora-adapters", headers=AUTH).json()[0]["scale"] == 0.0
    finally:
        assert set_scales(url, [{"id": 0, "scale": 1.0}]).status_code == 200


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([{"id": 3, "scale": 1.0}], "'id': no adapter with id 3 (1 loaded, ids 0 to 0)"),
        ([{"id": 0, "scale": "high"}], "'[0].scale' must be a number"),
        ([{"id": 0}], "'[0].scale' is required"),
        ({"id": 0, "scale": 1.0}, "the request body must be a JSON array of {id, scale}"),
    ],
)
def test_a_bad_setting_is_a_400_naming_the_field(url: str, body: Any, message: str) -> None:
    r = set_scales(url, body)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == message  # llama-server's error shape
    assert http.get(url + "/lora-adapters", headers=AUTH).json()[0]["scale"] == 1.0


def test_a_request_sets_its_own_scales(url: str) -> None:
    assert set_scales(url, [{"id": 0, "scale": 1.0}]).status_code == 200
    adapted = complete(url)  # the server's scale, 1
    base = complete(url, lora=[{"id": 0, "scale": 0.0}])
    assert base != adapted
    assert complete(url, lora=[{"id": 0, "scale": 1.0}]) == adapted
    assert complete(url, lora=[]) == adapted  # empty: the server's
    chat = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8}
    answers = [
        http.post(
            url + "/v1/chat/completions",
            headers=AUTH,
            json={**chat, "temperature": 0, "lora": [{"id": 0, "scale": s}]},
        ).json()["choices"][0]["message"]["content"]
        for s in (0.0, 1.0)
    ]
    assert answers[0] != answers[1]
    r = http.post(
        url + "/v1/completions", headers=AUTH, json={**PROMPT, "lora": [{"id": 9, "scale": 1.0}]}
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("lora: no adapter with id 9")
    r = http.post(url + "/v1/completions", headers=AUTH, json={**PROMPT, "lora": {"id": 0}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora"


def test_concurrent_requests_with_other_scales_answer_as_alone(
    url: str, lora_served: ServedModel
) -> None:
    alone = {s: complete(url, lora=[{"id": 0, "scale": s}]) for s in (0.0, 1.0)}
    assert alone[0.0] != alone[1.0]
    out: dict[float, str] = {}
    gate = threading.Barrier(2)

    def run(scale: float) -> None:
        gate.wait()
        out[scale] = complete(url, lora=[{"id": 0, "scale": scale}], max_tokens=24)

    longer = {s: complete(url, lora=[{"id": 0, "scale": s}], max_tokens=24) for s in (0.0, 1.0)}
    threads = [threading.Thread(target=run, args=(s,)) for s in (0.0, 1.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert out == longer
    assert_no_leak(lora_served)


def test_schemathesis_finds_nothing_on_the_lora_routes(
    lora_served: ServedModel, tmp_path: Path
) -> None:
    state = ServerState(make_config(max_tokens_cap=2))
    state.set_loaded(lora_served)
    exe = Path(sys.executable).parent / "schemathesis"
    with ServerThread(state) as srv, restored_scales(lora_served):
        r = subprocess.run(
            [
                str(exe),
                "run",
                srv.url + "/openapi.json",
                "-H",
                f"Authorization: Bearer {API_KEY}",
                "--include-path",
                "/lora-adapters",
                "--checks",
                "all",
                # A well-formed id the model has not loaded is a correct 400.
                "--exclude-checks",
                "positive_data_acceptance",
                "--max-examples",
                "20",
                "--workers",
                "1",
                "--seed",
                "7",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
    assert r.returncode == 0, r.stdout[-3000:]
    assert "No issues found" in r.stdout, r.stdout[-3000:]
