"""The /metrics exposition on its own (no server, no model): names, types, values, isolation."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from engine.host.prompt_cache import PromptStateCache
from engine.host.requests import SchedulerSnapshot
from engine.server.metrics import Metrics

SNAP = SchedulerSnapshot(
    n_slots=4,
    busy_slots=1,
    queue_depth=2,
    kv_used=1024,
    kv_capacity=4096,
    steps=7,
    tokens_generated=0,
    tokens_prompt=0,
    kv_copies=3,
    draft_tokens=12_345_678,
    draft_accepted=5,
)


def _families(text: str) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    return {
        f.name: (f.type, [(s.name, s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(text)
    }


def test_counts_histograms_and_the_snapshot() -> None:
    m = Metrics()
    m.request_done("/v1/chat/completions", 200)
    m.request_done("/v1/chat/completions", 200)
    m.request_done("/v1/chat/completions", 429)
    m.generation_done(prompt=10, cached=4, completion=5, ttft_s=0.3, total_s=1.5)
    text = m.render(SNAP, True)
    fam = _families(text)
    assert fam["candlewick_requests"] == (
        "counter",
        [
            ("candlewick_requests_total", {"route": "/v1/chat/completions", "status": "200"}, 2),
            ("candlewick_requests_total", {"route": "/v1/chat/completions", "status": "429"}, 1),
        ],
    )
    assert fam["candlewick_requests_rejected"][1][0][2] == 1
    assert fam["candlewick_prompt_tokens"][1][0][2] == 10
    assert fam["candlewick_prompt_tokens_cached"][1][0][2] == 4
    assert fam["candlewick_completion_tokens"][1][0][2] == 5
    kind, samples = fam["candlewick_time_to_first_token_seconds"]
    assert kind == "histogram"
    les = [s[1]["le"] for s in samples if s[0].endswith("_bucket")]
    assert les == ["0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "30.0", "+Inf"]
    assert fam["candlewick_request_duration_seconds"][0] == "histogram"
    assert fam["candlewick_kv_cache_usage_ratio"] == (
        "gauge",
        [("candlewick_kv_cache_usage_ratio", {}, 0.25)],
    )
    for name, value in (
        ("ready", 1),
        ("slots_total", 4),
        ("slots_busy", 1),
        ("queue_depth", 2),
        ("kv_cache_used_cells", 1024),
        ("kv_cache_capacity_cells", 4096),
    ):
        assert fam[f"candlewick_{name}"] == ("gauge", [(f"candlewick_{name}", {}, value)])
    for name, value in (
        ("decode_steps", 7),
        ("kv_stream_copies", 3),
        ("draft_tokens", 12_345_678),
        ("draft_accepted", 5),
    ):
        assert fam[f"candlewick_{name}"] == ("counter", [(f"candlewick_{name}_total", {}, value)])
    lines = text.splitlines()
    # Counts stay integers, as scripts read them with int(); no `_created` series.
    assert "candlewick_draft_tokens_total 12345678" in lines
    assert "candlewick_kv_stream_copies_total 3" in lines
    assert "candlewick_time_to_first_token_seconds_sum 0.3" in lines
    assert not [x for x in lines if "_created" in x]


def test_the_prompt_cache_figures() -> None:
    """The default model's RAM prompt cache: bytes and entries now, the budget, and its
    saves, restores and evictions as counters; all 0 when the model has none."""
    cache = PromptStateCache(1000)
    cache.put((1, 2, 3), b"a" * 400)
    cache.put((4, 5, 6), b"b" * 400)
    cache.put((7, 8, 9), b"c" * 400)  # over the budget: the least recently used goes
    assert cache.get((7, 8, 9)) is not None
    fam = _families(Metrics().render(SNAP, True, cache=cache))
    for name, value in (
        ("prompt_cache_bytes", 800),
        ("prompt_cache_budget_bytes", 1000),
        ("prompt_cache_entries", 2),
    ):
        assert fam[f"candlewick_{name}"] == ("gauge", [(f"candlewick_{name}", {}, value)])
    for name, value in (
        ("prompt_cache_saves", 3),
        ("prompt_cache_restores", 1),
        ("prompt_cache_evictions", 1),
    ):
        assert fam[f"candlewick_{name}"] == ("counter", [(f"candlewick_{name}_total", {}, value)])
    off = _families(Metrics().render(SNAP, True))
    assert off["candlewick_prompt_cache_bytes"][1][0][2] == 0
    assert off["candlewick_prompt_cache_saves"][1][0][2] == 0
    assert "candlewick_prompt_cache_bytes" not in _families(Metrics().render(None, False))


def test_without_a_model_only_readiness() -> None:
    fam = _families(Metrics().render(None, False))
    assert fam["candlewick_ready"] == ("gauge", [("candlewick_ready", {}, 0)])
    assert "candlewick_slots_total" not in fam and "candlewick_decode_steps" not in fam
    assert fam["candlewick_requests"] == ("counter", [])


def test_each_instance_counts_alone() -> None:
    a, b = Metrics(), Metrics()
    a.request_done("/health", 200)
    assert 'route="/health"' in a.render(None, True)
    assert 'route="/health"' not in b.render(None, True)
