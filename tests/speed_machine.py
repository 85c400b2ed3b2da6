"""A simulated machine for the speed probe's tests: a decode timer whose step time is known
exactly, so a test checks that the probe recovers the figures it was built with."""

from __future__ import annotations

from pathlib import Path

from engine.bench.speed_model import DecodeCost
from engine.memory import cpu_kernels
from engine.model.gguf import read_gguf
from engine.settings import LoadParams


class SimulatedDecoder:
    """A decode timer for a simulated machine: a step is the fixed work plus each product's
    bytes at its kernel's rate (what the probe must recover)."""

    def __init__(self, per_layer: float, per_token: float, rates: dict[str, float]) -> None:
        self.per_layer, self.per_token, self.rates = per_layer, per_token, rates
        self.calls: list[str] = []

    def __call__(self, path: Path, params: LoadParams) -> float:
        self.calls.append(path.name)
        gf = read_gguf(path)
        c = DecodeCost.of(
            gf,
            features=cpu_kernels.detect(),
            extra_buffers=params.extra_buffers is not False,
        )
        work = sum(n / self.rates.get(k.split("/")[0], 1e12) for k, n in c.matmul_bytes.items())
        return self.per_token + c.n_layer * self.per_layer + work


def QUIET() -> float:
    """Other programs' load per core on the simulated machine: none."""
    return 0.0
