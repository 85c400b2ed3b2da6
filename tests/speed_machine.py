"""A simulated machine for the speed probe's tests: a decode timer whose step time is known
exactly, so a test checks that the probe recovers the figures it was built with."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from engine.bench.speed_model import DecodeCost
from engine.bench.speed_probe import ProbeSettings
from engine.memory import cpu_kernels
from engine.model.gguf import read_gguf
from engine.settings import LoadParams


class SimulatedDecoder:
    """A decode timer for a simulated machine: a step is the fixed work plus each product's
    bytes at its kernel's rate (what the probe must recover). `rates` by weight type, or by
    kernel key where a key (a width class) has its own."""

    def __init__(
        self,
        per_layer: float,
        per_token: float,
        rates: dict[str, float],
        per_vocab: float = 0.0,
    ) -> None:
        self.per_layer, self.per_token, self.rates = per_layer, per_token, rates
        self.per_vocab = per_vocab  # sampling at the chat's defaults, per vocabulary entry
        self.calls: list[str] = []
        self.chat_calls: list[str] = []

    def __call__(self, path: Path, params: LoadParams) -> float:
        """A greedy step (the fixed work and the kernels)."""
        self.calls.append(path.name)
        return self._step(path, params)[0]

    def chat(self, path: Path, params: LoadParams) -> tuple[float, float]:
        """(greedy, chat-default) steps: the greedy step, and it plus its sampling."""
        self.chat_calls.append(path.name)
        step, cost = self._step(path, params)
        return step, step + cost.n_vocab * self.per_vocab

    def _step(self, path: Path, params: LoadParams) -> tuple[float, DecodeCost]:
        gf = read_gguf(path)
        c = DecodeCost.of(
            gf,
            features=cpu_kernels.detect(),
            extra_buffers=params.extra_buffers is not False,
        )
        work = sum(n / self._rate(k) for k, n in c.matmul_bytes.items())
        return self.per_token + c.n_layer * self.per_layer + work, c

    def _rate(self, key: str) -> float:
        """A kernel key's rate on this machine: its own ("Q4_1/generic@576x1536"), else its
        weight type's ("Q4_1")."""
        return self.rates.get(key) or self.rates.get(key.split("/")[0], 1e12)


def sim_settings() -> ProbeSettings:
    """The probe's settings with a small sampling vocabulary and small kernel probes: a
    262,144-token or 96 MiB probe model takes seconds to write and read, and a simulated
    machine's arithmetic is the same."""
    return replace(
        ProbeSettings.default(), sampling_vocab=4096, rate_bytes=8 << 20, layer_rate_bytes=8 << 20
    )


def QUIET() -> float:
    """Other programs' load per core on the simulated machine: none."""
    return 0.0
