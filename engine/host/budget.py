"""What the host may load: a memory budget per device, what a load needs (the estimate,
kept per file and settings) and why a load does not fit."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError
from engine.host.prompt_cache import PromptStateCache
from engine.host.runtime import Model
from engine.memory.hardware import CPU, GiB, MiB
from engine.settings import LoadParams


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes the host may use per device ("CPU" for RAM, "CUDA0", ...). A device not named
    has no budget of its own: there the estimate's check against free memory decides."""

    devices: Mapping[str, int]

    def __post_init__(self) -> None:
        for name, n in self.devices.items():
            if n < 0:
                raise EngineError(f"the memory budget for {name} must not be negative")


@dataclass(frozen=True)
class Need:
    """What a load needs (bytes per device) and, when it does not fit the machine's free
    memory as things are, why not."""

    devices: Mapping[str, int]
    short: str | None = None


class Planner:
    """Plans loads within `budget` (None: the machine's free memory, as the estimate reads
    it)."""

    def __init__(self, budget: MemoryBudget | None) -> None:
        self.budget = budget
        self._needs: dict[tuple[str, int, int, LoadParams], Need] = {}

    def need(self, path: Path, params: LoadParams, estimate: Callable[[], Need]) -> Need:
        """What loading `path` with `params` needs (`estimate` runs the estimate). Within a
        budget that covers every device it uses, only its sizes count, and those are kept per
        file and settings: a swap back to a model does not pay for its dry run again (a
        second for Gemma-3-270M). Without one, the check against free memory is made afresh
        each time."""
        try:
            st = path.stat()
        except OSError:
            return estimate()
        key = (str(path), st.st_size, st.st_mtime_ns, params)
        cached = self._needs.get(key)
        if (
            cached is not None
            and self.budget is not None
            and all(d in self.budget.devices for d in cached.devices)
        ):
            return cached
        need = estimate()
        self._needs[key] = need
        return need

    def shortfall(self, need: Need, others: Iterable[Mapping[str, int]]) -> str | None:
        """Why `need` does not fit beside `others` (the memory of the other models, per
        device); None if it does."""
        if self.budget is not None:
            taken = list(others)
            for dev, limit in self.budget.devices.items():
                want = need.devices.get(dev, 0)
                used = sum(m.get(dev, 0) for m in taken)
                if want and used + want > limit:
                    return (
                        f"needs {_gib(want)} of {_device(dev)}; {_gib(max(limit - used, 0))} "
                        f"free of the {_gib(limit)} budget"
                    )
            if all(d in self.budget.devices for d in need.devices):
                return None
        return None if need.short is None else f"does not fit: {need.short}"


# Two figures per loaded model, because its RAM prompt cache (saved KV states, outside
# llama.cpp's buffers) grows and shrinks while it is loaded:
# - `reserved_memory` is what the host PLANS with: the buffers plus the cache's whole budget,
#   so a model loaded beside it cannot take RAM the cache will grow into (the estimate's fit
#   check counts the same budget before the load);
# - `actual_memory` is what is REPORTED ("bytes in memory": /api/ps `size`, /health,
#   candlewick_model_memory_bytes, the Loaded models window): the buffers plus the cache's
#   current bytes.


def actual_memory(model: Model) -> dict[str, int]:
    """What `model` takes now, per device: what llama.cpp really allocated, plus its prompt
    cache's saved states in RAM ("CPU"). Empty when the allocation is unknown."""
    return _with_cache(model, lambda cache: cache.bytes_used)


def reserved_memory(model: Model) -> dict[str, int]:
    """What the host counts `model` as taking, per device: what llama.cpp allocated, plus the
    whole budget its prompt cache may grow to in RAM. Empty when the allocation is unknown."""
    return _with_cache(model, lambda cache: cache.max_bytes)


def _with_cache(model: Model, figure: Callable[[PromptStateCache], int]) -> dict[str, int]:
    actual = getattr(model, "memory_actual", None)
    if actual is None:
        return {}
    out = dict(actual.devices)
    cache: PromptStateCache | None = getattr(model, "state_cache", None)
    if cache is not None:
        out[CPU] = out.get(CPU, 0) + figure(cache)
    return out


def total_memory(memories: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Bytes per device, summed over models."""
    out: dict[str, int] = {}
    for memory in memories:
        for dev, n in memory.items():
            out[dev] = out.get(dev, 0) + n
    return out


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


def _device(name: str) -> str:
    return "RAM" if name == CPU else f"{name} memory"


__all__ = [
    "MemoryBudget",
    "Need",
    "Planner",
    "actual_memory",
    "reserved_memory",
    "total_memory",
]
