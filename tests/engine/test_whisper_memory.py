"""A whisper.cpp model's memory from its header, against the figures whisper.cpp itself logs
when it loads a model of the same dimensions (whisper.cpp 1.8.5, the version pywhispercpp
1.5.1 binds, CPU, flash attention on: its default). The figures were taken from its log
lines (`kv self size`, `compute buffer (encode)`, ...; MB of 10^6 bytes, two decimals) for
models of the real dimensions; the buffers depend only on the header."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.memory.whisper import WHISPER_CPP_BEST_OF, whisper_memory
from engine.model.whisper_file import read_whisper
from tests.speech_assets import HParams, write_whisper_model
from tests.whisper_bin import write_whisper
from tests.whisper_reference import whisper_cpp_figures

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
    model = read_whisper(write_whisper(tmp_path / f"{name}.bin", hp))
    m = whisper_memory(model)
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
    # Candlewick decodes greedily without a fallback: the load is the peak.
    assert m.fallback == 0 and m.total == m.at_load
    assert m.total == m.weights + m.kv + m.compute + m.logits
    # A fallback to whisper.cpp's best of 5 makes the self-attention cache for 7 sequences.
    sampled = whisper_memory(model, best_of=WHISPER_CPP_BEST_OF)
    assert sampled.fallback == 6 * m.kv_self and sampled.total == m.total + sampled.fallback


@pytest.mark.model
@pytest.mark.parametrize(
    "hp",
    [
        HParams(),  # the test model: 2 + 2 layers of 64, a 64-token text context
        HParams(
            n_audio_state=128,
            n_audio_head=4,
            n_text_state=128,
            n_text_head=4,
            n_text_ctx=448,
            n_mels=128,
        ),
    ],
    ids=["test-model", "wider"],
)
def test_estimate_matches_what_whisper_cpp_allocates(tmp_path: Path, hp: HParams) -> None:
    path = write_whisper_model(tmp_path / "stt.bin", hp)
    logged = whisper_cpp_figures(path)
    m = whisper_memory(read_whisper(path))
    ours = {
        "model size": m.weights,
        "kv self size": m.kv_self,
        "kv cross size": m.kv_cross,
        "kv pad size": m.kv_pad,
        "conv": m.compute_conv,
        "encode": m.compute_encode,
        "cross": m.compute_cross,
        "decode": m.compute_decode,
    }
    assert set(logged) == set(ours), logged
    assert logged["model size"] == pytest.approx(m.weights / 1e6, abs=0.01)
    for name in ("kv self size", "kv cross size", "kv pad size"):
        assert logged[name] == pytest.approx(ours[name] / 1e6, abs=0.01), name
    for name in ("encode", "cross", "decode"):
        assert logged[name] == pytest.approx(ours[name] / 1e6, abs=0.01), (name, logged)
    # conv: ggml's allocator packs the mel input, its im2col copy and the convolutions'
    # outputs into less than their sum when the encoder is narrow next to its mel bins (this
    # model: 64 wide, 80 mels; real models are 384 to 1280 wide and match exactly above):
    # the estimate is then an upper bound, at most 3.1 MB over.
    over = ours["conv"] / 1e6 - logged["conv"]
    assert -0.01 <= over <= 3.1, (over, logged)
