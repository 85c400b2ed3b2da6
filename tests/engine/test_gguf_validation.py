"""Bad files get a specific one-line message before llama.cpp ever sees them."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from engine.model.facts import model_facts
from engine.model.gguf import GGUFError, read_gguf


def _expect(path: Path, *fragments: str) -> str:
    with pytest.raises(GGUFError) as exc:
        read_gguf(path)
    msg = str(exc.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, msg
    return msg


def _header_end(path: Path) -> int:
    return read_gguf(path).data_offset


def test_reads_smollm2_facts(smollm2_path: Path) -> None:
    gf = read_gguf(smollm2_path)
    f = model_facts(gf)
    assert f.architecture == "llama"
    assert f.n_layer == 30 and f.n_head == 9 and f.n_head_kv == 3
    assert f.context_length == 8192
    assert f.vocab_size == 49152
    assert f.quantization == "Q4_1"
    assert 130e6 < f.n_params < 140e6
    assert f.chat_template and "im_start" in f.chat_template
    assert gf.expected_size == gf.file_size == smollm2_path.stat().st_size


def test_reads_gemma_sliding_window(gemma_path: Path) -> None:
    f = model_facts(read_gguf(gemma_path))
    assert f.architecture == "gemma3"
    assert f.vocab_size == 262144
    assert f.sliding_window > 0
    # 18 layers, every 6th global: 3 global + 15 sliding-window layers
    assert f.n_layer == 18 and sum(f.swa_layers) == 15


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    _expect(p, "file is empty")


def test_not_gguf(tmp_path: Path) -> None:
    p = tmp_path / "notes.gguf"
    p.write_bytes(b"just some text that is long enough to be read as a header\n" * 4)
    _expect(p, "not a GGUF model")


def test_html_error_page(tmp_path: Path) -> None:
    p = tmp_path / "model.gguf"
    p.write_bytes(b"<!DOCTYPE html><html><body>Rate limited</body></html>" + b" " * 64)
    _expect(p, "HTML page")


def test_safetensors_named(tmp_path: Path) -> None:
    header = b'{"weight": {"dtype": "F16"}}'
    p = tmp_path / "model.gguf"
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 64)
    _expect(p, "safetensors")


def test_truncated_in_data(tmp_path: Path, smollm2_path: Path) -> None:
    p = tmp_path / "half.gguf"
    size = smollm2_path.stat().st_size
    with smollm2_path.open("rb") as src, p.open("wb") as dst:
        dst.write(src.read(size // 2))
    _expect(p, "file is truncated", "98 MB expected", "49 MB present")


def test_truncated_in_header(tmp_path: Path, smollm2_path: Path) -> None:
    p = tmp_path / "onemeg.gguf"
    with smollm2_path.open("rb") as src, p.open("wb") as dst:
        dst.write(src.read(1_000_000))
    _expect(p, "file is truncated", "inside the GGUF header")


def test_unsupported_version(tmp_path: Path, smollm2_path: Path) -> None:
    p = tmp_path / "v9.gguf"
    shutil.copyfile(smollm2_path, p)
    with p.open("r+b") as f:
        f.seek(4)
        f.write(struct.pack("<I", 9))
    _expect(p, "unsupported GGUF version 9")


def test_absurd_tensor_count(tmp_path: Path) -> None:
    p = tmp_path / "absurd.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**60, 1) + b"\0" * 100)
    _expect(p, "claims", "tensors", "impossible")


def test_absurd_metadata_count(tmp_path: Path) -> None:
    p = tmp_path / "absurd_kv.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40) + b"\0" * 100)
    _expect(p, "metadata entries", "impossible")


def test_absurd_string_length(tmp_path: Path) -> None:
    p = tmp_path / "longkey.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**62) + b"\0" * 100)
    _expect(p, "impossible length")


def _write_minimal(path: Path, arch: str) -> None:
    key = b"general.architecture"
    val = arch.encode()
    body = struct.pack("<Q", len(key)) + key + struct.pack("<I", 8)
    body += struct.pack("<Q", len(val)) + val
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + body)


def test_unknown_architecture(tmp_path: Path) -> None:
    p = tmp_path / "alien.gguf"
    _write_minimal(p, "alienformer")
    _expect(p, "unknown model architecture 'alienformer'")


def test_known_architecture_minimal_header(tmp_path: Path) -> None:
    p = tmp_path / "ok.gguf"
    _write_minimal(p, "llama")
    assert read_gguf(p).architecture == "llama"


def test_tensor_offset_out_of_range(tmp_path: Path, smollm2_path: Path) -> None:
    gf = read_gguf(smollm2_path)
    # Push the first tensor's offset far beyond the end of the file.
    p = tmp_path / "badoffset.gguf"
    shutil.copyfile(smollm2_path, p)
    data = p.read_bytes()
    name = gf.tensors[0].name.encode()
    i = data.index(struct.pack("<Q", len(name)) + name, 24)
    n_dims = struct.unpack_from("<I", data, i + 8 + len(name))[0]
    off_pos = i + 8 + len(name) + 4 + 8 * n_dims + 4
    with p.open("r+b") as f:
        f.seek(off_pos)
        f.write(struct.pack("<Q", 2**45))
    _expect(p, "truncated")


def test_missing_file(tmp_path: Path) -> None:
    _expect(tmp_path / "nope.gguf", "not found")


def test_directory(tmp_path: Path) -> None:
    _expect(tmp_path, "is a folder")


def _write_vocabulary(path: Path, tokens: list[bytes]) -> None:
    """A header with an architecture and `tokens` as its vocabulary (a string array), larger
    than the reader's first read-ahead blocks."""
    body = b""
    for key, value in ((b"general.architecture", b"llama"),):
        body += struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, len(value)) + value
    key = b"tokenizer.ggml.tokens"
    body += struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, len(tokens))
    body += b"".join(struct.pack("<Q", len(t)) + t for t in tokens)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + body)


@pytest.mark.parametrize("at", [None, 1, 4100, 29_999])
def test_a_duplicate_token_is_found_wherever_it_is(tmp_path: Path, at: int | None) -> None:
    """The vocabulary is read a buffer at a time: a duplicate in any block is the first one
    named, and a vocabulary cut short is a truncated file."""
    tokens = [f"token-{i}-{'x' * (i % 23)}".encode() for i in range(30_000)]
    if at is not None:
        tokens[at] = tokens[at // 2]
    p = tmp_path / "vocab.gguf"
    _write_vocabulary(p, tokens)
    summary = read_gguf(p).metadata["tokenizer.ggml.tokens"]
    assert (summary.length, summary.duplicate) == (30_000, at)
    p.write_bytes(p.read_bytes()[:-100])
    _expect(p, "truncated")
