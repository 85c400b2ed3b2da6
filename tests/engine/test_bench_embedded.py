"""The benchmark's own model instance: sized from the workload with the real tokenizer, and
loaded with the chat's settings otherwise."""

from __future__ import annotations

from pathlib import Path

from engine.bench.embedded import TAG_TOKENS, bench_load_params, context_per_request
from engine.bench.harness import Tokenizer
from engine.bench.workloads import load_workload
from engine.settings import LoadParams


def test_context_fits_the_longest_prompt_with_its_answer(smollm2_path: Path) -> None:
    rag = load_workload("rag")
    n_ctx = context_per_request(smollm2_path, rag, None)
    tok = Tokenizer(smollm2_path)
    try:
        need = max(tok.count_chat(p.messages) + p.max_tokens for p in rag.prompts)
    finally:
        tok.close()
    assert n_ctx % 256 == 0
    assert need + TAG_TOKENS <= n_ctx < need + TAG_TOKENS + 256
    assert n_ctx > 3200  # the rag prompts are 3.2k-3.9k tokens
    # A cap on the answers shrinks it; the chat set is far smaller.
    assert context_per_request(smollm2_path, rag, 8) <= n_ctx
    assert context_per_request(smollm2_path, load_workload("chat"), 8) <= 512


def test_load_params_keep_the_chat_settings() -> None:
    chat = LoadParams(n_ctx=8192, n_gpu_layers=12, n_threads=3, flash_attn="on",
                      type_k="q8_0", type_v="q8_0", state_cache_mb=256)
    p = bench_load_params(chat, 1024, 4)
    assert (p.n_ctx, p.n_seq_max, p.state_cache_mb) == (4096, 4, 0)
    assert (p.n_gpu_layers, p.n_threads, p.flash_attn, p.type_k, p.type_v) == \
        (12, 3, "on", "q8_0", "q8_0")
    assert chat.n_ctx == 8192  # the chat's own settings are untouched
