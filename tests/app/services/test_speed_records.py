"""Predicted speed for a Hub file before download, and the measured speed beside it after,
without a real model: probe-sized GGUF files served by the Hub emulator, and this machine's
figures from a simulated decode timer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.services.hub import HubClient, header_fit, header_speed
from app.services.speed_records import (
    KEEP_SAMPLES,
    MIN_TOKENS,
    SpeedRecords,
    SpeedService,
    SpeedView,
    file_key,
)
from engine.bench.speed_model import SpeedPrediction
from engine.bench.speed_probe import SpeedProfile, write_probe_model
from engine.memory.hardware import GiB, cpu_only
from engine.model.gguf import read_gguf
from tests.hub_emulator import running_hub
from tests.speed_machine import QUIET, SimulatedDecoder, sim_settings

REPO = "someone/Probe-GGUF"
NAME = "probe-Q8_0.gguf"


def service(tmp_path: Path) -> tuple[SpeedService, SimulatedDecoder]:
    sim = SimulatedDecoder(1e-4, 5e-4, {"F32": 1e12, "Q8_0": 8e9})
    profile = SpeedProfile(
        tmp_path / "data" / "speed_profile.json",
        sim_settings(),
        timer=sim,
        chat_timer=sim.chat,
        bandwidth=lambda: 20e9,
        load=QUIET,
    )
    return SpeedService(tmp_path / "data", profile), sim


def model_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_probe_model(path, n_layer=4, n_embd=256, n_ff=512, type_name="Q8_0")
    return path


def prediction(tps: float) -> SpeedPrediction:
    return SpeedPrediction(tps, 0.01, 0.005, 0.001, 10, (), "CPU", 2)


def test_measured_speeds_keep_a_median_of_the_latest(tmp_path: Path) -> None:
    records = SpeedRecords(tmp_path / "r.json")
    key = file_key("dir/m.gguf", 123)
    assert key == "m.gguf|123"
    assert records.view(key, None) == SpeedView(None, "")
    for tps in (10.0, 30.0, 20.0):
        last = records.measured(key, tps)
    assert last["tokens_per_s"] == 20.0 and last["samples"] == [10.0, 30.0, 20.0]
    for i in range(KEEP_SAMPLES):
        records.measured(key, 100.0 + i)
    kept = records.get(key)["measured"]["samples"]
    assert len(kept) == KEEP_SAMPLES and kept[0] == 100.0
    view = records.view(key, prediction(110.0))
    assert view.text() == "~110 tok/s · measured 104"
    assert "Measured / predicted: 0.95" in view.tooltip() and "9 chat replies" in view.tooltip()


def test_a_prediction_made_before_download_is_shown_after(tmp_path: Path) -> None:
    records = SpeedRecords(tmp_path / "r.json")
    key = file_key("m.gguf", 5)
    records.predicted(key, prediction(42.4))
    records.measured(key, 40.0)
    view = records.view(key, None)  # this machine's figures not at hand: the stored one
    assert view.predicted_tps == pytest.approx(42.4) and view.measured_tps == 40.0
    assert view.text() == "~42 tok/s · measured 40"


def test_a_broken_records_file_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("[1, 2", encoding="utf-8")
    records = SpeedRecords(path)
    assert records.all() == {}
    records.measured("k", 5.0)
    assert json.loads(path.read_text(encoding="utf-8"))["k"]["measured"]["tokens_per_s"] == 5.0


def test_local_file_view_never_measures(tmp_path: Path) -> None:
    svc, sim = service(tmp_path)
    path = model_file(tmp_path / "models" / NAME)
    assert svc.view_for_file(path) is None and sim.calls == []  # nothing known, nothing run
    # A short reply does not count; a long one does, and shows without a prediction.
    assert not svc.record_measured(path, 50.0, MIN_TOKENS - 1)
    assert svc.record_measured(path, 50.0, 64)
    view = svc.view_for_file(path)
    assert view is not None and view.predicted_tps is None and view.text() == "measured 50"
    assert sim.calls == []
    # Once this machine is measured for its kernels, the prediction is beside it.
    p = svc.predict_file(path)
    view = svc.view_for_file(path)
    assert view is not None and view.predicted_tps == pytest.approx(p.tokens_per_s)
    assert view.text() == f"~{p.tokens_per_s:.0f} tok/s · measured 50"


def test_hub_file_speed_before_download_then_measured(tmp_path: Path) -> None:
    svc, sim = service(tmp_path)
    local = model_file(tmp_path / "src" / NAME)
    with running_hub() as emu:
        emu.repo(REPO).add(NAME, source=local)
        client = HubClient(emu.url, fit=header_fit(cpu_only(8 * GiB)), speed=header_speed(svc))
        details = client.repo_details(REPO)
        badge = details.speeds[NAME]
        # The fit read the header; the speed used the same parsed header (no new request).
        header_reads = [r for r in emu.requests if r.get("file") == NAME and r["range"]]
        again = client.speed_badge(REPO, details.variants[0], details.commit or "main")
        assert [r for r in emu.requests if r.get("file") == NAME and r["range"]] == header_reads
    assert details.fits[NAME] == "RAM only"
    assert badge.tokens_per_s is not None and badge.tokens_per_s > 0
    assert badge.text == f"~{badge.tokens_per_s:.0f} tok/s"
    assert "Q8_0" in badge.tooltip or "memory" in badge.tooltip
    assert again is not None and again.text == badge.text
    assert details.to_dict()["files"][0]["predicted_tokens_per_s"] == badge.tokens_per_s
    # The probe ran: the fixed work, then the file's one kernel on a large matrix (its output
    # matrix) and at its layers' width class; nothing the second time.
    assert len(sim.calls) == 4 and "rate-Q8_0-256x512.gguf" in sim.calls
    # The simulated machine, by hand: what the prediction must equal.
    cost = svc.cost(read_gguf(local))
    per_token = 5e-4 + cost.n_layer * 1e-4
    kernels = sum(n for n in cost.matmul_bytes.values()) / 8e9
    kernels += (cost.other_bytes + cost.kv_bytes) / 20e9
    memory = cost.bytes_per_token / 20e9
    assert badge.tokens_per_s == pytest.approx(1 / (max(kernels, memory) + per_token), rel=0.02)
    # Downloaded (same name and size) and used: the measured speed joins the prediction.
    svc.record_measured(local, 0.9 * badge.tokens_per_s, 100)
    view = svc.view_for_file(local)
    assert view is not None and view.measured_tps == pytest.approx(0.9 * badge.tokens_per_s)
    assert "Measured / predicted: 0.90" in view.tooltip()


def test_no_speed_function_no_badge_and_a_failing_one_is_none(tmp_path: Path) -> None:
    local = model_file(tmp_path / NAME)
    with running_hub() as emu:
        emu.repo(REPO).add(NAME, source=local)
        plain = HubClient(emu.url).repo_details(REPO)
        assert plain.speeds == {} and plain.to_dict()["files"][0]["predicted_tokens_per_s"] is None

        def broken(*_a: object) -> object:
            raise RuntimeError("probe failed")

        client = HubClient(emu.url, speed=broken)  # type: ignore[arg-type]
        assert client.repo_details(REPO).speeds == {}
