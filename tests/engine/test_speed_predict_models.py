"""The decode speed predicted from a header against a short decode of the real models through
the engine. Loose sanity only: tests never assert timings; how close the prediction comes is
measured by benchmarks/predicted_speed.py (docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.bench.speed_model import DecodeCost, predict
from engine.bench.speed_probe import SpeedProfile, decode_step_s
from engine.memory import cpu_kernels
from engine.model.gguf import read_gguf

pytestmark = pytest.mark.slow


def test_predictions_for_both_models_against_a_measured_decode(
    tmp_path: Path, smollm2_path: Path, gemma_path: Path
) -> None:
    profile = SpeedProfile(tmp_path / "speed_profile.json")
    feats = cpu_kernels.detect()
    for path in (smollm2_path, gemma_path):
        gf = read_gguf(path)
        cost = DecodeCost.of(gf, features=feats, extra_buffers=profile.settings.extra_buffers)
        # Tied embeddings: every tensor is read (the embedding as the output matrix) and one
        # embedding row; the file adds its header.
        assert 0.9 * path.stat().st_size < cost.weight_bytes <= path.stat().st_size
        machine = profile.machine(cost.matmul_bytes.keys())
        assert machine.bandwidth_bytes_per_s > 0 and machine.per_layer_s >= 0
        p = predict(cost, machine)
        assert p.unmeasured == ()  # the probe ran every kernel these models use
        # Sampling at the chat's defaults measured once, and charged per vocabulary entry.
        assert machine.per_vocab_s is not None
        assert p.sample_s == pytest.approx(cost.n_vocab * machine.per_vocab_s)
        assert cost.n_vocab in (49_152, 262_144)
        assert all(machine.rates[k] > 0 for k in cost.matmul_bytes)
        measured = 1 / decode_step_s(path, profile.settings.params, tokens=32)
        # Both sides are figures of this machine, finite and positive; how close they come is a
        # measurement (benchmarks/predicted_speed.py), not a test: timings vary with the load.
        assert 0 < p.tokens_per_s < float("inf") and 0 < measured < float("inf")
    # Measured once: a second profile on the same file runs nothing.
    again = SpeedProfile(tmp_path / "speed_profile.json")
    assert again.known(cost.matmul_bytes.keys()) == profile.cached()
