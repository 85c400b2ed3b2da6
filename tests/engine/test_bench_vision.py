"""The benchmark with images: the `vision` workload and image lines in user JSONL files, what
each target sends, and a run on SmolLM2 with the seeded test projector (tests/projector_gguf.py)
whose figures come from the projector itself. The answers are meaningless; the counts are real."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

from engine.bench.embedded import run_loaded_benchmark
from engine.bench.harness import BenchConfig, EmbeddedTarget, run_benchmark
from engine.bench.media import check_reads_images, ollama_messages, openai_messages, pixels
from engine.bench.report import MEDIA_COLUMNS, format_table
from engine.bench.result import BenchError, BenchResult
from engine.bench.workloads import BUILTIN_DIR, MARKER, Workload, WorkloadError, load_workload
from engine.host.runtime import Model
from engine.settings import LoadParams
from tests.app.cli_inproc import run_cli
from tests.projector_gguf import TOKENS_PER_IMAGE


def config(*levels: int) -> BenchConfig:
    """Two short requests a level, no warm-up, no bandwidth measurement."""
    return BenchConfig(
        concurrency=list(levels), requests=2, max_tokens=4, warmup=0, measure_bandwidth=False
    )


def write(path: Path, *lines: object) -> Path:
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return path


def user(text: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 16}


# -- the workload -----------------------------------------------------------------------------


def test_the_vision_workload_resolves_its_images_and_places_their_markers() -> None:
    w = load_workload("vision")
    images_dir = BUILTIN_DIR / "images"
    assert w.source == "resources/workloads/vision.jsonl"
    assert w.images == sum(len(p.images) for p in w.prompts) == 10
    sizes = set()
    for p in w.prompts:
        assert p.images, p.id
        text = "".join(m["content"] for m in p.messages)
        assert text.count(MARKER) == len(p.images)
        for im in p.images:
            assert im.path.is_absolute() and im.path.parent == images_dir
            assert im.data == im.path.read_bytes() and len(im.data) < 100_000
            sizes.add((im.width, im.height))
    assert len(sizes) == 4  # four pictures of four sizes
    # No marker in the line: all the images go first in the first user message.
    first = w.prompts[0]
    assert first.messages[0]["content"].startswith(MARKER + "\n")
    with_system = w.prompts[2]
    assert with_system.messages[0]["role"] == "system"
    assert MARKER not in with_system.messages[0]["content"]
    assert with_system.messages[1]["content"].startswith(MARKER + "\n")
    # Markers in the text: they are used where they stand, not added to.
    explicit = w.prompts[6]
    assert explicit.messages[0]["content"].startswith("The first picture: " + MARKER)
    assert [im.name for im in explicit.images] == ["coast.jpg", "dawn.png"]


def test_the_marker_is_the_projectors() -> None:
    from engine.native.projector import marker

    assert marker() == MARKER


def test_image_paths_are_relative_to_the_workload_file(tmp_path: Path) -> None:
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes((BUILTIN_DIR / "images" / "dawn.png").read_bytes())
    f = write(
        tmp_path / "mine.jsonl", {**user("What is it?"), "images": ["pics/a.png"]}, user("Hi")
    )
    w = load_workload(str(f))
    assert w.images == 1 and w.prompts[0].images[0].path == tmp_path / "pics" / "a.png"
    assert w.prompts[0].images[0].mime == "image/png"
    assert w.prompts[1].images == () and w.prompts[1].messages[0]["content"] == "Hi"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            {**user("What is it?"), "images": ["nope.png"]},
            "bad.jsonl line 2: no image file nope.png",
        ),
        (
            {**user("What is it?"), "images": ["notes.png"]},
            "bad.jsonl line 2: notes.png is not an image Candlewick can read "
            "(PNG, JPEG, WebP, GIF, BMP or TIFF)",
        ),
        (
            {**user("What is it?"), "images": "dawn.png"},
            "bad.jsonl line 2: 'images' must be a list of image file paths",
        ),
        (
            {**user(f"{MARKER} and {MARKER}"), "images": ["pic.png"]},
            f"bad.jsonl line 2: the text has 2 {MARKER} marker(s) for 1 image(s)",
        ),
        (
            user(f"Look: {MARKER}"),
            f"bad.jsonl line 2: the text has 1 {MARKER} marker(s) for 0 image(s)",
        ),
        (
            {"messages": [{"role": "system", "content": "Be brief."}], "images": ["pic.png"]},
            "bad.jsonl line 2: images need a user message to go in",
        ),
    ],
)
def test_a_bad_image_line_is_refused_in_one_line_naming_file_and_line(
    tmp_path: Path, line: dict[str, object], message: str
) -> None:
    (tmp_path / "notes.png").write_text("not a picture at all", encoding="utf-8")
    (tmp_path / "pic.png").write_bytes((BUILTIN_DIR / "images" / "dawn.png").read_bytes())
    f = write(tmp_path / "bad.jsonl", user("Fine."), line)
    with pytest.raises(WorkloadError) as e:
        load_workload(str(f))
    assert str(e.value) == message


# -- what the targets send ---------------------------------------------------------------------


def test_http_messages_carry_the_images_where_their_markers_are() -> None:
    w = load_workload("vision")
    explicit = w.prompts[6]
    (msg,) = openai_messages(explicit)
    parts = msg["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "text", "image_url", "text"]
    assert parts[0]["text"] == "The first picture: "
    for part, im in zip((parts[1], parts[3]), explicit.images, strict=True):
        head, data = part["image_url"]["url"].split(",", 1)
        assert head == f"data:{im.mime};base64" and base64.b64decode(data) == im.data
    # The system message of a prompt stays plain text; the user's starts with its image.
    system, question = openai_messages(w.prompts[2])
    assert system == dict(w.prompts[2].messages[0])
    assert [p["type"] for p in question["content"]] == ["image_url", "text"]
    # Ollama: the images beside the text, the markers gone.
    (o,) = ollama_messages(explicit)
    assert MARKER not in o["content"] and o["content"].startswith("The first picture: \n")
    assert [base64.b64decode(b) for b in o["images"]] == [im.data for im in explicit.images]


# -- runs on a model with a projector ----------------------------------------------------------


@pytest.fixture(scope="module")
def vision(smollm2_path: Path, vision_projector_path: Path) -> Iterator[Model]:
    m = Model(
        smollm2_path,
        LoadParams(n_ctx=512, n_seq_max=1, n_threads=2, mmproj=str(vision_projector_path)),
    )
    yield m
    m.close()


def vision_workload(n: int = 4) -> Workload:
    """`n` prompts of the vision set from its fourth: one and two images, markers placed and
    written in the text."""
    w = load_workload("vision")
    return Workload(w.name, w.prompts[3 : 3 + n], w.source)


def expected_media_tokens(model: Model, w: Workload) -> dict[str, int]:
    """What the projector makes of each prompt's images, asked directly."""
    out = {}
    for p in w.prompts:
        mp = model.media_prompt(model.render_chat(list(p.messages)), pixels(p))
        out[p.id] = mp.media_tokens
        mp.close()
    return out


def check_media(result: BenchResult, w: Workload, expected: dict[str, int]) -> None:
    for li, lv in enumerate(result.levels):
        traces = result.traces[lv.concurrency]
        sent = w.take((li + 1) * 2)[li * 2 :]
        assert lv.succeeded == lv.requests == 2, lv.error_samples
        for tr in traces:
            p = sent[tr.index]
            assert tr.images == len(p.images)
            assert tr.media_tokens == expected[p.id]
            # Every request's prompt starts with its own tag: its images are encoded anew.
            assert tr.media_encoded is not None and tr.media_encoded >= len(p.images)
            assert tr.media_encode_ms is not None and tr.media_encode_ms > 0
            assert tr.media_tps is not None and tr.media_tps > 0
            assert tr.prompt_tokens > tr.media_tokens and tr.ttft is not None
        assert lv.images == sum(len(p.images) for p in sent)
        assert lv.media_tokens == sum(expected[p.id] for p in sent)
        assert lv.media_encode_ms_p50 is not None and lv.media_encode_ms_p50 > 0
        assert lv.media_encode_ms_p95 is not None and lv.media_encode_ms_p95 > 0
        assert lv.media_tps_p50 is not None and lv.media_tps_p50 > 0
        assert lv.gen_tps_p50 is not None and lv.ttft_p50 is not None


def test_a_run_at_concurrency_1_and_2_reports_what_the_projector_did(vision: Model) -> None:
    w = vision_workload()
    expected = expected_media_tokens(vision, w)
    # idefics3 reads a tile and an overview of each image: two chunks of 16 rows.
    assert expected == {p.id: 2 * TOKENS_PER_IMAGE * len(p.images) for p in w.prompts}
    result = run_loaded_benchmark(vision, w, config(1, 2))
    assert [lv.concurrency for lv in result.levels] == [1, 2]
    check_media(result, w, expected)
    assert result.workload.images == w.images
    # The JSON round-trips, images and all.
    data = json.loads(result.to_json())
    assert data["workload"]["images"] == w.images
    assert data["levels"][0]["media_tokens"] == result.levels[0].media_tokens
    assert data["traces"]["2"][0]["media_encode_ms"] == result.traces[2][0].media_encode_ms
    back = BenchResult.from_dict(data)
    assert back.to_dict() == data
    check_media(back, w, expected)
    # The report shows the images' columns and says what they mean.
    table = format_table(result)
    header = table.splitlines()[0]
    assert all(c in header for c in MEDIA_COLUMNS)
    assert f"Images: {w.images} images in 4 prompts; enc ms = the projector's encode" in table


def test_the_sequential_target_reports_them_too(vision: Model) -> None:
    w = vision_workload(2)
    expected = expected_media_tokens(vision, w)
    result = run_benchmark(EmbeddedTarget(vision), w, config(1))
    check_media(result, w, expected)


def test_a_text_workload_keeps_its_json_and_table(vision: Model) -> None:
    chat = load_workload("chat")
    w = Workload("chat", chat.prompts[:2], chat.source)
    result = run_benchmark(EmbeddedTarget(vision), w, config(1))
    data = result.to_dict()
    assert "images" not in data["workload"]
    assert not {"images", "media_tokens", "media_tps_p50"} & set(data["levels"][0])
    assert not {"images", "media_tokens", "media_encode_ms"} & set(data["traces"]["1"][0])
    table = format_table(result)
    assert "media" not in table and "Images" not in table


def test_a_model_without_a_projector_is_refused(smollm2: Model) -> None:
    w = vision_workload(1)
    with pytest.raises(BenchError) as e:
        check_reads_images(smollm2, w)
    assert str(e.value) == (
        f"the vision workload sends images, and {smollm2.path.name} was loaded without a "
        "vision projector (mmproj)"
    )
    with pytest.raises(BenchError):
        run_loaded_benchmark(smollm2, w, config(1))
    check_reads_images(smollm2, load_workload("chat"))  # text: nothing to refuse


def test_the_command_refuses_vision_without_mmproj_before_loading() -> None:
    r = run_cli("bench", "--model", "no-such-model", "--workload", "vision")
    assert r.returncode == 2, r.stderr
    # Refused before the model is even looked up (it does not exist).
    assert r.stderr.strip().splitlines() == [
        "candlewick: error: --workload vision needs the model's projector: add --mmproj PATH"
    ]


# -- through a server --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(smollm2_path: Path, vision_projector_path: Path) -> Iterator[tuple[str, Model]]:
    """`candlewick serve --mmproj` in this process: the OpenAI and Ollama routes."""
    from engine.server import ServedModel, ServerConfig, ServerState, ServerThread
    from tests.engine.server.conftest import make_config

    model = Model(
        smollm2_path,
        LoadParams(n_ctx=1024, n_seq_max=2, n_threads=2, mmproj=str(vision_projector_path)),
    )
    loaded = ServedModel.build(model, "smollm2-vision", max_queue=8)
    state = ServerState(
        make_config(
            model_id="smollm2-vision",
            api_key=None,
            max_body_bytes=ServerConfig(port=0).max_body_bytes,
        )
    )
    state.set_loaded(loaded)
    try:
        with ServerThread(state) as srv:
            yield srv.url, model
    finally:
        loaded.close()
        model.close()


@pytest.mark.parametrize(("api", "levels"), [("openai", (1, 2)), ("ollama", (1,))])
def test_the_http_target_sends_the_images_to_the_server(
    served: tuple[str, Model], api: Literal["openai", "ollama"], levels: tuple[int, ...]
) -> None:
    from engine.bench.harness import HttpTarget
    from engine.remote.streaming import StreamingClient

    url, model = served
    assert model.projector is not None
    w = vision_workload()
    expected = expected_media_tokens(model, w)
    client = StreamingClient(url, api=api, model="smollm2-vision", timeout_s=300)
    before = model.projector.encodes
    result = run_benchmark(HttpTarget(client), w, config(*levels))
    sent = 0
    for li, lv in enumerate(result.levels):
        assert lv.succeeded == lv.requests == 2, lv.error_samples
        prompts = w.take((li + 1) * 2)[li * 2 :]
        for tr in result.traces[lv.concurrency]:
            p = prompts[tr.index]
            assert tr.images == len(p.images)
            # The server read them: its prompt holds their tokens (usage counts them).
            assert tr.token_source == "usage" and tr.prompt_tokens > expected[p.id]
            # What its projector did is not reported over HTTP.
            assert tr.media_tokens is None and tr.media_encode_ms is None
        sent += lv.images
        assert lv.media_tokens is None and lv.media_encode_ms_p50 is None
    # Each image was encoded by the server's projector (a tile and an overview each).
    assert model.projector.encodes - before == 2 * sent
    assert "the server does not report what its projector did" in format_table(result)
