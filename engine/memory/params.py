"""The load settings a memory estimate sizes, and the memory it keeps free."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from engine.errors import EngineError
from engine.memory.hardware import GiB, MiB
from engine.settings import FlashAttn, GpuLayers, LoadParams


@dataclass(frozen=True)
class EstimateParams:
    """The load settings that change memory use (a subset of `LoadParams`, plus fit options)."""

    n_ctx: int = 4096
    n_gpu_layers: GpuLayers = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: FlashAttn = "auto"
    n_seq_max: int = 1
    n_batch: int = 512
    n_ubatch: int = 512
    embeddings: bool = False
    swa_full: bool = True  # this llama.cpp's default: sliding-window layers cache the full context
    kv_unified: bool = False
    extra_buffers: bool | None = None
    margin_bytes: int | None = None  # kept free on every device; None = default_margin()

    @classmethod
    def from_load_params(cls, p: LoadParams, **overrides: Any) -> EstimateParams:
        base = cls(
            n_ctx=p.n_ctx,
            n_gpu_layers=p.n_gpu_layers,
            type_k=p.type_k,
            type_v=p.type_v,
            flash_attn=p.flash_attn,
            n_seq_max=p.n_seq_max,
            n_batch=p.n_batch,
            n_ubatch=p.n_ubatch,
            embeddings=p.embeddings,
            extra_buffers=p.extra_buffers,
        )
        return replace(base, **overrides)

    def to_load_params(self, **overrides: Any) -> LoadParams:
        base = LoadParams(
            n_ctx=self.n_ctx,
            n_gpu_layers=self.n_gpu_layers,
            type_k=self.type_k,
            type_v=self.type_v,
            flash_attn=self.flash_attn,
            n_seq_max=self.n_seq_max,
            n_batch=self.n_batch,
            n_ubatch=self.n_ubatch,
            embeddings=self.embeddings,
            extra_buffers=self.extra_buffers,
        )
        return replace(base, **overrides)

    def validate(self) -> None:
        self.to_load_params().validate()
        if self.margin_bytes is not None and self.margin_bytes < 0:
            raise EngineError("the safety margin cannot be negative")


def default_margin(total_bytes: int) -> int:
    """Memory kept free on a device: 5% of it, at least 64 MiB and at most 1 GiB."""
    return int(min(max(total_bytes * 0.05, 64 * MiB), GiB))
