"""Settings per model: saved in the profile, checked on read, applied over the defaults of
whoever loads the model; a broken file costs nothing the user had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.services.model_settings import (
    DEFAULT,
    SAVED,
    ModelSettings,
    ModelSettingsStore,
    parse_value,
)
from engine.settings import LoadParams, SamplingParams, SpeculativeSettings


@pytest.fixture
def store(tmp_path: Path) -> ModelSettingsStore:
    return ModelSettingsStore(tmp_path / "config" / "model_settings.json", warn=lambda _l: None)


def model_file(tmp_path: Path, name: str) -> Path:
    p = tmp_path / name
    p.write_bytes(b"GGUF")
    return p


def test_round_trip_and_sources(store: ModelSettingsStore, tmp_path: Path) -> None:
    a, b = model_file(tmp_path, "a.gguf"), model_file(tmp_path, "b.gguf")
    assert store.get(a) == ModelSettings() and store.get(a).source == DEFAULT
    store.save(a, {"n_ctx": 8192, "type_k": "q8_0", "temperature": 0.2, "n_gpu_layers": "all"})
    store.save(b, {"n_threads": 3})
    again = ModelSettingsStore(store.path)  # another process reading the same profile
    sa = again.get(a)
    assert sa.source == SAVED
    assert dict(sa.saved) == {
        "n_ctx": 8192,
        "type_k": "q8_0",
        "temperature": 0.2,
        "n_gpu_layers": "all",
    }
    assert again.get(str(a)) == sa  # a path as text is the same model
    rows = {s.key: s for s in sa.describe()}
    assert (rows["n_ctx"].value, rows["n_ctx"].source) == (8192, SAVED)
    assert (rows["type_v"].value, rows["type_v"].source) == ("f16", DEFAULT)
    assert (rows["top_p"].value, rows["top_p"].source) == (SamplingParams().top_p, DEFAULT)
    p = sa.load_params(LoadParams(n_threads=2))
    assert (p.n_ctx, p.type_k, p.n_gpu_layers, p.n_threads) == (8192, "q8_0", "all", 2)
    assert sa.sampling().temperature == 0.2
    assert again.get(b).saved == {"n_threads": 3}
    # update and clear touch one model only
    again.update(a, {"n_ctx": None, "top_k": 20})
    assert dict(store.get(a).saved) == {
        "type_k": "q8_0",
        "temperature": 0.2,
        "n_gpu_layers": "all",
        "top_k": 20,
    }
    store.clear(a)
    assert store.get(a).source == DEFAULT and store.get(b).saved == {"n_threads": 3}
    assert store.models() == [ModelSettingsStore.key(b)]


def test_bad_values_are_refused_on_save(store: ModelSettingsStore, tmp_path: Path) -> None:
    a = model_file(tmp_path, "a.gguf")
    for bad in ({"n_ctx": 4}, {"type_k": "q9"}, {"flash_attn": True}, {"colour": "red"}):
        with pytest.raises(ValueError) as e:
            store.save(a, bad)
        assert "\n" not in str(e.value)
    assert not store.path.exists()
    assert parse_value("n_gpu_layers", "all") == "all"
    assert parse_value("n_gpu_layers", "12") == 12
    assert parse_value("temperature", "0.5") == 0.5


def test_malformed_file_gives_defaults_and_is_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "model_settings.json"
    path.write_text('{"models": {"x": ', "utf-8")
    lines: list[str] = []
    store = ModelSettingsStore(path, warn=lines.append)
    a = model_file(tmp_path, "a.gguf")
    assert store.get(a) == ModelSettings()
    assert len(lines) == 1 and "\n" not in lines[0] and store.problem == lines[0]
    store.get(a)
    assert len(lines) == 1  # said once, not on every lookup
    store.save(a, {"n_ctx": 2048})
    assert (tmp_path / "model_settings.json.bad").read_text("utf-8") == '{"models": {"x": '
    assert store.get(a).saved == {"n_ctx": 2048} and store.problem is None


def test_a_bad_entry_costs_only_its_bad_values(tmp_path: Path) -> None:
    a, b, c = (model_file(tmp_path, n) for n in ("a.gguf", "b.gguf", "c.gguf"))
    key = ModelSettingsStore.key
    path = tmp_path / "model_settings.json"
    raw = {
        key(a): {"n_ctx": "big", "type_k": "q8_0", "unknown": 1},
        key(b): ["not", "a", "table"],
        key(c): {"n_ctx": 1024},
    }
    path.write_text(json.dumps({"version": 1, "models": raw}), "utf-8")
    lines: list[str] = []
    store = ModelSettingsStore(path, warn=lines.append)
    assert store.get(a).saved == {"type_k": "q8_0"}
    assert store.get(b).saved == {}
    assert store.get(c).saved == {"n_ctx": 1024}
    assert lines and all("\n" not in line for line in lines)
    # Saving one model writes the others back as they were, unreadable values included.
    store.update(c, {"n_threads": 2})
    models = json.loads(path.read_text("utf-8"))["models"]
    assert models[key(a)] == raw[key(a)] and models[key(b)] == raw[key(b)]
    assert models[key(c)] == {"n_ctx": 1024, "n_threads": 2}


def test_provider_slots_precedence_and_served_keys(
    store: ModelSettingsStore, tmp_path: Path
) -> None:
    a, b = model_file(tmp_path, "a.gguf"), model_file(tmp_path, "b.gguf")
    store.save(
        a,
        {"n_ctx": 2048, "type_k": "q8_0", "type_v": "q8_0", "speculative": "lookup"},
    )
    base = LoadParams(n_ctx=4 * 1024, n_seq_max=4, n_threads=2)
    provider = store.provider(base, slots=4)
    p = provider(a)
    assert p is not None
    # A saved context is each request's; drafting stays the window's choice.
    assert (p.n_ctx, p.n_seq_max, p.type_k, p.type_v, p.speculative) == (
        8192,
        4,
        "q8_0",
        "q8_0",
        None,
    )
    assert provider(b) is None  # nothing saved: the caller's defaults
    # A flag given on the command line wins over the saved value.
    kept = store.provider(base, slots=4, keep=("n_ctx",))(a)
    assert kept is not None and (kept.n_ctx, kept.type_k) == (4096, "q8_0")
    # The window's load takes drafting too.
    full = store.get(a).load_params()
    assert full.speculative == SpeculativeSettings("lookup")
    # Values that do not go together: the caller's settings, not a failing load.
    store.save(b, {"type_v": "q8_0", "flash_attn": "off"})
    assert store.provider(base)(b) == base
