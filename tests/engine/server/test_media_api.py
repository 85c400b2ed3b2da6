"""Images and audio through every dialect of the server, with the official clients: SmolLM2
with the seeded test projectors (tests/projector_gguf.py). The answers mean nothing (the
projector's weights are noise); the parts, the markers, the decoding, the reuse of an image
already encoded and every refusal are real."""

from __future__ import annotations

import base64
import random
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import numpy as np
import ollama
import openai
import pytest

from engine.host.runtime import Model
from engine.server import ServedModel, ServerConfig, ServerState, ServerThread
from engine.settings import LoadParams
from tests.engine.server.conftest import API_KEY, assert_no_leak, http, make_config
from tests.media_files import jpeg, png, wav
from tests.projector_gguf import test_image, test_tone

AUTH = {"Authorization": f"Bearer {API_KEY}"}
ASK = "What is in this picture?"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{b64(data)}"


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header declares `width` x `height` and holds one empty row's data."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00"))
        + chunk(b"IEND", b"")
    )


PICTURE = png(test_image())
SMALL = png(test_image()[:8, :8])  # fits the text-only server's 64 KiB body limit


def serve(smollm2: Path, projector: Path, name: str) -> Iterator[tuple[ServerThread, ServedModel]]:
    model = Model(smollm2, LoadParams(n_ctx=4096, n_seq_max=2, n_threads=2, mmproj=str(projector)))
    loaded = ServedModel.build(model, name, max_queue=80)
    # The default body limit, as `candlewick serve` has it.
    state = ServerState(
        make_config(model_id=name, max_body_bytes=ServerConfig(port=0).max_body_bytes)
    )
    state.set_loaded(loaded)
    try:
        with ServerThread(state) as srv:
            yield srv, loaded
    finally:
        loaded.close()
        model.close()


@pytest.fixture(scope="module")
def vision(
    smollm2_path: Path, vision_projector_path: Path
) -> Iterator[tuple[ServerThread, ServedModel]]:
    yield from serve(smollm2_path, vision_projector_path, "smollm2-vision")


@pytest.fixture(scope="module")
def hearing(
    smollm2_path: Path, audio_projector_path: Path
) -> Iterator[tuple[ServerThread, ServedModel]]:
    yield from serve(smollm2_path, audio_projector_path, "smollm2-audio")


@pytest.fixture(scope="module")
def oai(vision: tuple[ServerThread, ServedModel]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=vision[0].url + "/v1", api_key=API_KEY, max_retries=0, timeout=300
    ) as c:
        yield c


def encodes(loaded: ServedModel) -> int:
    assert loaded.model.projector is not None
    return loaded.model.projector.encodes


def image_parts(data: bytes, **image_url: Any) -> list[dict[str, Any]]:
    return [
        {"type": "text", "text": ASK},
        {"type": "image_url", "image_url": {"url": data_url(data), **image_url}},
    ]


# -- answers, every dialect ------------------------------------------------------------------


def test_openai_image_is_answered_and_encoded_once(
    oai: openai.OpenAI, vision: tuple[ServerThread, ServedModel]
) -> None:
    _, loaded = vision
    # A picture no other test sends: in any order, the first request must encode it.
    messages: Any = [{"role": "user", "content": image_parts(png(test_image(seed=11)))}]
    before = encodes(loaded)
    t0 = time.perf_counter()
    first = oai.chat.completions.create(
        model="smollm2-vision", messages=messages, max_tokens=8, temperature=0
    )
    t1 = time.perf_counter()
    assert first.choices[0].message.content
    assert encodes(loaded) > before  # idefics3: a tile and an overview
    after_first = encodes(loaded)
    t2 = time.perf_counter()
    second = oai.chat.completions.create(
        model="smollm2-vision", messages=messages, max_tokens=8, temperature=0
    )
    t3 = time.perf_counter()
    print(f"first request {t1 - t0:.3f} s, the same image again {t3 - t2:.3f} s")
    assert second.choices[0].message.content == first.choices[0].message.content
    assert encodes(loaded) == after_first  # the slot's cache held the image
    assert first.usage is not None and second.usage is not None
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens == second.usage.prompt_tokens - 1
    assert_no_leak(loaded)


def test_openai_image_streamed(oai: openai.OpenAI) -> None:
    chunks = list(
        oai.chat.completions.create(
            model="smollm2-vision",
            messages=[{"role": "user", "content": image_parts(PICTURE, detail="low")}],
            max_tokens=8,
            temperature=0,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text


def test_a_few_megabytes_of_image_pass_the_body_limit(
    oai: openai.OpenAI, vision: tuple[ServerThread, ServedModel]
) -> None:
    big = png(np.random.default_rng(7).integers(0, 256, (1100, 1100, 3), dtype=np.uint8))
    assert len(data_url(big)) > 3_000_000
    r = oai.chat.completions.create(
        model="smollm2-vision",
        messages=[{"role": "user", "content": image_parts(big, detail="high")}],
        max_tokens=2,
        temperature=0,
    )
    assert r.choices[0].finish_reason in ("stop", "length")


def test_ollama_chat_and_generate_images(vision: tuple[ServerThread, ServedModel]) -> None:
    srv, loaded = vision
    with ollama.Client(host=srv.url, headers=AUTH) as c:
        msg = {"role": "user", "content": ASK, "images": [PICTURE]}
        opts = {"temperature": 0, "num_predict": 8}
        r = c.chat(model="smollm2-vision", messages=[msg], options=opts)
        assert r.message.content
        before = encodes(loaded)
        again = c.chat(model="smollm2-vision", messages=[msg], options=opts)
        assert again.message.content == r.message.content
        assert encodes(loaded) == before
        streamed = "".join(
            p.message.content or ""
            for p in c.chat(model="smollm2-vision", messages=[msg], options=opts, stream=True)
        )
        assert streamed == r.message.content
        g = c.generate(model="smollm2-vision", prompt=ASK, images=[PICTURE], options=opts)
        assert g.response
        gs = "".join(
            p.response
            for p in c.generate(
                model="smollm2-vision", prompt=ASK, images=[PICTURE], options=opts, stream=True
            )
        )
        assert gs == g.response
        # Images alone are a prompt: not Ollama's empty-prompt load.
        alone = c.generate(model="smollm2-vision", prompt="", images=[PICTURE], options=opts)
        assert alone.done_reason in ("stop", "length") and alone.eval_count
        shown = c.show("smollm2-vision")
        assert shown.capabilities is not None and "vision" in shown.capabilities
        assert "audio" not in shown.capabilities


def test_anthropic_image_block(vision: tuple[ServerThread, ServedModel]) -> None:
    srv, loaded = vision
    content: Any = [
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": b64(PICTURE)},
        },
        {"type": "text", "text": ASK},
    ]
    with anthropic.Anthropic(base_url=srv.url, api_key=API_KEY, max_retries=0) as c:
        args: Any = {
            "model": "smollm2-vision",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": content}],
            "extra_body": {"temperature": 0},
        }
        r = c.messages.create(**args)
        assert r.content and r.content[0].type == "text" and r.content[0].text
        before = encodes(loaded)
        again = c.messages.create(**args)
        assert encodes(loaded) == before
        assert again.usage.cache_read_input_tokens
        with c.messages.stream(**args) as s:
            streamed = "".join(s.text_stream)
        assert streamed == r.content[0].text
        counted = c.messages.count_tokens(
            model="smollm2-vision", messages=[{"role": "user", "content": content}]
        )
        assert counted.input_tokens == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)


def test_responses_input_image(
    oai: openai.OpenAI, vision: tuple[ServerThread, ServedModel]
) -> None:
    _, loaded = vision
    content: Any = [
        {"type": "input_text", "text": ASK},
        {"type": "input_image", "image_url": data_url(PICTURE), "detail": "auto"},
    ]
    args: Any = {
        "model": "smollm2-vision",
        "input": [{"role": "user", "content": content}],
        "max_output_tokens": 8,
        "temperature": 0,
    }
    r = oai.responses.create(**args)
    assert r.output_text
    before = encodes(loaded)
    again = oai.responses.create(**args)
    assert encodes(loaded) == before
    assert again.usage is not None and again.usage.input_tokens_details.cached_tokens > 0
    events = list(oai.responses.create(**args, stream=True))
    # Cut at max_output_tokens, as the answer above: the last event says "incomplete".
    done = [e for e in events if e.type in ("response.completed", "response.incomplete")]
    assert len(done) == 1 and done[0].response.output_text == r.output_text
    # The stored conversation keeps its image: a follow-up by id reads it again.
    follow = oai.responses.create(
        model="smollm2-vision",
        previous_response_id=r.id,
        input="And its colours?",
        max_output_tokens=4,
        temperature=0,
    )
    assert follow.status in ("completed", "incomplete")
    assert follow.usage is not None and follow.usage.input_tokens > r.usage.input_tokens  # type: ignore[union-attr]


def test_models_list_the_projectors_capabilities(
    oai: openai.OpenAI, vision: tuple[ServerThread, ServedModel], server: ServerThread
) -> None:
    cards = http.get(vision[0].url + "/v1/models", headers=AUTH).json()["data"]
    caps = next(c for c in cards if c["id"] == "smollm2-vision")["capabilities"]
    assert caps == ["completion", "vision", "tools", "embedding"]
    plain = http.get(server.url + "/v1/models", headers=AUTH).json()["data"]
    assert "vision" not in next(c for c in plain if c["id"] == "smollm2")["capabilities"]


def test_input_audio(hearing: tuple[ServerThread, ServedModel]) -> None:
    srv, loaded = hearing
    assert loaded.model.projector is not None
    clip = wav(test_tone(), 16000)
    content: Any = [
        {"type": "text", "text": "What do you hear?"},
        {"type": "input_audio", "input_audio": {"data": b64(clip), "format": "wav"}},
    ]
    with openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        args: Any = {
            "model": "smollm2-audio",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 8,
            "temperature": 0,
        }
        r = c.chat.completions.create(**args)
        assert r.choices[0].message.content
        before = encodes(loaded)
        chunks = list(c.chat.completions.create(**args, stream=True))
        text = "".join(x.choices[0].delta.content or "" for x in chunks if x.choices)
        assert text == r.choices[0].message.content
        assert encodes(loaded) == before
    mp3: Any = [{"type": "input_audio", "input_audio": {"data": b64(clip), "format": "mp3"}}]
    refused = http.post(
        srv.url + "/v1/chat/completions",
        headers=AUTH,
        json={"messages": [{"role": "user", "content": mp3}]},
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "'messages[0].content[0].input_audio.format' is 'mp3': only WAV audio is read here "
        "(send 16-bit PCM WAV)"
    )
    image = http.post(
        srv.url + "/v1/chat/completions",
        headers=AUTH,
        json={"messages": [{"role": "user", "content": image_parts(SMALL)}]},
    )
    assert image.json()["error"]["message"] == (
        "'messages[0].content[1]': smollm2-audio's projector reads audio, not images"
    )
    caps = http.get(srv.url + "/v1/models", headers=AUTH).json()["data"][0]["capabilities"]
    assert "audio" in caps and "vision" not in caps


# -- refusals ------------------------------------------------------------------------------


def _chat_error(url: str, content: Any) -> tuple[int, dict[str, Any]]:
    r = http.post(
        url + "/v1/chat/completions",
        headers=AUTH,
        json={"messages": [{"role": "user", "content": content}], "max_tokens": 1},
    )
    return r.status_code, r.json().get("error", {})


BAD_IMAGES = [
    pytest.param(
        image_parts(PICTURE[: len(PICTURE) // 2]),
        "'messages[0].content[1]' is truncated or corrupt (image file is truncated)",
        id="truncated-png",
    ),
    pytest.param(
        image_parts(b"this is not an image at all"),
        "'messages[0].content[1]' is not an image Candlewick can read "
        "(PNG, JPEG, WebP, GIF, BMP or TIFF)",
        id="not-an-image",
    ),
    pytest.param(
        [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@not base64@@"}}],
        "'messages[0].content[0].image_url.url' is not valid base64",
        id="invalid-base64",
    ),
    pytest.param(
        image_parts(png_header(30000, 30000)),
        "'messages[0].content[1]' declares more pixels than it can hold (a decompression bomb)",
        id="decompression-bomb",
    ),
    # Pillow neither writes nor opens a 0x0 image: a header declaring one is not an image.
    pytest.param(
        image_parts(png_header(0, 0)),
        "'messages[0].content[1]' is not an image Candlewick can read "
        "(PNG, JPEG, WebP, GIF, BMP or TIFF)",
        id="zero-pixels",
    ),
    pytest.param(
        [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
        "'messages[0].content[0].image_url.url' is an http(s) URL, which this server does not "
        "fetch: send the image inline as a data URL (data:image/png;base64,...)",
        id="http-url",
    ),
    pytest.param(
        [{"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}],
        "'messages[0].content[0].image_url.url' must be a base64 data URL of an image "
        "(data:image/png;base64,...)",
        id="not-an-image-data-url",
    ),
    pytest.param(
        [{"type": "image_url", "image_url": {"url": data_url(SMALL), "detail": "ultra"}}],
        "'messages[0].content[0].image_url.detail' must be one of 'auto', 'low' or 'high'",
        id="detail",
    ),
    pytest.param(
        [{"type": "file", "file": {"file_id": "f1"}}],
        "'messages[0].content' has a part of type 'file', which is not supported here; it "
        "takes text, image_url (a data URL) and input_audio (WAV) parts",
        id="file-part",
    ),
    pytest.param(
        [{"type": "input_audio", "input_audio": {"data": "aGk=", "format": "wav"}}],
        "'messages[0].content[0]': smollm2-vision's projector reads images, not audio",
        id="audio-to-vision",
    ),
]


@pytest.mark.parametrize(("content", "message"), BAD_IMAGES)
def test_bad_media_is_a_400_naming_its_part(
    vision: tuple[ServerThread, ServedModel], content: Any, message: str
) -> None:
    status, error = _chat_error(vision[0].url, content)
    assert (status, error.get("message"), error.get("param")) == (400, message, "messages")


def test_other_dialects_refuse_by_name(vision: tuple[ServerThread, ServedModel]) -> None:
    url = vision[0].url
    r = http.post(
        url + "/api/chat",
        headers=AUTH,
        json={"model": "smollm2-vision", "messages": [{"role": "user", "images": ["aGk="]}]},
    )
    assert (r.status_code, r.json()) == (
        400,
        {
            "error": "'messages[0].images[0]' is not an image Candlewick can read "
            "(PNG, JPEG, WebP, GIF, BMP or TIFF)"
        },
    )
    r = http.post(
        url + "/api/generate",
        headers=AUTH,
        json={"model": "smollm2-vision", "prompt": "x", "images": ["%%"]},
    )
    assert (r.status_code, r.json()) == (400, {"error": "'images[0]' is not valid base64"})
    source = {"type": "url", "url": "https://example.com/cat.png"}
    r = http.post(
        url + "/v1/messages",
        headers={"x-api-key": API_KEY},
        json={
            "model": "smollm2-vision",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}],
        },
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "'messages[0].content[0].source' is a URL, which this server does not fetch: send the "
        'image as a base64 source ({"type": "base64", "media_type": ..., "data": ...})'
    )
    part = {"type": "input_image", "file_id": "file-1", "detail": "auto"}
    r = http.post(
        url + "/v1/responses",
        headers=AUTH,
        json={"model": "smollm2-vision", "input": [{"role": "user", "content": [part]}]},
    )
    assert (r.status_code, r.json()["error"]["param"]) == (400, "input")
    assert r.json()["error"]["message"] == (
        "'input[0].content[0]' has a file_id, which is not supported: this server keeps no "
        "files; send the image as a data URL in image_url"
    )


def test_a_model_without_projector_refuses_media_by_name(server: ServerThread) -> None:
    """The session's SmolLM2 was loaded without a projector."""
    why = "smollm2 reads text only: it was loaded without a projector (mmproj)"
    status, error = _chat_error(server.url, image_parts(SMALL))
    assert (status, error["message"], error["param"]) == (
        400,
        f"'messages[0].content[1]': {why}",
        "messages",
    )
    r = http.post(
        server.url + "/api/chat",
        headers=AUTH,
        json={"model": "smollm2", "messages": [{"role": "user", "images": [b64(SMALL)]}]},
    )
    assert (r.status_code, r.json()) == (400, {"error": f"'messages[0].images[0]': {why}"})
    r = http.post(
        server.url + "/api/generate",
        headers=AUTH,
        json={"model": "smollm2", "prompt": "x", "images": [b64(SMALL)]},
    )
    assert (r.status_code, r.json()) == (400, {"error": f"'images[0]': {why}"})
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": b64(SMALL)},
    }
    r = http.post(
        server.url + "/v1/messages",
        headers={"x-api-key": API_KEY},
        json={
            "model": "smollm2",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": [block]}],
        },
    )
    assert (r.status_code, r.json()["error"]["message"]) == (
        400,
        f"'messages[0].content[0]': {why}",
    )
    part = {"type": "input_image", "image_url": data_url(SMALL)}
    r = http.post(
        server.url + "/v1/responses",
        headers=AUTH,
        json={"model": "smollm2", "input": [{"role": "user", "content": [part]}]},
    )
    assert (r.status_code, r.json()["error"]["message"], r.json()["error"]["param"]) == (
        400,
        f"'input[0].content[0]': {why}",
        "input",
    )


def mutated(seed: int, original: bytes) -> bytes:
    """`original` with a few seeded byte flips, cut short, or both."""
    rng = random.Random(seed)
    data = bytearray(original)
    kind = seed % 3
    if kind in (0, 2):
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    if kind in (1, 2):
        del data[rng.randrange(1, len(data)) :]
    return bytes(data)


def test_a_corpus_of_mutated_images_gets_no_5xx(vision: tuple[ServerThread, ServedModel]) -> None:
    srv, loaded = vision
    small = test_image()[:48, :48]
    corpus = [mutated(s, png(small)) for s in range(30)] + [
        mutated(100 + s, jpeg(small)) for s in range(30)
    ]
    counts: dict[int, int] = {}
    with httpx.Client(base_url=srv.url, headers=AUTH, timeout=300) as c:
        for data in corpus:
            r = c.post(
                "/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": image_parts(data)}],
                    "max_tokens": 1,
                },
            )
            counts[r.status_code] = counts.get(r.status_code, 0) + 1
            if r.status_code == 400:
                assert r.json()["error"]["message"].startswith("'messages[0].content[1]' ")
    print(f"{len(corpus)} mutated images: {counts}")
    assert len(corpus) == 60
    assert sum(counts.values()) == 60 and set(counts) <= {200, 400}
    assert counts.get(400, 0) > 0 and counts.get(200, 0) > 0
    assert_no_leak(loaded)
