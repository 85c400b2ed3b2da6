"""The test projectors (tests/projector_gguf.py) through the real libmtmd of llama-cpp-python,
with the bundled SmolLM2 as the text model: they load, tokenize into the chunks the vendored
llama.cpp makes for their projector types, and encode; the vision embeddings agree with the
numpy forward pass of the same file's weights.

Tolerance of the vision comparison: ATOL = 0.03 on embeddings whose standard deviation is about 1
(the seeded weights keep activations near unit size; the test checks that too). The numpy pass
is float64 on the weights as stored; ggml's CPU path rounds the activations to F16 before each
F16 matrix product (its vec_dot type for F16 weights: 11 significant bits, steps of 2^-11 of the
value), rounds K and V to F16 when flash attention is on, and takes GELU from an F16 table. There
are about a dozen such roundings between pixels and output, each ~5e-4 relative; the measured
max abs difference was 2.1e-3 (1.8e-3 with flash attention off) on an x86-64 CPU, so 0.03 leaves
room for other CPUs' kernels, while a wrong layout (patches transposed, the pixel shuffle's
sub-blocks in the other order) moves outputs by about 4.5.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests import projector_gguf as pg

ATOL = 0.03
REPO = Path(__file__).resolve().parent.parent
PROMPT = "Look at this: {marker} What is it?"


@pytest.fixture(scope="module")
def mtmd() -> Any:
    """libmtmd's bindings, its log routed like llama.cpp's (engine.native.llama_lib)."""
    from llama_cpp import mtmd_cpp

    from engine.native.llama_lib import lib, log_callback

    lib()  # backend initialised, llama.cpp's log routed
    mtmd_cpp.mtmd_log_set(log_callback(), ctypes.c_void_p(0))
    return mtmd_cpp


@pytest.fixture(scope="module")
def text_model(smollm2_path: Path) -> Iterator[Any]:
    """SmolLM2 loaded through the low-level API (CPU), freed after the module."""
    from engine.native.llama_lib import lib

    C = lib()
    mp = C.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = C.llama_model_load_from_file(str(smollm2_path).encode(), mp)
    assert model, "SmolLM2 did not load"
    assert C.llama_model_n_embd(model) == pg.N_EMBD_TEXT
    yield model
    C.llama_model_free(model)


@contextmanager
def _context(mtmd: Any, projector: Path, model: Any) -> Iterator[Any]:
    params = mtmd.mtmd_context_params_default()
    params.use_gpu = False
    params.n_threads = 2
    params.print_timings = False
    ctx = mtmd.mtmd_init_from_file(str(projector).encode(), model, params)
    assert ctx, f"libmtmd refused {projector.name} (its log says why)"
    try:
        yield ctx
    finally:
        mtmd.mtmd_free(ctx)


@contextmanager
def _chunks(mtmd: Any, ctx: Any, bitmap: Any) -> Iterator[list[Any]]:
    """The prompt with the default marker and one bitmap, tokenized; the chunk pointers."""
    marker = mtmd.mtmd_default_marker().decode()
    text = PROMPT.format(marker=marker).encode()
    inp = mtmd.mtmd_input_text(text, len(text), False, True)
    bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
    chunks = mtmd.mtmd_input_chunks_init()
    assert chunks
    try:
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), bitmaps, 1) == 0
        n = mtmd.mtmd_input_chunks_size(chunks)
        yield [mtmd.mtmd_input_chunks_get(chunks, i) for i in range(n)]
    finally:
        mtmd.mtmd_input_chunks_free(chunks)


@contextmanager
def _image_bitmap(mtmd: Any, image: npt.NDArray[np.uint8]) -> Iterator[Any]:
    h, w, _ = image.shape
    data = (ctypes.c_uint8 * image.size).from_buffer_copy(np.ascontiguousarray(image).tobytes())
    bitmap = mtmd.mtmd_bitmap_init(w, h, data)
    assert bitmap
    try:
        yield bitmap
    finally:
        mtmd.mtmd_bitmap_free(bitmap)


@contextmanager
def _audio_bitmap(mtmd: Any, samples: npt.NDArray[np.float32]) -> Iterator[Any]:
    data = (ctypes.c_float * samples.size)(*samples.tolist())
    bitmap = mtmd.mtmd_bitmap_init_from_audio(samples.size, data)
    assert bitmap
    try:
        yield bitmap
    finally:
        mtmd.mtmd_bitmap_free(bitmap)


def _types(mtmd: Any, chunks: list[Any]) -> list[int]:
    return [mtmd.mtmd_input_chunk_get_type(c) for c in chunks]


def _text_tokens(mtmd: Any, chunk: Any) -> list[int]:
    n = ctypes.c_size_t(0)
    ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
    return [int(ptr[i]) for i in range(n.value)]


def _encode(mtmd: Any, ctx: Any, chunk: Any) -> npt.NDArray[np.float32]:
    n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
    assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
    out = mtmd.mtmd_get_output_embd(ctx)
    assert out
    flat = np.ctypeslib.as_array(out, shape=(n_tokens * pg.N_EMBD_TEXT,))
    return flat.reshape(n_tokens, pg.N_EMBD_TEXT).copy()


def test_vision_projector_loads_as_idefics3(
    mtmd: Any, text_model: Any, vision_projector_path: Path
) -> None:
    with _context(mtmd, vision_projector_path, text_model) as ctx:
        assert mtmd.mtmd_support_vision(ctx)
        assert not mtmd.mtmd_support_audio(ctx)
        # idefics3 images decode like text: causal attention, ordinary positions
        assert not mtmd.mtmd_decode_use_non_causal(ctx, None)
        assert not mtmd.mtmd_decode_use_mrope(ctx)


def test_image_chunks_and_embeddings_match_numpy(
    mtmd: Any, text_model: Any, vision_projector_path: Path
) -> None:
    image = pg.test_image()
    expected = pg.Reference(vision_projector_path).embed(image)
    assert expected.shape == (pg.TOKENS_PER_IMAGE, pg.N_EMBD_TEXT)
    assert 0.5 < float(expected.std()) < 2.0  # unit-sized: ATOL means something
    T, IMG = mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT, mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE
    with (
        _context(mtmd, vision_projector_path, text_model) as ctx,
        _image_bitmap(mtmd, image) as bitmap,
        _chunks(mtmd, ctx, bitmap) as chunks,
    ):
        # idefics3 always slices: the one 128 px tile, then the overview of the whole image
        assert _types(mtmd, chunks) == [T, IMG, T, IMG, T]
        images = [c for c in chunks if mtmd.mtmd_input_chunk_get_type(c) == IMG]
        assert len(images) == pg.IMAGE_CHUNKS_PER_BITMAP
        for chunk in images:
            assert mtmd.mtmd_input_chunk_get_n_tokens(chunk) == pg.TOKENS_PER_IMAGE
            tokens = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
            assert mtmd.mtmd_image_tokens_get_n_tokens(tokens) == pg.TOKENS_PER_IMAGE
            assert not mtmd.mtmd_decode_use_non_causal(ctx, chunk)
        tile, overview = (_encode(mtmd, ctx, c) for c in images)
    for got in (tile, overview):
        assert np.isfinite(got).all()
        diff = float(np.abs(got - expected).max())
        assert diff < ATOL, f"max abs difference {diff} vs numpy"
    # both are the image as given (no resize at image_size): the same pixels, the same output
    np.testing.assert_array_equal(tile, overview)


def test_smollm2_lacks_the_idefics3_image_tokens(
    mtmd: Any, text_model: Any, vision_projector_path: Path
) -> None:
    """libmtmd looks up SmolVLM's `<fake_token_around_image>` and `<global-img>` in the text
    model's vocabulary; SmolLM2 has neither, and libmtmd puts LLAMA_TOKEN_NULL (-1) in the text
    chunks in their place (around the overview). Decoding those chunks as they are would feed
    llama.cpp an invalid token: the test pair is for encoding only."""
    with (
        _context(mtmd, vision_projector_path, text_model) as ctx,
        _image_bitmap(mtmd, pg.test_image()) as bitmap,
        _chunks(mtmd, ctx, bitmap) as chunks,
    ):
        before, between, after = (
            _text_tokens(mtmd, c)
            for c in chunks
            if mtmd.mtmd_input_chunk_get_type(c) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT
        )
    assert -1 not in before  # the prompt, then "<fake_token_around_image><row_1_col_1>" as text
    assert between[-2:] == [-1, -1]  # "\n\n", <fake_token_around_image>, <global-img>
    assert after[0] == -1  # <fake_token_around_image>, then the rest of the prompt
    assert -1 not in after[1:]


def test_audio_projector_loads_and_encodes(
    mtmd: Any, text_model: Any, audio_projector_path: Path
) -> None:
    T, A = mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT, mtmd.MTMD_INPUT_CHUNK_TYPE_AUDIO
    with _context(mtmd, audio_projector_path, text_model) as ctx:
        assert mtmd.mtmd_support_audio(ctx)
        assert not mtmd.mtmd_support_vision(ctx)
        assert mtmd.mtmd_get_audio_sample_rate(ctx) == pg.SAMPLE_RATE
        with (
            _audio_bitmap(mtmd, pg.test_tone(1.0)) as bitmap,
            _chunks(mtmd, ctx, bitmap) as chunks,
        ):
            assert _types(mtmd, chunks) == [T, A, T]  # ultravox adds no begin/end text
            audio = chunks[1]
            # one started 30 s window: 1500 positions after the stride-2 conv, stacked by 8
            assert mtmd.mtmd_input_chunk_get_n_tokens(audio) == pg.TOKENS_PER_AUDIO_WINDOW
            assert not mtmd.mtmd_decode_use_non_causal(ctx, audio)
            got = _encode(mtmd, ctx, audio)
    assert got.shape == (pg.TOKENS_PER_AUDIO_WINDOW, pg.N_EMBD_TEXT)
    assert np.isfinite(got).all()
    # RMS-normed then projected: unit-sized and different from token to token
    assert 0.3 < float(got.std()) < 3.0
    assert float(np.abs(np.diff(got, axis=0)).max()) > 0.1


# Encodes one second of audio with a projector of stack factor 8 (the published Ultravox models'),
# in a child: libmtmd aborts the process.
_STACK_8_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import llama_cpp.llama_cpp as C
    from llama_cpp import mtmd_cpp as m

    from tests import projector_gguf as pg
    from tests import test_projector_asset as t

    out, text_model = Path(sys.argv[1]), sys.argv[2]
    pg.write_audio_projector(out, stack_factor=8)
    C.llama_backend_init()
    mp = C.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = C.llama_model_load_from_file(text_model.encode(), mp)
    with t._context(m, out, model) as ctx:
        with t._audio_bitmap(m, pg.test_tone(1.0)) as bitmap, t._chunks(m, ctx, bitmap) as chunks:
            print("n_tokens", m.mtmd_input_chunk_get_n_tokens(chunks[1]), flush=True)
            t._encode(m, ctx, chunks[1])
    print("encoded", flush=True)
    """
)


def test_stack_factor_8_aborts_the_encode(smollm2_path: Path, tmp_path: Path) -> None:
    """Why the test projector stacks 10 frames: with 8, as Ultravox v0.5 does, the vendored
    libmtmd counts 187 tokens for a 30 s window (3000 / 8 / 2, rounded down) while its graph
    gives 188 (1500 positions padded to 1504, / 8), and clip_encode aborts on the mismatch."""
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    run = subprocess.run(
        [sys.executable, "-c", _STACK_8_CHILD, str(tmp_path / "stack8.gguf"), str(smollm2_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "n_tokens 187" in run.stdout
    assert "encoded" not in run.stdout
    assert run.returncode == -signal.SIGABRT
    assert "expected output 187 tokens, got 188" in run.stderr
