"""What an estimate answers: bytes per device, the GPU layers, and a verdict in words."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from engine.errors import EngineError
from engine.memory.hardware import CPU, GiB, MiB
from engine.memory.params import EstimateParams

Method = Literal["dry-run", "analytic"]
Verdict = Literal["fits_gpu", "partial_offload", "ram_only", "does_not_fit"]
VERDICT_TEXT: dict[Verdict, str] = {
    "fits_gpu": "fits on GPU",
    "partial_offload": "fits with partial offload",
    "ram_only": "fits in RAM only",
    "does_not_fit": "does not fit",
}


class DoesNotFitError(EngineError):
    """The estimate says the model does not fit; `str()` is the reason in words."""


@dataclass(frozen=True)
class DeviceUse:
    name: str
    kind: str  # cpu | gpu | igpu
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int
    layers: int  # repeating layers + output layer placed here
    free_bytes: int | None = None
    margin_bytes: int = 0
    simulated: bool = False

    @property
    def bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes

    @property
    def required_bytes(self) -> int:
        return self.bytes + self.overhead_bytes + self.margin_bytes

    @property
    def fits(self) -> bool:
        return self.free_bytes is None or self.required_bytes <= self.free_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bytes"] = self.bytes
        d["required_bytes"] = self.required_bytes
        d["fits"] = self.fits
        return d


@dataclass(frozen=True)
class MemoryEstimate:
    model: str
    method: Method
    params: EstimateParams
    n_ctx: int  # after padding
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int
    devices: tuple[DeviceUse, ...]
    gpu_layers: int
    n_layers: int  # offloadable layers: repeating layers + the output layer
    verdict: Verdict
    reason: str
    notes: tuple[str, ...] = ()
    max_ctx_fit: int | None = None  # largest context that fits, when the asked one does not

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes

    @property
    def fits(self) -> bool:
        return self.verdict != "does_not_fit"

    @property
    def prompt_cache_bytes(self) -> int:
        """The RAM prompt cache's budget: part of the CPU's `overhead_bytes` (the fit check
        counts it), never of `total_bytes` (llama.cpp does not allocate it)."""
        return self.params.prompt_cache_bytes

    @property
    def gpu_runtime_bytes(self) -> int:
        """The GPU driver contexts' share of `overhead_bytes` (every used GPU's)."""
        return sum(d.overhead_bytes for d in self.devices if d.name != CPU)

    @property
    def ram_bytes(self) -> int:
        return sum(d.bytes for d in self.devices if d.name == CPU)

    @property
    def vram_bytes(self) -> int:
        return sum(d.bytes for d in self.devices if d.name != CPU)

    def device(self, name: str) -> DeviceUse | None:
        return next((d for d in self.devices if d.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "method": self.method,
            "n_ctx": self.n_ctx,
            "weights_bytes": self.weights_bytes,
            "kv_bytes": self.kv_bytes,
            "compute_bytes": self.compute_bytes,
            "output_bytes": self.output_bytes,
            "overhead_bytes": self.overhead_bytes,
            "prompt_cache_bytes": self.prompt_cache_bytes,
            "gpu_runtime_bytes": self.gpu_runtime_bytes,
            "total_bytes": self.total_bytes,
            "devices": [d.to_dict() for d in self.devices],
            "gpu_layers": self.gpu_layers,
            "n_layers": self.n_layers,
            "verdict": self.verdict,
            "verdict_text": VERDICT_TEXT[self.verdict],
            "reason": self.reason,
            "max_ctx_fit": self.max_ctx_fit,
            "notes": list(self.notes),
            "params": self.params.to_dict(),
        }

    def check(self) -> None:
        """Raise `DoesNotFitError` with the reason when the model does not fit."""
        if not self.fits:
            raise DoesNotFitError(self.reason)


def gb(n: float) -> str:
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.0f} MiB"
