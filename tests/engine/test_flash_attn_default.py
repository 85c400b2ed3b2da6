"""What `--flash-attn auto` resolves to, both sides of every switch forced on any machine: a
CPU-only build, a GPU build, and a build that is asked (gpu=None); f16 and quantized V caches.
The CPU default is decided by benchmarks/flash_attn_default.py and
benchmarks/serving_defaults.py (docs/benchmarks.md, "Flash attention on the CPU")."""

from __future__ import annotations

import pytest

from engine.native import llama_lib
from engine.settings import resolve_flash_attn


def test_cpu_only_default_is_on_with_an_f16_cache() -> None:
    # Measured (docs/benchmarks.md): it reads and decodes as fast or faster at every length
    # and serves 1.2x the tokens/s; reproducible prompts keep their reuse ("tiled" batches).
    assert resolve_flash_attn("auto", "f16", gpu=False) == "on"
    assert resolve_flash_attn("auto", "bf16", gpu=False) == "on"


def test_cpu_only_default_is_off_where_the_kernel_goes_element_by_element() -> None:
    # Measured on an AMX Xeon (docs/benchmarks.md): SmolLM2's 64-wide heads under AVX512-FP16's
    # 128-element f16 step decode at a third of the speed with it at depth.
    assert resolve_flash_attn("auto", "f16", gpu=False, scalar_kernel=True) == "off"
    assert resolve_flash_attn("auto", "f16", gpu=True, scalar_kernel=True) == "auto"
    assert resolve_flash_attn("auto", "q8_0", gpu=False, scalar_kernel=True) == "on"
    assert resolve_flash_attn("on", "f16", gpu=False, scalar_kernel=True) == "on"


def test_cpu_only_default_follows_the_context_per_sequence_under_a_limit() -> None:
    # Measured on an AMX Xeon with 64-wide steps (docs/benchmarks.md): a SmolLM2 context is
    # faster with it up to 4,096 cells a sequence, slower past them.
    def auto(ctx_per_seq: int, *, limit: int | None = 4096, type_v: str = "f16") -> str:
        return resolve_flash_attn(
            "auto", type_v, gpu=False, ctx_limit=limit, ctx_per_seq=ctx_per_seq
        )

    assert auto(768) == auto(4096) == "on"
    assert auto(4097) == auto(8192) == "off"
    assert auto(0) == "off"  # the model's own context: not known to be short
    assert auto(8192, limit=None) == auto(0, limit=None) == "on"
    assert auto(8192, type_v="q8_0") == "on"  # a quantized V cache still needs it
    assert resolve_flash_attn("off", "f16", gpu=False, ctx_limit=4096, ctx_per_seq=512) == "off"
    assert resolve_flash_attn("on", "f16", gpu=False, ctx_limit=4096, ctx_per_seq=8192) == "on"
    assert resolve_flash_attn("auto", "f16", gpu=True, ctx_limit=4096, ctx_per_seq=8192) == "auto"


def test_gpu_keeps_llama_cpp_choice() -> None:
    assert resolve_flash_attn("auto", "f16", gpu=True) == "auto"


@pytest.mark.parametrize("gpu", [False, True])
def test_quantized_v_cache_needs_it(gpu: bool) -> None:
    assert resolve_flash_attn("auto", "q8_0", gpu=gpu) == "on"
    assert resolve_flash_attn("auto", "q4_0", gpu=gpu) == "on"


@pytest.mark.parametrize("offload", [False, True])
def test_unsaid_gpu_asks_the_build(monkeypatch: pytest.MonkeyPatch, offload: bool) -> None:
    monkeypatch.setattr(llama_lib, "supports_gpu_offload", lambda: offload)
    assert resolve_flash_attn("auto", "f16") == ("auto" if offload else "on")


def test_an_explicit_choice_stands() -> None:
    for choice in ("on", "off"):
        assert resolve_flash_attn(choice, "f16", gpu=False) == choice
        assert resolve_flash_attn(choice, "f16", gpu=True) == choice
        assert resolve_flash_attn(choice, "q8_0", gpu=False) == choice
