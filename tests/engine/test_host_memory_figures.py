"""The model host's two memory figures for a loaded model, on fake models (no llama.cpp): it
plans with llama.cpp's buffers plus the prompt cache's whole budget (the cache grows to it while
the model stays), and shows clients the buffers plus the cache's bytes in use."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from engine.host.budget import MemoryBudget, Need, actual_memory, reserved_memory
from engine.host.host import Loadable, ModelHost
from engine.host.runtime import Model
from engine.settings import LoadParams
from tests.fake_backend import FakeLoopModel

MiB = 1 << 20
ALLOCATED = 30 * MiB  # llama.cpp's buffers of each fake model
CACHE = 40 * MiB  # each one's prompt cache budget


def _fake(cache_bytes: int) -> FakeLoopModel:
    m = FakeLoopModel(state_cache_bytes=cache_bytes)
    m.memory_actual = replace(m.memory_actual, devices={"CPU": ALLOCATED})
    return m


def test_reserved_is_the_budget_actual_is_the_use() -> None:
    m = _fake(CACHE)
    assert m.state_cache is not None
    m.state_cache.put((1, 2, 3), b"x" * 5000)
    model = cast(Model, m)
    assert reserved_memory(model) == {"CPU": ALLOCATED + CACHE}
    assert actual_memory(model) == {"CPU": ALLOCATED + 5000}
    off = cast(Model, _fake(0))
    assert reserved_memory(off) == actual_memory(off) == {"CPU": ALLOCATED}


@pytest.fixture
def host(tmp_path: Path) -> Iterator[ModelHost]:
    specs = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(b"GGUF")
        specs.append(Loadable(name, path, LoadParams(state_cache_mb=CACHE // MiB)))

    def estimator(spec: Loadable) -> Need:
        # As engine.memory's estimate counts it: the buffers, the cache's budget as overhead.
        return Need({"CPU": ALLOCATED + (spec.params.state_cache_mb << 20)})

    def loader(spec: Loadable) -> Model:
        return cast(Model, _fake(spec.params.state_cache_mb << 20))

    # Room for two models' buffers and one cache budget: not for two models with theirs.
    h = ModelHost(
        lambda: specs,
        MemoryBudget({"CPU": 2 * ALLOCATED + CACHE}),
        estimator=estimator,
        loader=loader,
    )
    yield h
    h.close()


def test_the_host_makes_room_for_the_budget_not_the_current_use(host: ModelHost) -> None:
    host.acquire("a").release()
    [a] = host.hosted()
    assert a.memory == {"CPU": ALLOCATED}  # nothing saved yet: that is what it takes now
    assert host.used() == {"CPU": ALLOCATED + CACHE}
    # Its cache is empty, but may fill: "b" cannot load beside it, so idle "a" makes room.
    host.acquire("b").release()
    assert [h.name for h in host.hosted()] == ["b"]
