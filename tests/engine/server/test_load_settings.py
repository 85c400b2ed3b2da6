"""What the model was loaded with is visible over HTTP, and the scheduler's stream copies are
counted in /metrics."""

from __future__ import annotations

from engine.memory import cpu_kernels
from engine.server import ServedModel
from tests.engine.server.conftest import N_SLOTS, http


def test_health_and_models_show_the_load_settings(
    base_url: str, auth: dict[str, str], served: ServedModel
) -> None:
    health = http.get(base_url + "/health").json()
    settings = health["settings"]
    assert settings["slots"] == N_SLOTS
    assert settings["ctx_per_slot"] == 1024
    assert settings["kv_type_k"] == settings["kv_type_v"] == "f16"
    assert settings["flash_attn_requested"] == "auto"
    # 'auto' as this CPU resolves it for the model's heads and a slot's context
    # (cpu_kernels.flash_attn_scalar, flash_attn_ctx_limit).
    gf = served.model.gguf
    assert settings["flash_attn"] == cpu_kernels.resolve_flash_attn_for(
        "auto", gf, "f16", "f16", n_ctx=settings["ctx_per_slot"]
    )
    assert settings["threads"] == 2
    assert settings["speculative"] == "off"
    # llama.cpp's own figure: 30 layers x 192 K/V values x 2 bytes x 2 x 4096 cells = 90 MiB.
    assert settings["kv_cache_mib"] == round(served.model.memory_actual.kv_bytes / 2**20, 2)
    assert 89 < settings["kv_cache_mib"] < 91
    models = http.get(base_url + "/v1/models", headers=auth).json()
    assert models["data"][0]["meta"] == settings
    one = http.get(base_url + "/v1/models/smollm2", headers=auth).json()
    assert one["meta"] == settings


def test_metrics_count_kv_stream_copies(
    base_url: str, auth: dict[str, str], served: ServedModel
) -> None:
    text = http.get(base_url + "/metrics", headers=auth).text
    line = next(x for x in text.splitlines() if x.startswith("candlewick_kv_stream_copies_total "))
    assert int(line.split()[1]) == served.scheduler.snapshot().kv_copies
    # Prompt lookup is off here: the draft counters exist and stay at zero.
    assert "candlewick_draft_tokens_total 0" in text.splitlines()
    assert "candlewick_draft_accepted_total 0" in text.splitlines()
