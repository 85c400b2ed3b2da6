"""Prompt batching that keeps logits reproducible (engine.host.batch_plan, cpu_kernels.split_rule),
and on the real SmolLM2: the splits the rule calls equivalent give bit-identical logits."""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
from pathlib import Path

import pytest

from engine.host.batch_plan import BatchPlan, counts_as_canonical, plan
from engine.host.runtime import Model
from engine.memory import cpu_kernels
from engine.memory.cpu_kernels import CpuFeatures, split_rule
from engine.settings import LoadParams, SamplingParams
from tests.engine.test_cpu_kernels import F, tensor


def test_plan_never_decodes_a_prompt_token_alone_under_multi() -> None:
    # Regenerating: the whole prompt is cached; the last two tokens are decoded again.
    assert plan(300, 300, 512, "multi") == BatchPlan(298, (2,))
    assert plan(300, 120, 512, "multi") == BatchPlan(120, (180,))
    # 513 new tokens would end with one alone: the last two batches share them out.
    assert plan(513, 0, 512, "multi") == BatchPlan(0, (511, 2))
    assert plan(1, 0, 512, "multi") == BatchPlan(0, (1,))


def test_plan_grid_starts_batches_at_multiples_of_n_batch() -> None:
    assert plan(300, 300, 64, "grid") == BatchPlan(256, (44,))
    assert plan(700, 650, 512, "grid") == BatchPlan(512, (188,))
    assert plan(129, 0, 64, "grid") == BatchPlan(0, (64, 64, 1))


def test_plan_tiled_keeps_every_batch_at_64_tokens_or_more() -> None:
    # Regenerating or a follow-up: the cache is reused, the last 64 tokens are read again.
    assert plan(300, 300, 512, "tiled") == BatchPlan(236, (64,))
    assert plan(300, 120, 512, "tiled") == BatchPlan(120, (180,))
    # A tail shorter than 64 borrows from the batch before it.
    assert plan(530, 0, 512, "tiled") == BatchPlan(0, (466, 64))
    assert plan(1030, 0, 512, "tiled") == BatchPlan(0, (512, 454, 64))
    # A short prompt is read whole, from the start, whatever was cached.
    assert plan(50, 40, 512, "tiled") == BatchPlan(0, (50,))
    # Batches too small to hold two tiles: the identical batches of "grid" instead.
    assert plan(300, 300, 64, "tiled") == plan(300, 300, 64, "grid")


def test_what_counts_as_canonical_under_each_rule() -> None:
    assert not counts_as_canonical(1, "multi") and counts_as_canonical(2, "multi")
    assert not counts_as_canonical(63, "tiled") and counts_as_canonical(64, "tiled")
    assert counts_as_canonical(1, "grid") and counts_as_canonical(1, "any")


def test_plan_any_reuses_everything_but_the_last_token() -> None:
    assert plan(300, 300, 512, "any") == BatchPlan(299, (1,))
    assert plan(300, 10, 128, "any") == BatchPlan(10, (128, 128, 34))
    with pytest.raises(ValueError):
        plan(0, 0, 512, "any")


def load(
    f: CpuFeatures,
    *,
    types: tuple[str, ...] = ("Q4_1",),
    flash_attn: bool = False,
    kv: str = "f16",
    gpu_layers: int = 0,
    extra_buffers: bool = True,
) -> str:
    tensors = [tensor(f"blk.0.w{i}.weight", t) for i, t in enumerate(types)]
    return split_rule(
        tensors,
        f,
        extra_buffers=extra_buffers,
        flash_attn=flash_attn,
        type_k=kv,
        type_v=kv,
        gpu_layers=gpu_layers,
    )


def test_split_rule_for_each_kind_of_cpu() -> None:
    epyc = F["epyc"]
    # SmolLM2 as shipped: sgemm (Q8_0) and attention without flash attention differ only
    # between one row and many.
    assert load(epyc, types=("Q4_1", "Q8_0")) == "multi"
    # Repacked Q4_K (Gemma-3 on AVX2): gemm in groups of rows, gemv for the rest.
    assert load(epyc, types=("Q4_K",)) == "grid"
    assert load(epyc, types=("Q4_K",), extra_buffers=False) == "multi"
    assert load(F["arm"], types=("Q4_1",)) == "grid"  # ARM's two-row int8 kernel
    assert load(epyc, types=("Q4_1", "Q8_0"), flash_attn=True) == "tiled"
    assert load(epyc, types=("Q4_K",), flash_attn=True) == "grid"  # the weights decide
    assert load(epyc, types=("Q4_1",), flash_attn=True, kv="q8_0") == "any"
    assert load(epyc, gpu_layers=10) == "grid"


def _logits_digest(m: Model) -> str:
    C = m._lib
    row = ctypes.cast(
        C.llama_get_logits_ith(m.ctx_ptr, -1), ctypes.POINTER(ctypes.c_float * m.n_vocab)
    ).contents
    return hashlib.sha1(bytes(row)).hexdigest()


def _evaluate(m: Model, tokens: list[int], sizes: list[int]) -> str:
    C = m._lib
    m.reset_cache()
    pos = 0
    for size in sizes:
        chunk = tokens[pos : pos + size]
        arr = (C.llama_token * len(chunk))(*chunk)
        assert C.llama_decode(m.ctx_ptr, C.llama_batch_get_one(arr, len(chunk))) == 0
        pos += len(chunk)
    assert pos == len(tokens)
    return _logits_digest(m)


# Flash attention on, weights as mapped (no AMX or repacked copies): the "tiled" rule's kernels.
FLASH_MAPPED = LoadParams(n_ctx=2048, flash_attn="on", state_cache_mb=0, extra_buffers=False)


def test_splits_the_rule_allows_give_bit_identical_logits(smollm2_path: Path) -> None:
    # Without flash attention (with it: the test below).
    params = LoadParams(n_ctx=1024, flash_attn="off", state_cache_mb=0)
    with Model(smollm2_path, params) as m:
        tokens = m.tokenize("The lighthouse keeper wrote in his log every night. " * 30)[:300]
        n = len(tokens)
        canonical = _evaluate(m, tokens, [n])
        if m.split_rule == "grid":
            pytest.skip("only identical batches are equivalent with these kernels")
        # As a follow-up turn batches it (cached prefix, then the rest), as regenerating
        # does (all but the last two), and in small batches: all are the same bits.
        for sizes in ([200, n - 200], [n - 2, 2], [64, 64, 64, 64, n - 256]):
            assert _evaluate(m, tokens, sizes) == canonical, sizes


def test_upstream_flash_attention_splits_of_64_or_more_give_bit_identical_logits(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # llama.cpp's own kernels for small batches (LLAMA_FA_SMALL_TILES=0, and the rules told
    # so): a batch below 64 goes row by row. Past 512 cached cells too, where a single query
    # would take the split-cache kernel. The weights stay in the mapped file: AMX copies would
    # take the "grid" rule on their own.
    upstream = dataclasses.replace(cpu_kernels.detect(), fa_small_tiles=False)
    monkeypatch.setattr(cpu_kernels, "detect", lambda: upstream)
    monkeypatch.setenv("LLAMA_FA_SMALL_TILES", "0")
    with Model(smollm2_path, FLASH_MAPPED) as m:
        assert m.split_rule == "tiled"
        tokens = m.tokenize("The lighthouse keeper wrote in his log every night. " * 120)[:1100]
        canonical = _evaluate(m, tokens, list(plan(len(tokens), 0, 512, "tiled").sizes))
        for sizes in ([500, 500, 100], [460, 512, 128], [300, 300, 300, 200]):
            assert _evaluate(m, tokens, sizes) == canonical, sizes
        # A batch below 64 takes the row-by-row kernel: other bits, which is why the plan
        # never makes one.
        assert _evaluate(m, tokens, [512, 512, 70, 6]) != canonical
        short = tokens[:50]
        whole = _evaluate(m, short, [50])
        assert _evaluate(m, short, [25, 25]) == _evaluate(m, short, [48, 2]) == whole


def test_small_tile_flash_attention_leaves_only_the_weights_rule(smollm2_path: Path) -> None:
    # The project's build (flash_attn_small_batch.patch) takes every batch through the tiled
    # kernel: any split into batches of two or more tokens gives the same bits, small batches
    # and past 512 cells included; SmolLM2's Q8_0 output matrix still multiplies one row
    # differently ("multi").
    if not cpu_kernels.detect().fa_small_tiles:
        pytest.skip("this llama.cpp build has upstream's flash attention kernels")
    with Model(smollm2_path, FLASH_MAPPED) as m:
        assert m.split_rule == "multi"
        tokens = m.tokenize("The lighthouse keeper wrote in his log every night. " * 120)[:1100]
        canonical = _evaluate(m, tokens, list(plan(len(tokens), 0, 512, "multi").sizes))
        for sizes in ([500, 500, 100], [512, 512, 70, 6], [300, 300, 300, 198, 2]):
            assert _evaluate(m, tokens, sizes) == canonical, sizes
        short = tokens[:50]
        whole = _evaluate(m, short, [50])
        assert _evaluate(m, short, [25, 25]) == _evaluate(m, short, [48, 2]) == whole


def test_a_greedy_follow_up_with_flash_attention_reuses_the_history_and_repeats(
    smollm2_path: Path,
) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=24)
    notes = "The keeper trims the wick at dusk and winds the clockwork. " * 10
    chat = [{"role": "user", "content": f"My notes: {notes}What does the keeper do?"}]
    with Model(smollm2_path, FLASH_MAPPED) as m:
        first = m.generate(chat, greedy).consume()
        follow = [
            *chat,
            {"role": "assistant", "content": first},
            {"role": "user", "content": "And at dawn?"},
        ]
        n_follow = len(m.chat_tokens(follow))
        reply = m.generate(follow, greedy)
        text = reply.consume()
        # The history stays cached, where identical batches would re-read it all. Upstream's
        # kernels read the last 64 tokens (the reply, decoded one by one, and the new turn)
        # again; with the project's small tiles ("multi") the whole first prompt is kept and
        # only the reply (its tokens were decoded alone) and the new turn are read.
        if m.split_rule == "tiled":
            assert reply.stats.cached_tokens == n_follow - 64 > len(m.chat_tokens(chat)) // 2
        else:
            assert m.split_rule == "multi"
            assert reply.stats.cached_tokens == len(m.chat_tokens(chat)) < n_follow
        m.reset_cache()
        assert m.generate(follow, greedy).consume() == text
