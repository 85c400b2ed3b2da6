"""Prompt batching that keeps logits reproducible (engine.host.batch_plan, cpu_kernels.split_rule),
and on the real SmolLM2: the splits the rule calls equivalent give bit-identical logits."""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

import pytest

from engine.host.batch_plan import BatchPlan, plan
from engine.host.runtime import Model
from engine.memory.cpu_kernels import CpuFeatures, split_rule
from engine.settings import LoadParams
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
    assert load(epyc, types=("Q4_1", "Q8_0"), flash_attn=True) == "grid"  # tiled / split KV
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


def test_splits_the_rule_allows_give_bit_identical_logits(smollm2_path: Path) -> None:
    with Model(smollm2_path, LoadParams(n_ctx=1024, state_cache_mb=0)) as m:
        tokens = m.tokenize("The lighthouse keeper wrote in his log every night. " * 30)[:300]
        n = len(tokens)
        canonical = _evaluate(m, tokens, [n])
        if m.split_rule == "grid":
            pytest.skip("only identical batches are equivalent with these kernels")
        # As a follow-up turn batches it (cached prefix, then the rest), as regenerating
        # does (all but the last two), and in small batches: all are the same bits.
        for sizes in ([200, n - 200], [n - 2, 2], [64, 64, 64, 64, n - 256]):
            assert _evaluate(m, tokens, sizes) == canonical, sizes
