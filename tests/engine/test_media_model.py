"""Images and audio through a real model: SmolLM2 with the seeded test projectors
(tests/projector_gguf.py), libmtmd tokenizing and encoding, the host's one loop decoding the
rows. The answers are meaningless; the pipeline, the reuse and the refusals are real."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.errors import EngineError
from engine.host.runtime import Model
from engine.media.audio import decode_wav
from engine.media.images import decode_image
from engine.model.projector_file import check_projector
from engine.native.projector import marker
from engine.settings import LoadParams, SamplingParams
from tests.media_files import png, wav
from tests.mtmd_reference import greedy_reply
from tests.projector_gguf import TOKENS_PER_IMAGE, test_image, test_tone, write_audio_projector

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def vision(smollm2_path: Path, vision_projector_path: Path) -> Iterator[Model]:
    m = Model(
        smollm2_path,
        LoadParams(n_ctx=2048, n_seq_max=2, n_threads=2, mmproj=str(vision_projector_path)),
    )
    yield m
    m.close()


def ask(model: Model, question: str, media: list[bytes]) -> tuple[str, dict[str, float]]:
    prompt = model.render_chat(
        [{"role": "user", "content": marker() * len(media) + "\n" + question}]
    )
    mp = model.media_prompt(prompt, [decode_image(b) for b in media])
    gen = model.submit(mp.tokens, GREEDY, media=mp)
    text = gen.consume()
    st = gen.stats
    last_media = mp.spans[-1].end
    return text, {
        "cached": st.cached_tokens,
        "encoded": st.media_encoded,
        "media_tokens": st.media_tokens,
        "last_media": last_media,
        "prompt": st.prompt_tokens,
    }


def test_an_image_is_answered_and_encoded_once_for_a_conversation(vision: Model) -> None:
    assert vision.projector is not None and vision.projector.vision
    picture = png(test_image())
    before = vision.projector.encodes
    first, s1 = ask(vision, "What is in this picture?", [picture])
    assert first.strip()
    # idefics3 reads a tile and an overview: two chunks of 16 rows, both encoded.
    assert s1["media_tokens"] == 2 * TOKENS_PER_IMAGE and s1["encoded"] == 2
    assert vision.projector.encodes == before + 2
    # The same picture again: its KV cells are reused, the projector is not run.
    again, s2 = ask(vision, "What is in this picture?", [picture])
    assert s2["encoded"] == 0 and vision.projector.encodes == before + 2
    assert s2["cached"] >= s2["last_media"]
    assert again == first
    # Another picture in the same place is read again from its first row.
    _, s3 = ask(vision, "What is in this picture?", [png(test_image(seed=7))])
    assert s3["encoded"] == 2 and s3["cached"] < s1["prompt"] - s1["media_tokens"]


def test_a_text_only_load_refuses_media_in_one_line(smollm2_path: Path) -> None:
    with (
        Model(smollm2_path, LoadParams(n_ctx=512, n_threads=2)) as m,
        pytest.raises(EngineError) as e,
    ):
        m.media_prompt(m.render_chat([{"role": "user", "content": marker()}]), [])
    assert str(e.value) == (
        f"{smollm2_path.name} reads text only: load it with its projector (mmproj) "
        "to send images or audio"
    )


def test_audio_is_answered_through_the_audio_projector(
    smollm2_path: Path, audio_projector_path: Path
) -> None:
    params = LoadParams(n_ctx=1024, n_threads=2, mmproj=str(audio_projector_path))
    with Model(smollm2_path, params) as m:
        assert m.projector is not None and m.projector.audio and not m.projector.vision
        rate = m.projector.audio_rate
        tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(44100) / 44100)  # 1 s at 44.1 kHz
        clip = decode_wav(wav(tone, 44100), rate)  # resampled to the projector's rate
        assert clip.n == rate
        same = decode_wav(wav(test_tone(1.0), rate), rate)
        assert np.allclose(
            np.frombuffer(clip.pcm, np.float32), np.frombuffer(same.pcm, np.float32), atol=2e-3
        )
        prompt = m.render_chat([{"role": "user", "content": marker() + "\nWhat do you hear?"}])
        mp = m.media_prompt(prompt, [clip])
        gen = m.submit(mp.tokens, GREEDY, media=mp)
        assert gen.consume().strip()
        assert gen.stats.media_tokens == 150 and gen.stats.media_encoded == 1


NOT_GGUF = "projector notes.gguf: not a GGUF model (no GGUF signature at the start of the file)"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d, good: d / "missing.gguf", "projector file not found: {dir}/missing.gguf"),
        (
            lambda d, good: _write(d / "cut.gguf", good.read_bytes()[:200_000]),
            "projector cut.gguf: file is truncated: 1.5 MB expected, 200 KB present",
        ),
        (lambda d, good: _write(d / "notes.gguf", b"hello, not a projector"), NOT_GGUF),
    ],
)
def test_a_bad_projector_file_is_refused_in_one_line(
    smollm2_path: Path, vision_projector_path: Path, tmp_path: Path, make: object, message: str
) -> None:
    path = make(tmp_path, vision_projector_path)  # type: ignore[operator]
    with pytest.raises(EngineError) as e:
        Model(smollm2_path, LoadParams(n_ctx=512, n_threads=2, mmproj=str(path)))
    assert str(e.value) == message.format(dir=tmp_path)


def test_a_language_model_given_as_projector_is_named_as_such(
    smollm2_path: Path, minilm_path: Path
) -> None:
    with pytest.raises(EngineError, match=r"is not a projector \(mmproj\) file: it holds a bert"):
        Model(smollm2_path, LoadParams(n_ctx=512, n_threads=2, mmproj=str(minilm_path)))


def test_an_ultravox_that_would_abort_the_encode_is_refused_at_load(tmp_path: Path) -> None:
    # Stacking 8 frames (the published Ultravox models' factor) makes this llama.cpp count
    # 187 tokens a window and produce 188, then abort (tests/test_projector_asset.py shows it
    # in a child). It is refused before anything reads it.
    path = write_audio_projector(tmp_path / "ultravox-8.gguf", stack_factor=8)
    with pytest.raises(EngineError, match="stacks 8 audio frames"):
        check_projector(path)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_an_image_reply_is_libmtmds_own(
    smolvlm_text_path: Path, vision_projector_path: Path
) -> None:
    """The loop's greedy reply about an image is the token-for-token reply of libmtmd's own
    helper decoding the same chunks (tests/mtmd_reference.py), on the text model that has
    the projector's image tokens, as llama-server reads it."""
    image = decode_image(png(test_image(seed=3)))
    params = LoadParams(n_ctx=2048, n_threads=2, mmproj=str(vision_projector_path))
    sampling = SamplingParams(temperature=0.0, repeat_penalty=1.0, max_tokens=24)
    with Model(smolvlm_text_path, params) as m:
        prompt = m.render_chat([{"role": "user", "content": marker() + "What is this?"}])
        mp = m.media_prompt(prompt, [image])
        assert not any(t == -1 for t in mp.tokens)  # every marker token is in the vocabulary
        gen = m.submit(mp.tokens, sampling, media=mp)
        ours = gen.consume()
        n = gen.stats.gen_tokens
    assert ours.strip()
    assert ours == greedy_reply(
        smolvlm_text_path, vision_projector_path, prompt, image, n, n_ctx=2048
    )
