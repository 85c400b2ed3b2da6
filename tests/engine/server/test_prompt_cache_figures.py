"""The RAM prompt cache in the server's memory figures, over a fake model (no llama.cpp): what
/metrics, /api/ps and /health report (the cache's bytes in use) and what the host plans with
(its whole budget)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.host.prompt_cache import PromptStateCache
from engine.server import ServerThread
from tests.engine.server.conftest import API_KEY, http, make_config
from tests.fake_server_engine import FakeModel, fake_model, serve_fake

AUTH = {"Authorization": f"Bearer {API_KEY}"}
BUDGET = 1 << 20
ALLOCATED = 7 << 20  # what llama.cpp would have allocated: the figures add the cache to it


@pytest.fixture
def cached(tmp_path: Path) -> Iterator[tuple[FakeModel, ServerThread]]:
    with fake_model(tmp_path) as model:
        model.state_cache = PromptStateCache(BUDGET)
        model.memory_actual = replace(model.memory_actual, devices={"CPU": ALLOCATED})
        with serve_fake(model, make_config(model_id="fake")) as srv:
            yield model, srv


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_the_cache_is_reported_as_used_and_planned_as_its_budget(
    cached: tuple[FakeModel, ServerThread],
) -> None:
    model, srv = cached
    cache = model.state_cache
    assert cache is not None
    a, b = tuple(range(100, 140)), tuple(range(200, 240))

    def keep() -> None:  # what the loop does when slots are reused, on its own thread
        cache.put(a, b"A" * 1000)
        cache.put(b, b"B" * 3000)
        assert cache.get(a) is not None

    model.loop.call_idle(keep)
    used = cache.bytes_used
    assert used == 4000 and len(cache) == 2

    m = _samples(http.get(srv.url + "/metrics", headers=AUTH).text)
    assert m[("candlewick_prompt_cache_bytes", ())] == used
    assert m[("candlewick_prompt_cache_budget_bytes", ())] == BUDGET
    assert m[("candlewick_prompt_cache_entries", ())] == len(cache)
    assert m[("candlewick_prompt_cache_saves_total", ())] == 2
    assert m[("candlewick_prompt_cache_restores_total", ())] == 1
    assert m[("candlewick_prompt_cache_evictions_total", ())] == 0
    # "Bytes in memory": llama.cpp's buffers plus the saved states now.
    allocated = ALLOCATED
    key = ("candlewick_model_memory_bytes", (("device", "CPU"), ("model", "fake")))
    assert m[key] == allocated + used
    [ps] = http.get(srv.url + "/api/ps", headers=AUTH).json()["models"]
    assert (ps["size"], ps["size_vram"]) == (allocated + used, 0)
    [health] = http.get(srv.url + "/health").json()["models"]
    assert health["memory_bytes"] == {"CPU": allocated + used}
    # The host plans with the whole budget: the cache may grow to it while the model stays.
    assert srv.state.host.used() == {"CPU": allocated + BUDGET}


def test_without_a_cache_the_figures_are_zero(tmp_path: Path) -> None:
    with fake_model(tmp_path) as model, serve_fake(model, make_config(model_id="fake")) as srv:
        assert model.state_cache is None
        m = _samples(http.get(srv.url + "/metrics", headers=AUTH).text)
        for name in ("bytes", "budget_bytes", "entries", "saves_total", "restores_total"):
            assert m[(f"candlewick_prompt_cache_{name}", ())] == 0, name
        assert srv.state.host.used() == {"CPU": model.memory_actual.devices["CPU"]}
