"""The load settings a memory estimate sizes, and the memory it keeps free."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from engine.errors import EngineError
from engine.memory.hardware import GiB, MiB
from engine.settings import LoadParams

# The load settings that change memory use, in the order `to_dict` has always written them.
SIZED = (
    "n_ctx",
    "n_gpu_layers",
    "type_k",
    "type_v",
    "flash_attn",
    "n_seq_max",
    "n_batch",
    "n_ubatch",
    "embeddings",
)


@dataclass(frozen=True)
class EstimateParams:
    """A load's settings (`load`), plus what llama.cpp's context takes that a load never
    changes (the estimate can ask "what if") and the fit's margin."""

    load: LoadParams = field(default_factory=LoadParams)
    swa_full: bool = True  # this llama.cpp's default: sliding-window layers cache the full context
    kv_unified: bool = False
    margin_bytes: int | None = None  # kept free on every device; None = default_margin()

    @property
    def prompt_cache_bytes(self) -> int:
        """RAM the loaded model's prompt cache may grow to (`LoadParams.state_cache_mb`): saved
        KV states live in the process's memory, not in any llama.cpp buffer."""
        return max(self.load.state_cache_mb, 0) << 20

    def with_load(self, **changes: Any) -> EstimateParams:
        """The same estimate with some load settings changed."""
        return replace(self, load=replace(self.load, **changes))

    def validate(self) -> None:
        self.load.validate()
        if self.margin_bytes is not None and self.margin_bytes < 0:
            raise EngineError("the safety margin cannot be negative")

    def to_dict(self) -> dict[str, Any]:
        load = asdict(self.load)
        return {
            **{k: load[k] for k in SIZED},
            "swa_full": self.swa_full,
            "kv_unified": self.kv_unified,
            "extra_buffers": self.load.extra_buffers,
            "state_cache_mb": self.load.state_cache_mb,
            "margin_bytes": self.margin_bytes,
        }


def default_margin(total_bytes: int) -> int:
    """Memory kept free on a device: 5% of it, at least 64 MiB and at most 1 GiB."""
    return int(min(max(total_bytes * 0.05, 64 * MiB), GiB))
