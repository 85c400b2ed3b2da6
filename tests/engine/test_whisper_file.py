"""whisper.cpp's ggml model files read before whisper.cpp sees them: the hyper-parameters and
tensor bytes of a whole file; a truncated, foreign or hostile file refused in one line."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from engine.model.whisper_file import (
    WhisperFileError,
    expected_tensors,
    is_whisper_file,
    read_whisper,
)
from tests.whisper_bin import SMALL, tensor_count, whisper_bytes, write_whisper


def test_reads_hyper_parameters_and_tensor_bytes(tmp_path: Path) -> None:
    p = write_whisper(tmp_path / "ggml-small.bin")
    w = read_whisper(p)
    assert w.hparams.n_audio_layer == 4 and w.hparams.n_text_state == 64
    assert w.hparams.n_mels == 80 and w.hparams.n_vocab == 8
    assert w.n_tensors == 7 + 15 * 4 + 4 + 24 * 4 == expected_tensors(w.hparams)
    assert w.weights_bytes == 64 * 16 * 4 + 64 * 8 * 2 + (w.n_tensors - 2) * 4 * 4
    assert w.size == p.stat().st_size
    assert (w.model_type, w.file_type, w.multilingual) == ("tiny", "f16", False)
    assert w.description == "whisper tiny (English only) · f16"
    assert is_whisper_file(p)


def test_quantized_and_multilingual_names(tmp_path: Path) -> None:
    # ggml's Q5_1 (type 7) blocks: 32 weights in 24 bytes; file type 9, quantization version 2.
    hp = {"n_audio_layer": 6, "n_text_layer": 6, "ftype": 2009, "n_vocab": 51865}
    n = tensor_count({**SMALL, **hp})
    tensors = [("decoder.token_embedding.weight", 7, (64, 2))]
    tensors += [(f"f{i}", 0, (4,)) for i in range(n - 1)]
    w = read_whisper(write_whisper(tmp_path / "ggml-base-q5_1.bin", hp, tensors=tensors))
    assert (w.model_type, w.file_type, w.multilingual) == ("base", "q5_1", True)
    assert w.weights_bytes == 2 * 2 * 24 + (n - 1) * 16
    # One tensor short: whisper.cpp would refuse it too ("not all tensors loaded").
    short = write_whisper(tmp_path / "short.bin", hp, tensors=tensors[:-1])
    with pytest.raises(WhisperFileError, match=f"has {n - 1} of the {n} tensors"):
        read_whisper(short)


def test_a_gguf_model_is_named_as_such(smollm2_path: Path) -> None:
    with pytest.raises(WhisperFileError, match=r"is a GGUF model, not a whisper\.cpp speech model"):
        read_whisper(smollm2_path)
    assert not is_whisper_file(smollm2_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_vocab": 0}, "n_vocab is 0, outside 1..1048576"),
        ({"n_audio_layer": -3}, "n_audio_layer is -3"),
        ({"n_text_ctx": 1 << 30}, "n_text_ctx is 1073741824"),
        ({"n_audio_head": 3}, "n_audio_head 3 does not divide n_audio_state 64"),
        ({"ftype": 5}, "unknown file type 5"),
        ({"ftype": -1}, "unknown file type -1"),
    ],
)
def test_hostile_hyper_parameters(tmp_path: Path, change: dict[str, int], message: str) -> None:
    p = write_whisper(tmp_path / "bad.bin", change)
    with pytest.raises(WhisperFileError, match=message):
        read_whisper(p)


def test_hostile_counts_are_bounded_before_use(tmp_path: Path) -> None:
    good = whisper_bytes()
    mel_at = 4 + 4 * len(SMALL)
    cases = {
        "mel filters": good[:mel_at] + struct.pack("<2i", 80, 1 << 30) + good[mel_at + 8 :],
        "vocabulary": good[:mel_at]
        + struct.pack("<2i", 80, 201)
        + bytes(4 * 80 * 201)
        + struct.pack("<i", -5),
    }
    (tmp_path / "mel.bin").write_bytes(cases["mel filters"])
    with pytest.raises(WhisperFileError, match="mel filters 80 x 1073741824 are out of bounds"):
        read_whisper(tmp_path / "mel.bin")
    (tmp_path / "vocab.bin").write_bytes(cases["vocabulary"])
    with pytest.raises(WhisperFileError, match="vocabulary's size -5 is out of bounds"):
        read_whisper(tmp_path / "vocab.bin")
    huge_token = whisper_bytes(vocab=[b"x" * 10])
    at = huge_token.index(struct.pack("<I", 10) + b"x" * 10)
    hostile = huge_token[:at] + struct.pack("<I", 1 << 31) + huge_token[at + 4 :]
    (tmp_path / "token.bin").write_bytes(hostile)
    with pytest.raises(WhisperFileError, match="a token of -2147483648 bytes"):
        read_whisper(tmp_path / "token.bin")


def test_every_truncation_is_refused_in_one_line(tmp_path: Path) -> None:
    """Cut at every offset of the header and a sample of the data: never a crash, never a
    file taken as whole."""
    good = whisper_bytes(n_fft=2)  # a small filter bank: the file is ~6 KB
    # Every offset of the magic, the hyper-parameters and the filters' shape; a sample of
    # the rest (filters, vocabulary, tensor headers and data, tensors' ends).
    cuts = list(range(64)) + random.Random(7).sample(range(64, len(good)), 200)
    p = tmp_path / "cut.bin"
    for n in cuts:
        p.write_bytes(good[:n])
        with pytest.raises(WhisperFileError) as e:
            read_whisper(p)
        assert "\n" not in str(e.value)
        assert (
            "cut short" in str(e.value)
            or "not a whisper.cpp model" in str(e.value)
            or ("has no tensors" in str(e.value))
        ), (n, str(e.value))


def test_random_bytes_after_the_magic_never_crash(tmp_path: Path) -> None:
    rng = random.Random(42)
    good = whisper_bytes(n_fft=2)
    p = tmp_path / "noise.bin"
    for _ in range(200):
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(4, len(data))] = rng.randrange(256)
        p.write_bytes(bytes(data))
        try:
            read_whisper(p)
        except WhisperFileError as e:
            assert "\n" not in str(e)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WhisperFileError, match="cannot read"):
        read_whisper(tmp_path / "nope.bin")
    assert not is_whisper_file(tmp_path / "nope.bin")
