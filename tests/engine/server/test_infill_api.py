"""/infill and the /slots actions on the real engine: SmolLM2 with FIM markers in its metadata
(tests/fim_gguf.py, the `fim_smollm2_path` fixture), greedy.

The prompt is checked against llama-server's rules on the real vocabulary (each piece
tokenized here, as llama-server tokenizes it, and laid out by hand); the layout's rules on
every budget are test_infill_prompt.py's. The side-by-side with llama-server itself is in
docs/server.md."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.host.runtime import Model
from engine.server import ServedModel, ServerState, ServerThread
from engine.settings import LoadParams
from tests.engine.server.conftest import API_KEY, doc_valid, http, make_config
from tests.fim_gguf import FIM_TOKENS

AUTH = {"Authorization": f"Bearer {API_KEY}"}
# "pre" -> 11, "suf" -> 12, ... from tokenizer.ggml.fim_pre_token_id and the others
FIM = {key.split(".")[-1].split("_")[1]: tid for key, (tid, _) in FIM_TOKENS.items()}
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"
EXTRA = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]
BODY: dict[str, Any] = {
    "input_prefix": PREFIX,
    "input_suffix": SUFFIX,
    "input_extra": EXTRA,
    "prompt": "return",
    "n_predict": 8,
    "temperature": 0,
}
N_CTX = 1024


@pytest.fixture(scope="module")
def fim_served(fim_smollm2_path: Path) -> Iterator[ServedModel]:
    model = Model(fim_smollm2_path, LoadParams(n_ctx=2 * N_CTX, n_seq_max=2, n_threads=2))
    loaded = ServedModel.build(model, "smollm2-fim", max_queue=8, embeddings=False)
    yield loaded
    loaded.close()
    model.close()


@pytest.fixture(scope="module")
def fim_server(fim_served: ServedModel) -> Iterator[ServerThread]:
    state = ServerState(make_config(model_id="smollm2-fim"))
    state.set_loaded(fim_served)
    with ServerThread(state) as srv:
        yield srv


def _infill(srv: ServerThread, **over: Any) -> httpx.Response:
    return http.post(f"{srv.url}/infill", headers=AUTH, json={**BODY, **over})


def test_the_prompt_is_llama_servers_on_the_real_vocabulary(
    fim_served: ServedModel, fim_server: ServerThread
) -> None:
    model = fim_served.model

    def tok(text: str, special: bool = False) -> list[int]:
        return model.tokenize(text, add_special=False, parse_special=special)

    assert model.fim_tokens().missing() == []
    assert not model.special_tokens().add_bos  # SmolLM2 adds no BOS: none in the layout
    expected = [
        FIM["rep"],
        *tok("myproject\n"),
        FIM["sep"],
        *tok("util.py\n"),
        *tok(EXTRA[0]["text"]),
        FIM["sep"],
        *tok("filename\n"),
        FIM["pre"],
        *tok(PREFIX),
        *tok("return", True),
        FIM["suf"],
        *tok(SUFFIX),
        FIM["mid"],
    ]
    r = _infill(fim_server)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["tokens_evaluated"] == len(expected)
    text = b"".join(model.token_bytes(t, special=True) for t in expected).decode()
    assert got["prompt"] == text
    assert text.startswith("<reponame>myproject\n<file_sep>util.py\ndef sub")
    assert text.endswith("<jupyter_text>\n\nprint(add(1, 2))\n<jupyter_code>")


def test_infill_end_to_end_whole_and_streamed(
    fim_served: ServedModel, fim_server: ServerThread
) -> None:
    whole = _infill(fim_server)
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    assert doc_valid("InfillAnswer", answer)
    assert answer["stop"] is True and answer["model"] == "smollm2-fim"
    assert 0 < answer["tokens_predicted"] <= 8
    assert answer["stop_type"] == ("limit" if answer["tokens_predicted"] == 8 else "eos")
    assert answer["has_new_line"] == ("\n" in answer["content"])
    settings = answer["generation_settings"]
    assert (settings["n_predict"], settings["temperature"], settings["stream"]) == (8, 0, False)
    timings = answer["timings"]
    assert timings["predicted_n"] == answer["tokens_predicted"]
    assert timings["cache_n"] + timings["prompt_n"] == answer["tokens_evaluated"]
    assert answer["tokens_cached"] == answer["tokens_evaluated"] + answer["tokens_predicted"]

    events: list[dict[str, Any]] = []
    with httpx.stream(
        "POST", f"{fim_server.url}/infill", headers=AUTH, json={**BODY, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                assert line.startswith("data: ") and line != "data: [DONE]"
                events.append(json.loads(line[len("data: ") :]))
    *pieces, last = events
    assert pieces and all(doc_valid("InfillChunkEvent", e) and e["stop"] is False for e in pieces)
    assert doc_valid("InfillAnswer", last) and last["stop"] is True and last["content"] == ""
    # Greedy: the same middle, streamed or whole.
    assert "".join(e["content"] for e in pieces) == answer["content"]
    assert pieces[-1]["tokens_predicted"] == last["tokens_predicted"]
    assert last["tokens_predicted"] == answer["tokens_predicted"]


def test_a_model_without_fim_tokens_is_refused(base_url: str, auth: dict[str, str]) -> None:
    """The bundled SmolLM2: llama.cpp finds its `<reponame>` (FIM_REP), nothing else."""
    r = http.post(f"{base_url}/infill", headers=auth, json=BODY)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message == (
        "infill is not supported by model 'smollm2': prefix token is missing, "
        "suffix token is missing, middle token is missing"
    )


def test_a_slot_saved_then_restored_by_a_new_server_is_read_from_the_cache(
    fim_smollm2_path: Path, tmp_path: Path
) -> None:
    """Saved by one server, brought back by another that loaded the same file: the follow-up
    request reads its whole prompt from the restored cells but the last token (decoded
    again for its logits)."""
    prompt = {
        "prompt": "The lighthouse keeper climbed the stairs every evening to light the lamp, "
        "and every morning he wrote the weather in his book.",
        "max_tokens": 1,
        "temperature": 0,
    }
    params = LoadParams(n_ctx=N_CTX, n_seq_max=1, n_threads=2)
    config = make_config(model_id="fim", slot_save_path=tmp_path)

    def serve() -> tuple[Model, ServedModel, ServerState]:
        model = Model(fim_smollm2_path, params)
        loaded = ServedModel.build(model, "fim", max_queue=4, embeddings=False)
        state = ServerState(config)
        state.set_loaded(loaded)
        return model, loaded, state

    model, loaded, state = serve()
    try:
        with ServerThread(state) as srv:
            r = http.post(f"{srv.url}/v1/completions", headers=AUTH, json=prompt)
            assert r.status_code == 200, r.text
            n_prompt = r.json()["usage"]["prompt_tokens"]
            r = http.post(
                f"{srv.url}/slots/0?action=save", headers=AUTH, json={"filename": "keeper"}
            )
            assert r.status_code == 200, r.text
            saved = r.json()
            assert saved["n_saved"] == n_prompt  # the one token generated was not decoded
    finally:
        state.set_loaded(None)
        loaded.close()
        model.close()

    model, loaded, state = serve()
    try:
        with ServerThread(state) as srv:
            r = http.post(
                f"{srv.url}/slots/0?action=restore", headers=AUTH, json={"filename": "keeper"}
            )
            assert r.status_code == 200, r.text
            assert r.json()["n_restored"] == saved["n_saved"]
            assert r.json()["n_read"] == saved["n_written"]
            r = http.post(f"{srv.url}/v1/completions", headers=AUTH, json=prompt)
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            assert usage["prompt_tokens"] == n_prompt
            assert usage["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1
    finally:
        state.set_loaded(None)
        loaded.close()
        model.close()
