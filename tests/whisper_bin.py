"""whisper.cpp's ggml container written byte by byte, for the header reader's tests: any
hyper-parameters, a vocabulary and tensors of the given shapes, so a test can cut, corrupt or
shape a file freely. (A model whisper.cpp loads and runs is scripts/make_test_speech_models.py.)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = 0x67676D6C
# tiny.en's layout, made small: 4 + 4 layers of width 64, 1 head each.
SMALL = {
    "n_vocab": 8,
    "n_audio_ctx": 16,
    "n_audio_state": 64,
    "n_audio_head": 1,
    "n_audio_layer": 4,
    "n_text_ctx": 16,
    "n_text_state": 64,
    "n_text_head": 1,
    "n_text_layer": 4,
    "n_mels": 80,
    "ftype": 1,
}
ORDER = tuple(SMALL)


Tensor = tuple[str, int, Sequence[int]]  # name, ggml type, shape


def tensor_count(hp: dict[str, int]) -> int:
    """whisper.cpp's tensors for these layer counts (engine.model.whisper_file checks it)."""
    return 7 + 15 * hp["n_audio_layer"] + 4 + 24 * hp["n_text_layer"]


def whisper_bytes(
    hparams: dict[str, int] | None = None,
    *,
    tensors: Sequence[Tensor] | None = None,
    n_fft: int = 201,
    vocab: Sequence[bytes] | None = None,
) -> bytes:
    """The file's bytes: `tensors` are (name, ggml type, shape), their data zeros of ggml's
    size for the type. By default as many tensors as whisper.cpp has for the layer counts:
    a 64 x 16 f32 and a 64 x 8 f16, then 4-element f32 fillers."""
    hp = {**SMALL, **(hparams or {})}
    if tensors is None:
        tensors = [
            ("encoder.positional_embedding", 0, (64, 16)),
            ("decoder.token_embedding.weight", 1, (64, 8)),
        ] + [(f"filler.{i}", 0, (4,)) for i in range(tensor_count(hp) - 2)]
    out = bytearray(struct.pack("<I", MAGIC))
    out += struct.pack(f"<{len(ORDER)}i", *(hp[k] for k in ORDER))
    out += struct.pack("<2i", hp["n_mels"], n_fft) + bytes(4 * hp["n_mels"] * n_fft)
    tokens = list(vocab) if vocab is not None else [f"t{i}".encode() for i in range(hp["n_vocab"])]
    out += struct.pack("<i", len(tokens))
    for t in tokens:
        out += struct.pack("<I", len(t)) + t
    for name, ttype, shape in tensors:
        raw = name.encode()
        out += struct.pack("<3i", len(shape), len(raw), ttype)
        out += struct.pack(f"<{len(shape)}i", *shape) + raw
        count = 1
        for d in shape:
            count *= d
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        out += bytes(count // block * block_bytes)
    return bytes(out)


def write_whisper(path: Path, hparams: dict[str, int] | None = None, **kw: object) -> Path:
    path.write_bytes(whisper_bytes(hparams, **kw))  # type: ignore[arg-type]
    return path
