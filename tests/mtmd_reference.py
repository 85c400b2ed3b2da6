"""libmtmd's own way to answer about an image, for the tests to compare with: its helper
(`mtmd_helper_eval_chunks`) decodes the chunks on a llama.cpp context of its own, then a
greedy loop on the C API. The engine never does this (its one loop decodes the rows through
the typed backend); this is the reference its replies must equal."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp.llama_cpp as C
import llama_cpp.mtmd_cpp as M

from engine.memory import cpu_kernels
from engine.model.gguf import read_gguf
from engine.native.projector import Pixels


def greedy_reply(
    model_path: Path, mmproj: Path, prompt: str, image: Pixels, n_tokens: int, *, n_ctx: int
) -> str:
    """`prompt` (rendered, one marker) with `image`: the first `n_tokens` greedy tokens, as
    text. Flash attention as the engine's CPU 'auto' resolves it for this file and context
    (engine.settings.resolve_flash_attn), 2 threads: the engine's defaults."""
    mp = C.llama_model_default_params()
    model = C.llama_model_load_from_file(str(model_path).encode(), mp)
    assert model
    cp = C.llama_context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = n_ctx, 2, 2
    gf = read_gguf(model_path)
    flash = cpu_kernels.resolve_flash_attn_for("auto", gf, "f16", "f16", n_ctx=n_ctx, gpu=False)
    cp.flash_attn_type = 1 if flash == "on" else 0
    ctx = C.llama_init_from_model(model, cp)
    params = M.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings = False, 2, False
    mctx = M.mtmd_init_from_file(str(mmproj).encode(), model, params)
    chunks = M.mtmd_input_chunks_init()
    bmp = M.mtmd_bitmap_init(
        image.width, image.height, (ctypes.c_uint8 * len(image.rgb)).from_buffer_copy(image.rgb)
    )
    sampler = C.llama_sampler_init_greedy()
    try:
        data = prompt.encode()
        text = M.mtmd_input_text(data, len(data), False, True)
        bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(bmp)
        assert M.mtmd_tokenize(mctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
        n_past = C.llama_pos(0)
        rc = M.mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, 512, True, ctypes.byref(n_past))
        assert rc == 0
        vocab = C.llama_model_get_vocab(model)
        out = b""
        piece = ctypes.create_string_buffer(256)
        for _ in range(n_tokens):
            tok = C.llama_sampler_sample(sampler, ctx, -1)
            if C.llama_vocab_is_eog(vocab, tok):
                break
            n = C.llama_token_to_piece(vocab, tok, piece, len(piece), 0, False)
            out += piece.raw[:n]
            arr = (C.llama_token * 1)(tok)
            assert C.llama_decode(ctx, C.llama_batch_get_one(arr, 1)) == 0
        return out.decode("utf-8", errors="replace")
    finally:
        C.llama_sampler_free(sampler)
        M.mtmd_bitmap_free(bmp)
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_free(mctx)
        C.llama_free(ctx)
        C.llama_model_free(model)
