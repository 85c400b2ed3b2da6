"""llama-server's utility routes over the real SmolLM2: /tokenize and /detokenize give the
model's own tokenizer, /apply-template the prompt a chat request is sent as, /props the
loaded context, and a chat as llama-server's web UI sends it carries timings that add up to
its usage. Their shapes over a fake model are in test_llama_routes.py."""

from __future__ import annotations

import json
from typing import Any

from engine.server import ServedModel
from tests.engine.server.conftest import http
from tests.engine.server.test_answers_documented import check, check_event

TEXT = "<|im_start|>user\nHéllo wörld, 東京 🙂<|im_end|>\n"
M = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a colour."},
]


def test_tokenize_is_the_models_tokenizer_and_detokenize_its_inverse(
    base_url: str, auth: dict[str, str], served: ServedModel
) -> None:
    model = served.model
    r = http.post(base_url + "/tokenize", headers=auth, json={"content": TEXT})
    tokens = check("/tokenize", "post", r)["tokens"]
    assert tokens == model.tokenize(TEXT, add_special=False, parse_special=True)
    assert tokens[0] == model.special_token("<|im_start|>")  # special text read as its token
    r = http.post(
        base_url + "/tokenize", headers=auth, json={"content": TEXT, "parse_special": False}
    )
    assert r.json()["tokens"] == model.tokenize(TEXT, add_special=False, parse_special=False)
    r = http.post(base_url + "/tokenize", headers=auth, json={"content": TEXT, "add_special": True})
    assert r.json()["tokens"] == model.tokenize(TEXT, add_special=True, parse_special=True)
    r = http.post(base_url + "/detokenize", headers=auth, json={"tokens": tokens})
    assert check("/detokenize", "post", r) == {"content": TEXT}
    # Pieces: a token that holds part of a character comes as its bytes.
    r = http.post(base_url + "/tokenize", headers=auth, json={"content": TEXT, "with_pieces": True})
    pieces = check("/tokenize", "post", r)["tokens"]
    assert [p["id"] for p in pieces] == tokens
    raw = b"".join(
        bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces
    )
    assert raw.decode() == TEXT
    assert any(isinstance(p["piece"], list) for p in pieces)  # the emoji's bytes, split


def test_apply_template_is_what_a_chat_request_sends(
    base_url: str, auth: dict[str, str], served: ServedModel
) -> None:
    r = http.post(base_url + "/apply-template", headers=auth, json={"messages": M})
    prompt = check("/apply-template", "post", r)["prompt"]
    assert prompt == served.model.render_chat(M)
    assert prompt.endswith("<|im_start|>assistant\n")
    chat = http.post(
        base_url + "/v1/chat/completions",
        headers=auth,
        json={"messages": M, "max_tokens": 4, "temperature": 0},
    ).json()
    tokens = http.post(base_url + "/tokenize", headers=auth, json={"content": prompt}).json()
    assert chat["usage"]["prompt_tokens"] == len(tokens["tokens"])


def test_props_describe_the_loaded_model(
    base_url: str, auth: dict[str, str], served: ServedModel
) -> None:
    props = check("/props", "get", http.get(base_url + "/props", headers=auth))
    assert props["default_generation_settings"]["n_ctx"] == served.model.n_ctx_seq == 1024
    assert props["total_slots"] == served.scheduler.n_slots == 4
    assert props["chat_template"] == served.model.template.source
    assert "<|im_start|>" in props["chat_template"]
    assert props["model_path"] == str(served.model.path)


def test_a_chat_as_the_web_ui_sends_it_has_timings_that_add_up(
    base_url: str, auth: dict[str, str]
) -> None:
    body: dict[str, Any] = {
        "messages": M,
        "stream": True,
        "timings_per_token": True,
        "return_progress": True,
        "sse_ping_interval": 1,
        "reasoning_format": "auto",
        "reasoning_control": True,
        "max_tokens": 8,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    r = http.post(base_url + "/v1/chat/completions", headers=auth, json=body)
    assert r.status_code == 200, r.text
    data = [x[len("data: ") :] for x in r.text.split("\n\n") if x.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(x) for x in data[:-1]]
    for c in chunks:
        check_event("/v1/chat/completions", c)
    last = chunks[-1]
    usage, t = last["usage"], last["timings"]
    assert t["predicted_n"] == usage["completion_tokens"]
    assert t["prompt_n"] + t["cache_n"] == usage["prompt_tokens"]
    assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0
    assert t["predicted_per_second"] == 1000 * t["predicted_n"] / t["predicted_ms"]
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert progress[-1]["processed"] == progress[-1]["total"] == usage["prompt_tokens"]
