"""Read and validate GGUF files before llama.cpp ever sees them.

llama.cpp trusts its input: a truncated download or a file with absurd counts can make it
allocate wildly or crash the process. This reader parses the header, the metadata and the
tensor table with bounds checks at every step and turns anything wrong into a `GGUFError`
with a one-line message. It reads from any `ByteSource`, so the same code validates a local
file and a remote file fetched with HTTP Range requests (only the header is read).
"""

from __future__ import annotations

import itertools
import os
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from gguf.constants import GGML_QUANT_SIZES, MODEL_ARCH_NAMES, GGMLQuantizationType, LlamaFileType

from engine.model.whisper_file import is_whisper_header

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
# Arrays longer than this (token lists, merges) are skipped, only their length is kept.
MAX_KEPT_ARRAY = 4096
# Smallest possible on-disk size of one metadata pair and one tensor-info record: used to
# reject counts that could not possibly fit in the file before looping over them.
MIN_KV_BYTES = 8 + 1 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8

KNOWN_ARCHITECTURES = frozenset(MODEL_ARCH_NAMES.values())


class GGUFError(ValueError):
    """A file is not a usable GGUF model; `str()` is a one-line message for the user."""


class ByteSource(Protocol):
    """Random access to the bytes of a file, local or remote."""

    @property
    def size(self) -> int: ...

    def read_at(self, offset: int, length: int) -> bytes: ...


class FileSource:
    """A local file as a ByteSource."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()/__exit__
        self._size = os.fstat(self._file.fileno()).st_size

    @property
    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        self._file.seek(offset)
        return self._file.read(length)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> FileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class ArraySummary:
    """A metadata array too long to keep (e.g. the vocabulary): its element type and length."""

    item_type: int
    length: int
    # Index of the first string equal to an earlier one (kept for the vocabulary only).
    duplicate: int | None = None

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the start of the data section
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)


@dataclass
class GGUFFile:
    source_name: str
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int
    header_bytes_read: int = 0
    header_end: int = 0
    _by_name: dict[str, TensorInfo] = field(default_factory=dict, repr=False)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """`{arch}.{key}` from the metadata."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def tensor(self, name: str) -> TensorInfo | None:
        if not self._by_name:
            self._by_name = {t.name: t for t in self.tensors}
        return self._by_name.get(name)

    @property
    def expected_size(self) -> int:
        if not self.tensors:
            return self.header_end
        return self.data_offset + max(t.offset + t.n_bytes for t in self.tensors)


def ggml_type_name(ggml_type: int) -> str:
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type{ggml_type}"


def file_type_name(file_type: int | None) -> str:
    """Quantization label from `general.file_type` (e.g. MOSTLY_Q4_K_M -> Q4_K_M)."""
    if file_type is None:
        return "unknown"
    try:
        name = LlamaFileType(file_type).name
    except ValueError:
        return f"ftype{file_type}"
    return name.removeprefix("MOSTLY_").replace("ALL_", "")


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            if unit == "bytes":
                return f"{int(n)} bytes"
            return f"{n:.1f} {unit}" if n < 10 else f"{n:.0f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


# GGUF metadata value types
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL = range(8)
_STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = 8, 9, 10, 11, 12
_SCALARS: dict[int, struct.Struct] = {
    _UINT8: struct.Struct("<B"),
    _INT8: struct.Struct("<b"),
    _UINT16: struct.Struct("<H"),
    _INT16: struct.Struct("<h"),
    _UINT32: struct.Struct("<I"),
    _INT32: struct.Struct("<i"),
    _FLOAT32: struct.Struct("<f"),
    _BOOL: struct.Struct("<?"),
    _UINT64: struct.Struct("<Q"),
    _INT64: struct.Struct("<q"),
    _FLOAT64: struct.Struct("<d"),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class _Truncated(Exception):
    pass


class _Reader:
    """Sequential reader over a ByteSource with a growing read-ahead buffer."""

    def __init__(self, source: ByteSource, first_block: int = 1 << 16) -> None:
        self.source = source
        self.size = source.size
        self.pos = 0
        self._buf = b""
        self._buf_start = 0
        self._block = first_block
        self.bytes_fetched = 0

    def _fill(self, need_end: int) -> None:
        if need_end > self.size:
            raise _Truncated
        start = self.pos
        want = max(need_end - start, self._block)
        data = self.source.read_at(start, min(want, self.size - start))
        self.bytes_fetched += len(data)
        # Grow the block so a big vocabulary costs a few requests, not thousands.
        self._block = min(self._block * 2, 1 << 20)
        self._buf = data
        self._buf_start = start
        if start + len(data) < need_end:
            raise _Truncated

    def read(self, n: int) -> bytes:
        end = self.pos + n
        if not (self._buf_start <= self.pos and end <= self._buf_start + len(self._buf)):
            self._fill(end)
        i = self.pos - self._buf_start
        self.pos = end
        return self._buf[i : i + n]

    def skip(self, n: int) -> None:
        if self.pos + n > self.size:
            raise _Truncated
        self.pos += n

    def scan_strings(self, count: int, kept: list[bytes] | None) -> int:
        """Consume up to `count` length-prefixed strings that lie wholly in the read-ahead
        buffer, in one tight loop (a vocabulary's ~50,000 strings, read one call at a time,
        were most of a header's parse); their bytes go to `kept` unless it is None. Returns
        how many; the next string (past the buffer's end, or too long) is left to `read`."""
        buf, base, unpack = self._buf, self._buf_start, _U64.unpack_from
        end = base + len(buf)
        pos, done = self.pos, 0
        while done < count and pos + 8 <= end:
            stop = pos + 8 + unpack(buf, pos - base)[0]
            if stop > end:
                break
            if kept is not None:
                kept.append(buf[pos + 8 - base : stop - base])
            pos, done = stop, done + 1
        self.pos = pos
        return done

    def u32(self) -> int:
        return int(_U32.unpack(self.read(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack(self.read(8))[0])

    def string(self, what: Callable[[], str]) -> str:
        n = self.u64()
        if n > self.size - self.pos:
            if n > self.size:
                raise GGUFError(f"corrupt GGUF: {what()} has an impossible length ({n} bytes)")
            raise _Truncated
        return self.read(n).decode("utf-8", errors="replace")


def _sniff_foreign(head: bytes) -> str | None:
    """Name what a non-GGUF file probably is, for a helpful message."""
    if is_whisper_header(head):
        return (
            "a whisper.cpp speech-to-text model: choose it for voice input on the Models "
            "page (Speech to text) or with `candlewick models use-stt`"
        )
    if head[:4] in (b"ggjt", b"ggmf", b"ggml", b"lmgg", b"tjgg", b"fmgg"):
        return "an old GGML model (pre-GGUF format); convert it to GGUF with llama.cpp's tools"
    if head[:4] == b"PK\x03\x04":
        return "a ZIP archive (e.g. a PyTorch checkpoint), not a GGUF model"
    stripped = head.lstrip().lower()
    if stripped.startswith((b"<!doctype html", b"<html")):
        return "an HTML page, not a model (a failed download?)"
    if stripped.startswith(b"{"):
        return "a JSON file, not a GGUF model"
    if len(head) >= 9:
        (hlen,) = _U64.unpack(head[:8])
        if 2 <= hlen < 100_000_000 and head[8:9] == b"{":
            return "a safetensors file; Candlewick runs GGUF models"
    if head[:4] == b"FUGG":
        return "a big-endian GGUF file, which this build cannot read"
    return None


def read_gguf(path: str | os.PathLike[str], *, check_architecture: bool = True) -> GGUFFile:
    """Validate and read a local GGUF file's header, metadata and tensor table."""
    p = Path(path)
    if not p.exists():
        raise GGUFError(f"model file not found: {p}")
    if p.is_dir():
        raise GGUFError(f"{p} is a folder, not a GGUF file")
    try:
        with FileSource(p) as src:
            return parse_gguf(src, p.name, check_architecture=check_architecture)
    except PermissionError:
        raise GGUFError(f"cannot read {p}: permission denied") from None
    except OSError as e:
        raise GGUFError(f"cannot read {p}: {e.strerror or e}") from None


def parse_gguf(source: ByteSource, name: str, *, check_architecture: bool = True) -> GGUFFile:
    """Validate and parse a GGUF header from any byte source; reads only the header."""
    size = source.size
    if size == 0:
        raise GGUFError(f"{name}: file is empty (0 bytes)")
    r = _Reader(source)
    try:
        return _parse(r, name, size, check_architecture)
    except _Truncated:
        raise GGUFError(
            f"{name}: file is truncated: it ends inside the GGUF header, "
            f"after {human_bytes(size)} (an incomplete download?)"
        ) from None


def _parse(r: _Reader, name: str, size: int, check_architecture: bool) -> GGUFFile:
    head = r.source.read_at(0, min(size, 64))
    if head[:4] != GGUF_MAGIC:
        what = _sniff_foreign(head)
        if what:
            raise GGUFError(f"{name}: not a GGUF model: this is {what}")
        raise GGUFError(f"{name}: not a GGUF model (no GGUF signature at the start of the file)")
    if size < 24:
        raise GGUFError(f"{name}: file is truncated: only {size} bytes, too short for a header")
    r.skip(4)
    version = r.u32()
    if version not in SUPPORTED_VERSIONS:
        if version > 0xFFFF and _U32.unpack(struct.pack(">I", version))[0] in SUPPORTED_VERSIONS:
            raise GGUFError(f"{name}: big-endian GGUF files are not supported")
        raise GGUFError(
            f"{name}: unsupported GGUF version {version} (supported: "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))})"
        )
    n_tensors = r.u64()
    n_kv = r.u64()
    if n_tensors * MIN_TENSOR_INFO_BYTES > size:
        raise GGUFError(
            f"{name}: corrupt GGUF: header claims {n_tensors} tensors, "
            f"impossible in a {human_bytes(size)} file"
        )
    if n_kv * MIN_KV_BYTES > size:
        raise GGUFError(
            f"{name}: corrupt GGUF: header claims {n_kv} metadata entries, "
            f"impossible in a {human_bytes(size)} file"
        )

    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = r.string(lambda i=i: f"metadata key #{i}")  # type: ignore[misc]
        vtype = r.u32()
        metadata[key] = _read_value(r, vtype, key, name)

    tensors_raw: list[tuple[str, tuple[int, ...], int, int]] = []
    for i in range(n_tensors):
        tname = r.string(lambda i=i: f"tensor name #{i}")  # type: ignore[misc]
        n_dims = r.u32()
        if n_dims == 0 or n_dims > MAX_DIMS:
            raise GGUFError(f"{name}: corrupt GGUF: tensor '{tname}' has {n_dims} dimensions")
        shape = tuple(r.u64() for _ in range(n_dims))
        ttype = r.u32()
        offset = r.u64()
        tensors_raw.append((tname, shape, ttype, offset))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{name}: corrupt GGUF: invalid alignment {alignment!r}")
    data_offset = (r.pos + alignment - 1) // alignment * alignment

    tensors: list[TensorInfo] = []
    for tname, shape, ttype, offset in tensors_raw:
        if ttype not in GGML_QUANT_SIZES:
            raise GGUFError(f"{name}: unknown tensor type {ttype} in tensor '{tname}'")
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        n_el = 1
        for d in shape:
            if d <= 0 or d > 1 << 40:
                raise GGUFError(f"{name}: corrupt GGUF: tensor '{tname}' has shape {shape}")
            n_el *= d
        if shape[0] % block:
            raise GGUFError(
                f"{name}: corrupt GGUF: tensor '{tname}' row of {shape[0]} is not a multiple "
                f"of the {ggml_type_name(ttype)} block size {block}"
            )
        n_bytes = n_el // block * type_size
        if offset % alignment:
            raise GGUFError(f"{name}: corrupt GGUF: tensor '{tname}' data is misaligned")
        if data_offset + offset + n_bytes > 1 << 50:
            raise GGUFError(f"{name}: corrupt GGUF: tensor '{tname}' lies outside any real file")
        tensors.append(TensorInfo(tname, shape, ttype, offset, n_bytes))

    gf = GGUFFile(
        name, version, metadata, tensors, data_offset, size, r.bytes_fetched, header_end=r.pos
    )
    expected = gf.expected_size
    if expected > size:
        raise GGUFError(
            f"{name}: file is truncated: {human_bytes(expected)} expected, "
            f"{human_bytes(size)} present"
        )
    _check_overlaps(gf, name)
    if check_architecture:
        arch = gf.architecture
        if not arch:
            raise GGUFError(f"{name}: GGUF metadata has no general.architecture")
        if arch not in KNOWN_ARCHITECTURES:
            raise GGUFError(f"{name}: unknown model architecture '{arch}'")
    return gf


def _check_overlaps(gf: GGUFFile, name: str) -> None:
    spans = sorted((t.offset, t.offset + t.n_bytes, t.name) for t in gf.tensors)
    for (_, end_a, name_a), (start_b, _, name_b) in itertools.pairwise(spans):
        if start_b < end_a:
            raise GGUFError(f"{name}: corrupt GGUF: tensors '{name_a}' and '{name_b}' overlap")


# llama.cpp asserts that its vocabulary has no two equal token strings.
_UNIQUE_STRINGS = frozenset({"tokenizer.ggml.tokens"})


def _summarise_strings(r: _Reader, n: int, key: str, name: str) -> ArraySummary:
    unique = key in _UNIQUE_STRINGS
    seen: set[bytes] = set()
    duplicate: int | None = None
    i = 0
    while i < n:
        # The strings in the buffer at once, then one through the reader (it refills).
        batch: list[bytes] | None = [] if unique and duplicate is None else None
        done = r.scan_strings(n - i, batch)
        for j, s in enumerate(batch or (), i):
            if s in seen:
                duplicate = j
                break
            seen.add(s)
        i += done
        if i == n:
            break
        length = r.u64()
        if length > r.size:
            raise GGUFError(f"{name}: corrupt GGUF: a string in '{key}' is too long")
        if not unique or duplicate is not None:
            r.skip(length)
        else:
            s = r.read(length)
            if s in seen:
                duplicate = i
            seen.add(s)
        i += 1
    return ArraySummary(_STRING, n, duplicate)


def _read_value(r: _Reader, vtype: int, key: str, name: str) -> Any:
    if vtype in _SCALARS:
        st = _SCALARS[vtype]
        return st.unpack(r.read(st.size))[0]
    if vtype == _STRING:
        return r.string(lambda: f"metadata value '{key}'")
    if vtype == _ARRAY:
        item_type = r.u32()
        n = r.u64()
        if item_type in _SCALARS:
            item_size = _SCALARS[item_type].size
            if n * item_size > r.size:
                raise GGUFError(f"{name}: corrupt GGUF: array '{key}' claims {n} items")
            if n > MAX_KEPT_ARRAY:
                r.skip(n * item_size)
                return ArraySummary(item_type, n)
            st = struct.Struct(f"<{n}{_SCALARS[item_type].format[1:]}")
            return list(st.unpack(r.read(st.size)))
        if item_type == _STRING:
            if n * 8 > r.size:
                raise GGUFError(f"{name}: corrupt GGUF: array '{key}' claims {n} strings")
            if n > MAX_KEPT_ARRAY:
                return _summarise_strings(r, n, key, name)
            return [r.string(lambda: f"an item of '{key}'") for _ in range(n)]
        if item_type == _ARRAY:
            raise GGUFError(f"{name}: corrupt GGUF: nested arrays in '{key}' are not supported")
        raise GGUFError(f"{name}: corrupt GGUF: array '{key}' has unknown item type {item_type}")
    raise GGUFError(f"{name}: corrupt GGUF: metadata '{key}' has unknown value type {vtype}")


# -- split models (llama.cpp's `-00001-of-0000N.gguf` parts) --------------------------------

_SPLIT_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


def split_names(name: str, count: int) -> list[str] | None:
    """File names of all parts of a split GGUF (llama.cpp's `-00001-of-0000N.gguf` scheme)."""
    m = _SPLIT_NAME.match(name)
    if not m or count < 2:
        return None
    return [f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def merge_splits(parts: Sequence[GGUFFile]) -> GGUFFile:
    """One header with the tensors of every part (weights are spread over the parts)."""
    first = parts[0]
    return replace(
        first,
        tensors=[t for gf in parts for t in gf.tensors],
        file_size=sum(gf.file_size for gf in parts),
        _by_name={},
    )


def split_count(gf: GGUFFile) -> int:
    n = gf.metadata.get("split.count", 1)
    return int(n) if isinstance(n, int) else 1
