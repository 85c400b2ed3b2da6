"""After a real load: what llama.cpp allocated, and how it compares with the estimate."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from engine.memory.buffer_log import BUFFER_KIND, BUFFER_LINE, device_of, mib
from engine.memory.result import MemoryEstimate, gb


@dataclass(frozen=True)
class ActualMemory:
    """What llama.cpp reported it allocated during a real load, and how the process grew."""

    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    devices: dict[str, int]
    rss_growth_bytes: int | None = None

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["total_bytes"] = self.total_bytes
        return d


def actual_from_log(lines: Iterable[str], rss_growth_bytes: int | None = None) -> ActualMemory:
    """Sum the buffer sizes llama.cpp logs while it loads a model and creates a context."""
    kinds = {"weights": 0, "kv": 0, "compute": 0, "output": 0}
    devices: dict[str, int] = {}
    for line in lines:
        b = BUFFER_LINE.search(line)
        if not b:
            continue
        n = mib(b.group(3))
        kinds[BUFFER_KIND[b.group(2)]] += n
        dev = device_of(b.group(1))
        devices[dev] = devices.get(dev, 0) + n
    return ActualMemory(
        kinds["weights"], kinds["kv"], kinds["compute"], kinds["output"], devices, rss_growth_bytes
    )


def compare(est: MemoryEstimate, actual: ActualMemory) -> str:
    """'estimated 812 MiB, actual 820 MiB (-1.0%)' for the UI."""
    if not actual.total_bytes:
        return f"estimated {gb(est.total_bytes)}, actual unknown"
    err = (est.total_bytes - actual.total_bytes) / actual.total_bytes * 100
    return f"estimated {gb(est.total_bytes)}, actual {gb(actual.total_bytes)} ({err:+.1f}%)"
