"""A whisper.cpp model file read and checked before whisper.cpp sees it.

whisper.cpp's models (`ggml-tiny.bin`, `ggml-base.en-q5_1.bin`, ...) are not GGUF but the
older ggml container: a magic, eleven int32 hyper-parameters, the mel filter bank, the
vocabulary, then tensors, each a small header followed by its data. The `gguf` package reads
only GGUF, so this module reads the header itself; every count is checked against what is
left of the file before it is used, so a truncated, hostile or foreign file is refused in
one line (whisper.cpp itself may read past the end or allocate what a corrupt count says).
The tensor types' sizes come from the `gguf` package (ggml's own table).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import EngineError

MAGIC = 0x67676D6C  # "ggml", little-endian, as whisper.cpp writes it
GGUF_MAGIC = b"GGUF"
QNT_VERSION_FACTOR = 1000  # ggml's GGML_QNT_VERSION_FACTOR: ftype = version * 1000 + type

HPARAMS = (
    "n_vocab",
    "n_audio_ctx",
    "n_audio_state",
    "n_audio_head",
    "n_audio_layer",
    "n_text_ctx",
    "n_text_state",
    "n_text_head",
    "n_text_layer",
    "n_mels",
    "ftype",
)
# Generous bounds (large-v3 has 51866 tokens, 1280 wide, 32 layers, 128 mels): a count past
# them is a corrupt or hostile file, refused before anything is sized from it.
LIMITS = {
    "n_vocab": 1 << 20,
    "n_audio_ctx": 1 << 16,
    "n_audio_state": 1 << 16,
    "n_audio_head": 1 << 10,
    "n_audio_layer": 1 << 10,
    "n_text_ctx": 1 << 16,
    "n_text_state": 1 << 16,
    "n_text_head": 1 << 10,
    "n_text_layer": 1 << 10,
    "n_mels": 1 << 10,
}
MAX_TOKEN_BYTES = 1 << 16
MAX_NAME = 1 << 10
# whisper.cpp's model types by encoder depth (whisper_model_load's `type`).
MODEL_TYPES = {4: "tiny", 6: "base", 12: "small", 24: "medium", 32: "large"}
# ggml's file types (enum ggml_ftype) as whisper.cpp's `quantize` names them.
FILE_TYPES = {
    0: "f32",
    1: "f16",
    2: "q4_0",
    3: "q4_1",
    7: "q8_0",
    8: "q5_0",
    9: "q5_1",
    10: "q2_k",
    11: "q3_k",
    12: "q4_k",
    13: "q5_k",
    14: "q6_k",
}
MULTILINGUAL_VOCAB = 51865  # whisper.cpp: a vocabulary this large has the language tokens


class WhisperFileError(EngineError):
    """Not a usable whisper.cpp model; `str()` is one line for the user."""


@dataclass(frozen=True)
class WhisperHParams:
    n_vocab: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int
    n_mels: int
    ftype: int  # as stored: the quantization version times 1000 plus the file type


@dataclass(frozen=True)
class WhisperFile:
    path: Path
    size: int  # bytes on disk
    hparams: WhisperHParams
    n_tensors: int
    weights_bytes: int  # the tensors' data, what whisper.cpp loads into its weight buffer

    @property
    def file_type(self) -> str:
        """ "f16", "q5_1", ...: the weights' main type."""
        t = self.hparams.ftype % QNT_VERSION_FACTOR
        return FILE_TYPES.get(t, f"type {t}")

    @property
    def model_type(self) -> str:
        """whisper.cpp's size name ("tiny", "base", "small", ...), "custom" for other depths."""
        return MODEL_TYPES.get(self.hparams.n_audio_layer, "custom")

    @property
    def multilingual(self) -> bool:
        return self.hparams.n_vocab >= MULTILINGUAL_VOCAB

    @property
    def description(self) -> str:
        """One line a user reads: "whisper base (multilingual) · q5_1"."""
        langs = "multilingual" if self.multilingual else "English only"
        return f"whisper {self.model_type} ({langs}) · {self.file_type}"


class _Reader:
    """Bounded reads: every length is checked against the bytes left before it is read."""

    def __init__(self, f: BinaryIO, size: int, name: str) -> None:
        self.f, self.size, self.name = f, size, name

    @property
    def left(self) -> int:
        return self.size - self.f.tell()

    def need(self, n: int, what: str) -> None:
        if n > self.left:
            raise WhisperFileError(
                f"{self.name} is cut short: {what} needs {n} bytes at offset "
                f"{self.f.tell()}, {self.left} left (an unfinished download?)"
            )

    def ints(self, n: int, what: str) -> tuple[int, ...]:
        self.need(4 * n, what)
        return struct.unpack(f"<{n}i", self.f.read(4 * n))

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.f.seek(n, 1)


def read_whisper(path: str | Path) -> WhisperFile:
    """The file's hyper-parameters and tensor bytes, or WhisperFileError in one line: missing,
    not a whisper.cpp model (a GGUF model says so), cut short, or counts out of bounds."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with p.open("rb") as f:
            return _read(_Reader(f, size, p.name), p, size)
    except OSError as e:
        raise WhisperFileError(f"cannot read {p}: {e.strerror or e}") from None


HEADER_BYTES = 4 + 4 * len(HPARAMS)  # the magic and the hyper-parameters


def parse_hparams(head: bytes, name: str) -> WhisperHParams:
    """The hyper-parameters from a file's first HEADER_BYTES (a whole file's, or a Hub
    file's first bytes read by range), checked; WhisperFileError in one line."""
    if head[:4] == GGUF_MAGIC:
        raise WhisperFileError(
            f"{name} is a GGUF model, not a whisper.cpp speech model (ggml .bin)"
        )
    if len(head) < 4 or struct.unpack("<I", head[:4])[0] != MAGIC:
        raise WhisperFileError(f"{name} is not a whisper.cpp model (no ggml magic)")
    if len(head) < HEADER_BYTES:
        raise WhisperFileError(f"{name} is cut short: its hyper-parameters are incomplete")
    hp = WhisperHParams(*struct.unpack(f"<{len(HPARAMS)}i", head[4:HEADER_BYTES]))
    for key, limit in LIMITS.items():
        v = getattr(hp, key)
        if not 0 < v <= limit:
            raise WhisperFileError(f"{name}: {key} is {v}, outside 1..{limit}")
    for heads, width in (("n_audio_head", "n_audio_state"), ("n_text_head", "n_text_state")):
        if getattr(hp, width) % getattr(hp, heads):
            raise WhisperFileError(
                f"{name}: {heads} {getattr(hp, heads)} does not divide {width} {getattr(hp, width)}"
            )
    if hp.ftype < 0 or hp.ftype % QNT_VERSION_FACTOR not in FILE_TYPES:
        raise WhisperFileError(f"{name}: unknown file type {hp.ftype}")
    return hp


def _read(r: _Reader, path: Path, size: int) -> WhisperFile:
    hp = parse_hparams(r.f.read(HEADER_BYTES), path.name)
    n_mel, n_fft = r.ints(2, "the mel filters' shape")
    if not (0 < n_mel <= LIMITS["n_mels"] and 0 < n_fft <= 1 << 16):
        raise WhisperFileError(f"{path.name}: mel filters {n_mel} x {n_fft} are out of bounds")
    r.skip(4 * n_mel * n_fft, "the mel filters")
    (n_vocab,) = r.ints(1, "the vocabulary's size")
    if not 0 < n_vocab <= LIMITS["n_vocab"]:
        raise WhisperFileError(f"{path.name}: the vocabulary's size {n_vocab} is out of bounds")
    for _ in range(n_vocab):
        (length,) = r.ints(1, "a token's length")
        if not 0 <= length <= MAX_TOKEN_BYTES:
            raise WhisperFileError(f"{path.name}: a token of {length} bytes")
        r.skip(length, "a token")
    n_tensors, weights = 0, 0
    while r.left:
        n_dims, name_len, ttype = r.ints(3, "a tensor's header")
        if not (1 <= n_dims <= 4 and 0 < name_len <= MAX_NAME):
            raise WhisperFileError(f"{path.name}: a corrupt tensor header at tensor {n_tensors}")
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            raise WhisperFileError(
                f"{path.name}: tensor {n_tensors} has unknown type {ttype}"
            ) from None
        shape = r.ints(n_dims, "a tensor's shape")
        if any(d <= 0 for d in shape) or shape[0] % block:
            raise WhisperFileError(f"{path.name}: tensor {n_tensors} has shape {list(shape)}")
        r.skip(name_len, "a tensor's name")
        count = 1
        for d in shape:
            count *= d
        n_bytes = count // block * block_bytes
        r.skip(n_bytes, f"tensor {n_tensors}'s data")
        n_tensors += 1
        weights += n_bytes
    expected = expected_tensors(hp)
    if n_tensors != expected:
        # The container has no tensor count: a file cut at a tensor's end reads as whole.
        raise WhisperFileError(
            f"{path.name} has {n_tensors} of the {expected} tensors a whisper model of its "
            "size has (cut short, or not a whisper.cpp model)"
        )
    return WhisperFile(path, size, hp, n_tensors, weights)


def expected_tensors(hp: WhisperHParams) -> int:
    """How many tensors whisper.cpp loads for these hyper-parameters, and so requires (its
    loader fails unless every one of them is in the file): the encoder's 7 (positions, two
    convolutions, the last norm) and 15 a layer; the decoder's 4 and 24 a layer (its
    self-attention, cross-attention and MLP)."""
    return 7 + 15 * hp.n_audio_layer + 4 + 24 * hp.n_text_layer


def is_whisper_header(head: bytes) -> bool:
    """Whether a file's first bytes are a whisper.cpp model's magic and sane
    hyper-parameters (an old llama.cpp ggml model has the same magic, other numbers)."""
    try:
        parse_hparams(head[:HEADER_BYTES], "file")
    except WhisperFileError:
        return False
    return True


def is_whisper_file(path: str | Path) -> bool:
    """Whether the file starts like a whisper.cpp model (the magic only: cheap, for listing)."""
    try:
        with Path(path).open("rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return len(head) == 4 and struct.unpack("<I", head)[0] == MAGIC
