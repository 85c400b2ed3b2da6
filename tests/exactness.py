"""Comparing greedy output across batching paths, only where the engine guarantees it.

`Model.exactness` (engine.memory.cpu_kernels) says whether a token's logits are the same decoded
alone and inside any batch, for the loaded file, its settings and this build's CPU kernels.
Tests that compare text across paths (scheduler vs `run`, lookup vs plain, a moved or reused
KV sequence) load the batch-invariant twin of SmolLM2 (`exact_smollm2_path`) with
`exact_load()`, and compare through `assert_same_greedy`: identical where the guarantee covers
the comparison, and otherwise only what holds on every CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.memory.cpu_kernels import Exactness
from engine.settings import LoadParams


def exact_load(**kw: Any) -> LoadParams:
    """Settings under which the guarantee can hold: flash attention on, no extra buffers
    (no AMX or repacked weights)."""
    return LoadParams(**{"extra_buffers": False, "flash_attn": "on", **kw})


def assert_same_greedy(
    exactness: Exactness,
    got: str | Sequence[int],
    want: str | Sequence[int],
    *,
    positions: int,
    batch: int,
) -> None:
    """`got` equals `want` where `exactness` covers sequences of `positions` cached tokens
    decoded in batches of up to `batch` tokens. Elsewhere kernels may round a batch and one
    token differently and greedy text may take another branch at a near-tie: both must then
    still be non-empty answers of the same kind."""
    if exactness.covers(positions, batch):
        assert got == want
        return
    assert len(got) > 0 and len(want) > 0
    assert type(got) is type(want)
