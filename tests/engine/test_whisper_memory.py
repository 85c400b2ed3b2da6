"""A whisper.cpp model's memory from its header, against the figures whisper.cpp itself logs
when it loads a model of the same dimensions (whisper.cpp 1.8.5, the version pywhispercpp
1.5.1 binds, CPU, flash attention on: its default). The figures were taken from its log
lines (`kv self size`, `compute buffer (encode)`, ...; MB of 10^6 bytes, two decimals) for
models of the real dimensions; the buffers depend only on the header."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.memory.whisper import whisper_memory
from engine.model.whisper_file import read_whisper
from tests.whisper_bin import write_whisper

# name: (vocab, width, heads, layers, mels) -> whisper.cpp's kv self, kv cross, kv pad, conv,
# encode, cross, decode buffers in MB.
LOGGED = {
    "tiny": ((51865, 384, 6, 4, 80), (3.15, 9.44, 2.36, 13.21, 17.72, 3.89, 95.91)),
    "base.en": ((51864, 512, 8, 6, 80), (6.29, 18.87, 3.15, 16.28, 23.09, 4.66, 96.37)),
    "small": ((51865, 768, 12, 12, 80), (18.87, 56.62, 4.72, 22.42, 33.85, 6.20, 97.28)),
    "large-v3": ((51866, 1280, 20, 32, 128), (83.89, 251.66, 7.86, 36.15, 55.35, 9.27, 99.12)),
}


@pytest.mark.parametrize("name", list(LOGGED))
def test_buffers_match_whisper_cpps_log(tmp_path: Path, name: str) -> None:
    (vocab, width, heads, layers, mels), logged = LOGGED[name]
    hp = {
        "n_vocab": vocab,
        "n_audio_ctx": 1500,
        "n_audio_state": width,
        "n_audio_head": heads,
        "n_audio_layer": layers,
        "n_text_ctx": 448,
        "n_text_state": width,
        "n_text_head": heads,
        "n_text_layer": layers,
        "n_mels": mels,
    }
    m = whisper_memory(read_whisper(write_whisper(tmp_path / f"{name}.bin", hp)))
    ours = (
        m.kv_self,
        m.kv_cross,
        m.kv_pad,
        m.compute_conv,
        m.compute_encode,
        m.compute_cross,
        m.compute_decode,
    )
    for got, want in zip(ours, logged, strict=True):
        assert got / 1e6 == pytest.approx(want, abs=0.01)
    # The host's logits: n_vocab x n_text_ctx floats, reserved by the state.
    assert m.logits == vocab * 448 * 4
    # A fallback to best of 5 makes the self-attention cache for 7 sequences.
    assert m.fallback == 6 * m.kv_self
    assert m.total == m.weights + m.kv + m.compute + m.logits + m.fallback


def test_greedy_only_has_no_fallback(tmp_path: Path) -> None:
    m = whisper_memory(read_whisper(write_whisper(tmp_path / "t.bin")), best_of=1)
    assert m.fallback == 0 and m.total == m.at_load
