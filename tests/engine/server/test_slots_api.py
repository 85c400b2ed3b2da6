"""`POST /slots/{id}?action=save|restore|erase` through the real server and decode loop, over
the fake model (no llama.cpp: its KV "state" is the cells' positions and tokens): llama-server's
answers, the refusals in one line, and a state saved by one server brought back by another on
the same file so that a request reads its prompt from the cache. The same on the real model:
test_infill_api.py."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from engine.server import ServerConfig, ServerThread
from engine.server.openapi import openapi_schema
from tests.engine.server.conftest import API_KEY, doc_valid, http, make_config
from tests.fake_server_engine import FakeModel, fake_model, serve_fake

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "Once upon a time there was a lighthouse keeper who lived alone on a rock."


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    out = tmp_path / "slots"
    out.mkdir()
    return out


@pytest.fixture
def model(tmp_path: Path) -> Iterator[FakeModel]:
    with fake_model(tmp_path) as m:
        yield m


def _serve(model: FakeModel, folder: Path | None) -> Any:
    return serve_fake(model, make_config(model_id="fake", slot_save_path=folder))


def _act(srv: ServerThread, slot: object, action: str, **body: object) -> Any:
    return http.post(f"{srv.url}/slots/{slot}?action={action}", headers=AUTH, json=body or None)


def _complete(srv: ServerThread, prompt: str) -> dict[str, Any]:
    r = http.post(
        f"{srv.url}/v1/completions",
        headers=AUTH,
        json={"prompt": prompt, "max_tokens": 2, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


@contextlib.contextmanager
def _same_file(model: FakeModel) -> Iterator[FakeModel]:
    """Another fake model on `model`'s file (untouched: the same model to a slot file)."""
    again = FakeModel(model.path, n_slots=2, n_ctx_seq=512)
    try:
        yield again
    finally:
        again.close()


def _busy_slot(model: FakeModel) -> int:
    [slot] = [s["id"] for s in model.loop.snapshot().slots if s["cached_tokens"]]
    return int(slot)


def _saved_slot(model: FakeModel, srv: ServerThread, filename: str) -> tuple[int, list[int], Any]:
    """PROMPT answered, then its slot saved to `filename`: (the slot, its tokens, the answer
    to the save)."""
    _complete(srv, PROMPT)
    slot = _busy_slot(model)
    held = model.loop.slot_tokens()[slot]
    r = _act(srv, slot, "save", filename=filename)
    assert r.status_code == 200, r.text
    return slot, held, r.json()


@contextlib.contextmanager
def _request_held(
    model: FakeModel, srv: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[dict[str, Any]]]:
    """A completion of PROMPT in flight, the model's decodes held at a gate until the block
    ends (then its answer is in the list yielded)."""
    backend = model.backend
    assert backend is not None
    gate, decoding = threading.Event(), threading.Event()
    decode = backend.decode

    def held(*args: Any, **kw: Any) -> None:
        decoding.set()
        assert gate.wait(60)
        decode(*args, **kw)

    monkeypatch.setattr(backend, "decode", held)
    done: list[dict[str, Any]] = []
    asker = threading.Thread(target=lambda: done.append(_complete(srv, PROMPT)))
    asker.start()
    try:
        assert decoding.wait(60)
        yield done
    finally:
        gate.set()
        asker.join(60)


def test_saved_restored_elsewhere_and_read_from_the_cache(
    model: FakeModel, folder: Path, tmp_path: Path
) -> None:
    with _serve(model, folder) as srv:
        slot, held, saved = _saved_slot(model, srv, "story.bin")
        assert doc_valid("SlotActionAnswer", saved)
        assert saved["id_slot"] == slot and saved["filename"] == "story.bin"
        assert saved["n_saved"] == len(held) > 0
        assert saved["n_written"] == (folder / "story.bin").stat().st_size
        assert saved["timings"]["save_ms"] >= 0
    # Another server, another loop, on the same file.
    with _same_file(model) as again, _serve(again, folder) as srv:
        assert again.loop.slot_tokens() == [[], []]
        r = _act(srv, 1, "restore", filename="story.bin")
        assert r.status_code == 200, r.text
        restored = r.json()
        assert doc_valid("SlotActionAnswer", restored)
        assert restored["n_restored"] == len(held)
        assert restored["n_read"] == saved["n_written"]
        assert again.loop.slot_tokens()[1] == held
        assert again.loop.kv_positions()[1] == len(held)  # the cells are there
        usage = _complete(srv, PROMPT)["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
        assert usage["prompt_tokens"] - 1 > 0
        # Erased (the slot it went to took a copy of the restored one), the next request
        # reads the prompt again.
        for slot, tokens in enumerate(again.loop.slot_tokens()):
            r = _act(srv, slot, "erase")
            assert r.status_code == 200, r.text
            assert r.json() == {"id_slot": slot, "n_erased": len(tokens)}
        assert again.loop.slot_tokens() == [[], []] and again.loop.kv_positions() == [0, 0]
        usage = _complete(srv, PROMPT)["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_erase_says_how_many_tokens_it_dropped(model: FakeModel, folder: Path) -> None:
    with _serve(model, folder) as srv:
        _complete(srv, PROMPT)
        slot = _busy_slot(model)
        n = len(model.loop.slot_tokens()[slot])
        r = _act(srv, slot, "erase")
        assert r.status_code == 200 and r.json() == {"id_slot": slot, "n_erased": n}
        assert doc_valid("SlotActionAnswer", r.json())
        assert _act(srv, slot, "erase").json() == {"id_slot": slot, "n_erased": 0}


def test_without_a_slot_folder_every_action_is_refused(model: FakeModel) -> None:
    with _serve(model, None) as srv:
        for action in ("save", "restore", "erase"):
            r = _act(srv, 0, action, filename="a.bin")
            assert r.status_code == 501
            assert "--slot-save-path" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("slot", "action", "body", "says"),
    [
        ("x", "save", {"filename": "a.bin"}, "invalid slot id"),
        (7, "save", {"filename": "a.bin"}, "there is no slot 7"),
        (0, "dump", {"filename": "a.bin"}, "invalid action"),
        (0, "save", {"filename": "../a.bin"}, "invalid filename"),
        (0, "save", {}, "the request body is empty"),
        (0, "save", {"name": "a.bin"}, "'filename'"),
        (0, "restore", {"filename": "missing.bin"}, "there is no slot file missing.bin"),
    ],
)
def test_refusals_are_one_line(
    model: FakeModel, folder: Path, slot: object, action: str, body: dict[str, Any], says: str
) -> None:
    with _serve(model, folder) as srv:
        r = _act(srv, slot, action, **body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert says in message and "\n" not in message
    assert [p.name for p in folder.iterdir()] == []


def test_a_damaged_or_foreign_file_is_refused_and_the_slot_kept(
    model: FakeModel, folder: Path, tmp_path: Path
) -> None:
    with _serve(model, folder) as srv:
        slot, _, _ = _saved_slot(model, srv, "s.bin")
        data = (folder / "s.bin").read_bytes()
        (folder / "cut.bin").write_bytes(data[:-3])
        (folder / "text.bin").write_text("hello")
        held = model.loop.slot_tokens()
        for name, says in (("cut.bin", "truncated"), ("text.bin", "not a slot file")):
            r = _act(srv, slot, "restore", filename=name)
            assert r.status_code == 400 and says in r.json()["error"]["message"]
        assert model.loop.slot_tokens() == held  # nothing was read into the context
    other = tmp_path / "other"
    other.mkdir()
    with fake_model(other) as m2, _serve(m2, folder) as srv:  # another model file
        r = _act(srv, 0, "restore", filename="s.bin")
        assert r.status_code == 400
        assert "saved from another model file" in r.json()["error"]["message"]
    with (
        _same_file(model) as m3,
        serve_fake(
            m3, make_config(model_id="fake", slot_save_path=folder, max_body_bytes=1 << 16)
        ) as srv,
    ):
        m3.loop.resize(1, 256)  # the same file, slots of another size
        r = _act(srv, 0, "restore", filename="s.bin")
        assert r.status_code == 400
        assert "512 tokens per slot" in r.json()["error"]["message"]


def test_an_action_on_a_busy_slot_waits_for_its_request(
    model: FakeModel, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As llama-server defers it: the slot is saved once its request has ended."""
    with _serve(model, folder) as srv:
        saved: list[Any] = []
        with _request_held(model, srv, monkeypatch) as done:
            [busy] = [s["id"] for s in model.loop.snapshot().slots if s["busy"]]
            saver = threading.Thread(
                target=lambda: saved.append(_act(srv, busy, "save", filename="b.bin"))
            )
            saver.start()
            saver.join(0.5)
            assert saver.is_alive() and not (folder / "b.bin").exists()  # waiting, not refused
        saver.join(60)
        assert done and saved and saved[0].status_code == 200, saved
        assert saved[0].json()["n_saved"] == len(model.loop.slot_tokens()[busy]) > 0


def _slots(srv: ServerThread, query: str = "") -> Any:
    return http.get(f"{srv.url}/slots{query}", headers=AUTH)


def _documented(body: Any) -> None:
    """GET /slots's answer is what the OpenAPI document says (every object closed)."""
    doc = openapi_schema(ServerConfig(port=0))
    answer = doc["paths"]["/slots"]["get"]["responses"]["200"]["content"]["application/json"]
    closed = json.loads(
        json.dumps(doc["components"]).replace(
            '"properties":', '"additionalProperties": false, "properties":'
        )
    )
    jsonschema.Draft202012Validator({**answer["schema"], "components": closed}).validate(body)


def test_get_slots_in_llama_servers_shape(
    model: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _serve(model, None) as srv:
        idle = _slots(srv)
        assert idle.status_code == 200, idle.text
        _documented(idle.json())
        assert idle.json() == [
            {"id": i, "n_ctx": 512, "speculative": False, "is_processing": False} for i in range(2)
        ]
        with _request_held(model, srv, monkeypatch) as done:
            r = _slots(srv, "?fail_on_no_slot=1")  # one slot is still idle
            assert r.status_code == 200, r.text
            _documented(r.json())
            [busy] = [s for s in r.json() if s["is_processing"]]
            assert busy["params"]["n_predict"] == 2 and busy["params"]["temperature"] == 0
            assert busy["prompt"].endswith(PROMPT) and isinstance(busy["id_task"], int)
            read = busy["n_prompt_tokens_cache"] + busy["n_prompt_tokens_processed"]
            assert 0 <= read <= busy["n_prompt_tokens"] and busy["n_prompt_tokens"] > 0
            [nxt] = busy["next_token"]
            assert nxt["has_next_token"] and nxt["n_decoded"] + nxt["n_remain"] == 2
        assert done
        r = _slots(srv, "?id_slot=0")
        assert r.status_code == 400 and r.json()["error"]["code"] == 400
        assert "'id_slot'" in r.json()["error"]["message"]


def test_get_slots_fails_on_no_slot_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "one-slot.gguf"
    path.write_bytes(b"GGUF" + bytes(252))
    model = FakeModel(path, n_slots=1, n_ctx_seq=512)
    try:
        with _serve(model, None) as srv, _request_held(model, srv, monkeypatch):
            r = _slots(srv, "?fail_on_no_slot=1")
            assert r.status_code == 503 and "no slot available" in r.text
            assert _slots(srv).status_code == 200  # without it, the list
    finally:
        model.close()
