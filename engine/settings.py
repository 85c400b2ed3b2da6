"""What a user chooses for a load, a reply and speculation, and how 'auto' is resolved.

Plain data with validation, shared by every layer: the memory planner sizes a `LoadParams`,
the host loads with it, the server and the app build them from what a user asked for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from engine.errors import EngineError
from engine.native import llama_lib

FlashAttn = Literal["on", "off", "auto"]
GpuLayers = int | Literal["auto", "all"]
KV_TYPES: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "bf16": 30,
}
# llama_flash_attn_type values
FLASH_TYPES: dict[str, int] = {"auto": -1, "off": 0, "on": 1}

SpecMode = Literal["off", "lookup", "draft"]
# Prompt lookup sets its own draft length from its match and the verification cost
# (PromptLookup.draft_len); this only caps it, at a verification batch of 8 tokens: up to 8 keep
# a graph of their own (installers/llama_cpp/graph_lanes.patch) and take one pass of the column
# kernels, while a longer one rebuilds the main graph before and after it (on a 2-core EPYC 17
# tokens cost 5.7 one-token decodes, 8 tokens 2.4). A draft model drafts up to 5, adapted by
# the loop: with llama.cpp's generic CPU kernels every verified position costs ~0.4 of a decode
# (COST_CPU), so long drafts only pay when nearly all of them is accepted.
DEFAULT_DRAFT_MAX = 7


def default_threads() -> int:
    """Physical cores: llama.cpp decode is memory-bound and hyper-threads only add contention."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:
        n = None
    return max(1, n or os.cpu_count() or 1)


@dataclass(frozen=True)
class LoadParams:
    n_ctx: int = 4096
    n_gpu_layers: GpuLayers = "auto"
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_batch: int = 512
    n_ubatch: int = 512
    flash_attn: FlashAttn = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    n_seq_max: int = 1
    use_mmap: bool = True
    embeddings: bool = False
    # CPU "extra buffer" types (weight repacking, AMX). None = auto: on, except on an AMX build
    # without the fix header, whose kernels crash on multi-token batches (use_extra_buffers).
    extra_buffers: bool | None = None
    # RAM budget for KV snapshots of recently left conversations (0 disables it).
    state_cache_mb: int = 256
    # Decode on fewer threads while other programs hold the cores (engine.native.thread_tuner).
    adapt_threads: bool = True
    # Speculative decoding for every generation of this model (a draft model is loaded and
    # checked with it); None or mode "off": plain decoding.
    speculative: SpeculativeSettings | None = None
    # The multimodal projector (an mmproj GGUF) that lets this model read images or audio.
    mmproj: str | None = None
    # LoRA adapters (GGUF) loaded with the model: (path, scale at load), in id order.
    loras: tuple[tuple[str, float], ...] = ()

    @property
    def drafting(self) -> bool:
        return self.speculative is not None and self.speculative.mode != "off"

    def validate(self) -> None:
        if self.n_ctx < 16:
            raise EngineError(f"context length {self.n_ctx} is too small (minimum 16)")
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_TYPES:
                raise EngineError(
                    f"unknown KV cache type {getattr(self, name)!r} "
                    f"(choose from {', '.join(KV_TYPES)})"
                )
        if self.type_v not in ("f16", "f32", "bf16") and self.flash_attn == "off":
            raise EngineError("a quantized V cache needs flash attention (--flash-attn on/auto)")
        if self.flash_attn not in FLASH_TYPES:
            raise EngineError(f"flash attention must be on, off or auto, not {self.flash_attn!r}")
        if isinstance(self.n_gpu_layers, int) and self.n_gpu_layers < 0:
            raise EngineError("GPU layers must be 0 or more, 'auto' or 'all'")
        if self.n_batch < 1 or self.n_ubatch < 1 or self.n_seq_max < 1:
            raise EngineError("batch sizes and parallel sequences must be at least 1")
        if self.state_cache_mb < 0:
            raise EngineError("the prompt cache's RAM must be 0 MiB (off) or more")
        if self.speculative is not None:
            self.speculative.validate()


@dataclass(frozen=True)
class SamplingParams:
    # The defaults the local-LLM tools agree on: temperature 0.8, top-k 40 and a repeat window
    # of 64 tokens are llama.cpp's (common_params_sampling), Ollama's (api.DefaultOptions) and
    # LM Studio's; top-p 0.95 and min-p 0.05 are llama.cpp's and LM Studio's (Ollama: 0.9, 0);
    # repeat penalty 1.1 is Ollama's and LM Studio's (llama.cpp turned it off, 1.0, in 2024).
    # Without it small models loop: 2 of 3 SmolLM2 stories did at 1.0.
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    repeat_last_n: int = 64
    # OpenAI's additive penalties over the same window (llama.cpp's penalties sampler).
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    # What the reply must match: a compiled llguidance grammar (engine.decoding.constraints),
    # None for free text.
    grammar: str | None = None
    # Write control tokens' text into the reply: tool-call markers such as Mistral's
    # `[TOOL_CALLS]` and Llama's `<|python_tag|>` are control tokens, and their parsers
    # look for them.
    special_text: bool = False

    @property
    def penalizes(self) -> bool:
        """Whether recent tokens change the logits (the penalties sampler is in the chain)."""
        return (
            self.repeat_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

    @property
    def reproducible(self) -> bool:
        """Whether the same prompt must give the same reply: greedy, or a fixed seed."""
        return self.temperature <= 0 or self.seed is not None

    def validate(self) -> None:
        if self.temperature < 0:
            raise EngineError("temperature must be 0 or more")
        if not 0 < self.top_p <= 1:
            raise EngineError("top_p must be in (0, 1]")
        if not 0 <= self.min_p <= 1:
            raise EngineError("min_p must be in [0, 1]")
        if self.repeat_penalty <= 0:
            raise EngineError("repeat_penalty must be greater than 0")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise EngineError(f"{name} must be between -2 and 2")
        if self.max_tokens < 1:
            raise EngineError("max_tokens must be at least 1")


@dataclass(frozen=True)
class SpeculativeSettings:
    """What the app, the CLI and the server let a user choose; stored per model."""

    mode: SpecMode = "off"
    draft_model: str | None = None  # path of the draft GGUF when mode == "draft"
    draft_max: int | None = None  # None = the mode's default

    def validate(self) -> None:
        if self.mode not in ("off", "lookup", "draft"):
            raise EngineError(f"speculative mode must be off, lookup or draft, not {self.mode!r}")
        if self.mode == "draft" and not self.draft_model:
            raise EngineError("draft mode needs a draft model")
        if self.draft_max is not None and not 1 <= self.draft_max <= 64:
            raise EngineError("the draft length must be between 1 and 64")


def resolve_flash_attn(
    requested: FlashAttn,
    type_v: str,
    *,
    gpu: bool | None = None,
    scalar_kernel: bool = False,
    ctx_limit: int | None = None,
    ctx_per_seq: int = 0,
) -> FlashAttn:
    """What 'auto' means here. A quantized V cache needs flash attention. With a GPU,
    llama.cpp's own choice stands. On a CPU-only build it is on (benchmarks/flash_attn_default.py
    and benchmarks/serving_defaults.py, SmolLM2, 2 threads, quiet EPYC, docs/benchmarks.md): it
    reads prompts 1.03-1.10x faster, decodes 1.00-1.07x at ~100 to ~7,600 tokens of history and
    serves 1.2x the tokens/s; what it costs is a chat's follow-up turn at depth (a small batch
    over a long cache goes row by row: 1.3-1.5x its time to first token), except with the
    project's build, whose small batches take the tiled kernel (the follow-up is 1.0-1.3x
    faster with it there, on an AMX Xeon). Reproducible prompts
    keep their reuse (cpu_kernels.split_rule: batches of 64+ tokens agree with upstream's kernels,
    any batches of two or more with the project's small tiles).
    Speculative decoding wants it too (docs/speculative.md). It is off where this CPU's kernel
    would go element by element over the model's heads (`scalar_kernel`:
    cpu_kernels.flash_attn_scalar; an AMX Xeon decodes SmolLM2 at a third of the speed with it
    at depth). It is off too where this CPU's kernel decodes the heads slower past `ctx_limit`
    cached cells (cpu_kernels.flash_attn_ctx_limit) and a sequence may hold more: `ctx_per_seq`,
    n_ctx // n_seq_max, 0 when unknown (the model's own). `gpu` says whether a GPU takes part
    (None: whether this build can offload)."""
    if requested != "auto":
        return requested
    if type_v not in ("f16", "f32", "bf16"):
        return "on"
    if gpu is None:
        gpu = llama_lib.supports_gpu_offload()
    if gpu:
        return "auto"
    if scalar_kernel:
        return "off"
    if ctx_limit is not None and not 0 < ctx_per_seq <= ctx_limit:
        return "off"
    return "on"


def use_extra_buffers(requested: bool | None) -> bool:
    """Whether llama.cpp may put weights in its CPU extra buffers (repacked and AMX layouts).

    On by default; on an AMX build only when its AMX kernels are safe
    (`llama_lib.amx_kernels_safe`), otherwise the first multi-token batch would crash the
    process. Asking for them explicitly on such a build is refused for the same reason.
    """
    if not llama_lib.amx_build() or llama_lib.amx_kernels_safe():
        return True if requested is None else requested
    if requested:
        raise EngineError(
            "this llama.cpp build's AMX kernels crash on multi-token batches; "
            "rebuild it with `make setup GPU=cpu` to use them"
        )
    return False


__all__ = [
    "DEFAULT_DRAFT_MAX",
    "FLASH_TYPES",
    "KV_TYPES",
    "FlashAttn",
    "GpuLayers",
    "LoadParams",
    "SamplingParams",
    "SpecMode",
    "SpeculativeSettings",
    "default_threads",
    "resolve_flash_attn",
    "use_extra_buffers",
]
