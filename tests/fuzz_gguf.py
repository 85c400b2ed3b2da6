"""A seeded corpus of broken copies of a real GGUF model, and a loader that survives them.

`corpus(source, seed, count)` yields mutations of a GGUF file, each a `Mutation` that writes
one broken copy: metadata values (integers set to 0, 1, huge or negative; values of the wrong
type; arrays truncated; keys removed), the tensor table (shapes, types, offsets, tensors
dropped, renamed or an extra block added) and random bit flips in the header. The structure is
read with the `gguf` package's GGUFReader; a mutated header is written back field by field
(the untouched fields byte for byte), followed by the original tensor data.

`LoaderPool` feeds files to the real loader (`engine` validation, the memory estimate and a
llama.cpp load) in a child process, so an abort inside llama.cpp is recorded, not suffered.
tests/engine/test_gguf_fuzz.py runs a small set; scripts/fuzz_gguf.py runs thousands.
"""

from __future__ import annotations

import json
import os
import random
import re
import select
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFValueType

ROOT = Path(__file__).resolve().parent.parent

# -- writing a GGUF from parts -------------------------------------------------------------

_SCALAR_FMT = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


def _string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _value(vtype: GGUFValueType, value: Any, item_type: GGUFValueType | None = None) -> bytes:
    if vtype == GGUFValueType.STRING:
        return _string(value)
    if vtype == GGUFValueType.ARRAY:
        assert item_type is not None
        items = b"".join(_value(item_type, v) for v in value)
        return struct.pack("<IQ", item_type, len(value)) + items
    return struct.pack(_SCALAR_FMT[vtype], value)


def encode_kv(
    key: str, vtype: GGUFValueType, value: Any, item_type: GGUFValueType | None = None
) -> bytes:
    return _string(key) + struct.pack("<I", vtype) + _value(vtype, value, item_type)


@dataclass
class TensorEntry:
    name: str
    shape: list[int]  # ggml order: shape[0] is the row length
    ggml_type: int
    offset: int  # inside the data section

    def encode(self) -> bytes:
        return (
            _string(self.name)
            + struct.pack("<I", len(self.shape))
            + b"".join(struct.pack("<Q", d & (2**64 - 1)) for d in self.shape)
            + struct.pack("<IQ", self.ggml_type, self.offset & (2**64 - 1))
        )


@dataclass
class Layout:
    """A GGUF file as metadata records, tensor records and where its data comes from."""

    kvs: list[tuple[str, bytes]]  # (key, the encoded record)
    tensors: list[TensorEntry]
    source: Path
    data_start: int  # offset of the data section in `source`
    alignment: int = 32
    extra_data: bytes = b""  # appended after the original data (tensors of an extra block)
    version: int = 3

    def header(self) -> bytes:
        head = (
            b"GGUF"
            + struct.pack("<IQQ", self.version, len(self.tensors), len(self.kvs))
            + b"".join(kv for _, kv in self.kvs)
            + b"".join(t.encode() for t in self.tensors)
        )
        return head + b"\0" * (-len(head) % self.alignment)

    def write(self, path: Path) -> None:
        with self.source.open("rb") as src, path.open("wb") as dst:
            dst.write(self.header())
            src.seek(self.data_start)
            shutil.copyfileobj(src, dst, 1 << 22)
            dst.write(self.extra_data)


def read_layout(source: Path, r: GGUFReader | None = None) -> Layout:
    r = r or GGUFReader(source)
    mm = r.data
    kvs: list[tuple[str, bytes]] = []
    for f in r.fields.values():
        if f.name.startswith("GGUF."):  # the reader's pseudo-fields for the header itself
            continue
        end = f.offset + sum(int(p.nbytes) for p in f.parts)
        kvs.append((f.name, bytes(mm[f.offset : end])))
    tensors = [
        TensorEntry(
            t.name,
            [int(d) for d in t.shape],
            int(t.tensor_type),
            int(t.data_offset) - int(r.data_offset),
        )
        for t in r.tensors
    ]
    return Layout(kvs, tensors, source, int(r.data_offset), int(r.alignment))


# -- mutations -----------------------------------------------------------------------------


@dataclass
class Mutation:
    label: str  # what was changed, e.g. "llama.block_count = 0"
    write: Callable[[Path], None]


@dataclass
class _Field:
    name: str
    vtype: GGUFValueType
    item_type: GGUFValueType | None
    value: Any  # scalars and short arrays only; None for the long ones
    length: int


def _fields(r: GGUFReader) -> list[_Field]:
    out = []
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        vtype = f.types[0]
        item = f.types[1] if vtype == GGUFValueType.ARRAY and len(f.types) > 1 else None
        length = len(f.data) if vtype == GGUFValueType.ARRAY else 1
        value = f.contents() if length <= 64 else None
        out.append(_Field(f.name, vtype, item, value, length))
    return out


INT_TYPES = (
    GGUFValueType.UINT8,
    GGUFValueType.INT8,
    GGUFValueType.UINT16,
    GGUFValueType.INT16,
    GGUFValueType.UINT32,
    GGUFValueType.INT32,
    GGUFValueType.UINT64,
    GGUFValueType.INT64,
)
# Values an integer key is set to, with the type that can hold each.
INT_VALUES: tuple[tuple[int, GGUFValueType], ...] = (
    (0, GGUFValueType.UINT32),
    (1, GGUFValueType.UINT32),
    (2, GGUFValueType.UINT32),
    (7, GGUFValueType.UINT32),
    (1000, GGUFValueType.UINT32),
    (2**31 - 1, GGUFValueType.UINT32),
    (2**32 - 1, GGUFValueType.UINT32),
    (2**63 + 5, GGUFValueType.UINT64),
    (-1, GGUFValueType.INT32),
    (-(2**31), GGUFValueType.INT32),
)
WRONG_TYPES: tuple[tuple[GGUFValueType, Any, GGUFValueType | None], ...] = (
    (GGUFValueType.STRING, "thirty", None),
    (GGUFValueType.FLOAT32, 30.5, None),
    (GGUFValueType.BOOL, True, None),
    (GGUFValueType.INT64, 30, None),
    (GGUFValueType.UINT8, 3, None),
    (GGUFValueType.ARRAY, [30, 30], GGUFValueType.UINT32),
    (GGUFValueType.ARRAY, ["a", "b"], GGUFValueType.STRING),
)


class Corpus:
    """Mutations of one source file; `generate(seed, count)` is deterministic."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.reader = GGUFReader(source)
        self.layout = read_layout(source, self.reader)
        self.fields = {f.name: f for f in _fields(self.reader)}
        self.arch = str(self.fields["general.architecture"].value)
        with source.open("rb") as f:
            self.header = f.read(self.layout.data_start)

    # each maker returns one Mutation chosen with `rng`
    def _set(
        self,
        key: str,
        vtype: GGUFValueType,
        value: Any,
        item_type: GGUFValueType | None = None,
        label: str | None = None,
    ) -> Mutation:
        base = self.layout
        kvs = [
            (k, encode_kv(k, vtype, value, item_type) if k == key else rec) for k, rec in base.kvs
        ]
        if key not in self.fields:
            kvs.append((key, encode_kv(key, vtype, value, item_type)))
        shown = f"{value!r}" if vtype != GGUFValueType.ARRAY else f"array[{len(value)}]"
        return self._layout(
            Layout(kvs, base.tensors, base.source, base.data_start, base.alignment),
            label or f"{key} = {shown} ({vtype.name})",
        )

    def _layout(self, layout: Layout, label: str) -> Mutation:
        return Mutation(label, layout.write)

    def int_value(self, rng: random.Random) -> Mutation:
        ints = [f for f in self.fields.values() if f.vtype in INT_TYPES]
        f = rng.choice(ints)
        value, vtype = rng.choice(INT_VALUES)
        return self._set(f.name, vtype, value)

    def wrong_type(self, rng: random.Random) -> Mutation:
        f = rng.choice(list(self.fields.values()))
        vtype, value, item = rng.choice(WRONG_TYPES)
        return self._set(f.name, vtype, value, item)

    def truncate_array(self, rng: random.Random) -> Mutation:
        arrays = [
            f
            for f in self.fields.values()
            if f.vtype == GGUFValueType.ARRAY and f.item_type is not None
        ]
        f = rng.choice(arrays)
        keep = rng.choice((0, 1, f.length // 2, f.length - 1))
        items = self._array_items(f.name, keep)
        assert f.item_type is not None
        return self._set(
            f.name,
            GGUFValueType.ARRAY,
            items,
            f.item_type,
            label=f"{f.name} truncated to {keep} of {f.length} items",
        )

    def _array_items(self, key: str, keep: int) -> list[Any]:
        return list(self.reader.fields[key].contents())[:keep]

    def remove_key(self, rng: random.Random) -> Mutation:
        base = self.layout
        key = rng.choice([k for k, _ in base.kvs])
        kvs = [(k, rec) for k, rec in base.kvs if k != key]
        return self._layout(
            Layout(kvs, base.tensors, base.source, base.data_start, base.alignment),
            f"{key} removed",
        )

    def special_token(self, rng: random.Random) -> Mutation:
        n = self.fields["tokenizer.ggml.tokens"].length
        key = rng.choice([k for k in self.fields if k.endswith("_token_id")])
        value = rng.choice((n, n + 1, 2**32 - 1))
        return self._set(key, GGUFValueType.UINT32, value)

    def tensor_shape(self, rng: random.Random) -> Mutation:
        i, t = self._pick_tensor(rng)
        shape = list(t.shape)
        how = rng.choice(("+1", "-1", "x2", "swap", "dim", "zero"))
        d = rng.randrange(len(shape))
        if how == "+1":
            shape[d] += 1
        elif how == "-1":
            shape[d] -= 1
        elif how == "x2":
            shape[d] *= 2
        elif how == "swap" and len(shape) > 1:
            shape.reverse()
        elif how == "dim":
            shape.append(1)
        else:
            shape[d] = 0
        return self._tensors(
            i,
            TensorEntry(t.name, shape, t.ggml_type, t.offset),
            f"tensor {t.name} shape {t.shape} -> {shape}",
        )

    def tensor_type(self, rng: random.Random) -> Mutation:
        i, t = self._pick_tensor(rng)
        new = rng.choice((0, 1, 2, 3, 8, 12, 14, 30, 39, 4, 200))
        return self._tensors(
            i,
            TensorEntry(t.name, t.shape, new, t.offset),
            f"tensor {t.name} type {t.ggml_type} -> {new}",
        )

    def tensor_offset(self, rng: random.Random) -> Mutation:
        i, t = self._pick_tensor(rng)
        new = rng.choice((0, t.offset + 32, t.offset + 1, 2**40, 2**64 - 32))
        return self._tensors(
            i,
            TensorEntry(t.name, t.shape, t.ggml_type, new),
            f"tensor {t.name} offset {t.offset} -> {new}",
        )

    def tensor_rename(self, rng: random.Random) -> Mutation:
        i, t = self._pick_tensor(rng)
        new = rng.choice(
            (
                "blk.99.attn_q.weight",
                t.name + ".x",
                "output.weight",
                "blk.0.attn_q.weight",
                t.name.replace("blk.", "blk.3"),
            )
        )
        return self._tensors(
            i, TensorEntry(new, t.shape, t.ggml_type, t.offset), f"tensor {t.name} renamed {new}"
        )

    def tensor_drop(self, rng: random.Random) -> Mutation:
        i, t = self._pick_tensor(rng)
        base = self.layout
        tensors = base.tensors[:i] + base.tensors[i + 1 :]
        return self._layout(
            Layout(base.kvs, tensors, base.source, base.data_start, base.alignment),
            f"tensor {t.name} removed",
        )

    def extra_block(self, rng: random.Random) -> Mutation:
        """A copy of the last block's tensors as block N, their data appended."""
        base = self.layout
        # "blk.N." in a model, "v.blk.N." / "a.blk.N." in a projector's encoders.
        blocks = [m for t in base.tensors if (m := _BLOCK.match(t.name))]
        prefix = max(blocks, key=lambda m: int(m.group(2))).group(1)
        last = max(int(m.group(2)) for m in blocks if m.group(1) == prefix)
        end = self.source.stat().st_size - base.data_start
        extra, new = bytearray(), []
        with self.source.open("rb") as f:
            for t in base.tensors:
                if not t.name.startswith(f"{prefix}.{last}."):
                    continue
                nxt = min((u.offset for u in base.tensors if u.offset > t.offset), default=end)
                f.seek(base.data_start + t.offset)
                extra += b"\0" * (-len(extra) % base.alignment)
                new.append(
                    TensorEntry(
                        t.name.replace(f"{prefix}.{last}.", f"{prefix}.{last + 1}.", 1),
                        t.shape,
                        t.ggml_type,
                        end + len(extra),
                    )
                )
                extra += f.read(nxt - t.offset)
        bump = rng.random() < 0.5
        layout = Layout(
            base.kvs, base.tensors + new, base.source, base.data_start, base.alignment, bytes(extra)
        )
        if bump:  # and block_count raised to match (a projector's is its encoder's)
            keys = [k for k, _ in layout.kvs if k.endswith("block_count")]
            key = f"{self.arch}.block_count" if f"{self.arch}.block_count" in keys else keys[0]
            layout.kvs = [
                (k, encode_kv(k, GGUFValueType.UINT32, last + 2) if k == key else rec)
                for k, rec in layout.kvs
            ]
        return self._layout(
            layout, f"extra block {last + 1}" + (" and block_count raised" if bump else "")
        )

    def bit_flips(self, rng: random.Random) -> Mutation:
        n = rng.choice((1, 1, 2, 4, 8, 32))
        header = bytearray(self.header)
        spots = sorted(rng.randrange(len(header)) for _ in range(n))
        for pos in spots:
            header[pos] ^= 1 << rng.randrange(8)
        data = bytes(header)
        source, start = self.source, self.layout.data_start

        def write(path: Path) -> None:
            with source.open("rb") as src, path.open("wb") as dst:
                dst.write(data)
                src.seek(start)
                shutil.copyfileobj(src, dst, 1 << 22)

        return Mutation(f"{n} bit flips at {spots[:4]}{'...' if n > 4 else ''}", write)

    def _pick_tensor(self, rng: random.Random) -> tuple[int, TensorEntry]:
        i = rng.randrange(len(self.layout.tensors))
        return i, self.layout.tensors[i]

    def _tensors(self, i: int, entry: TensorEntry, label: str) -> Mutation:
        base = self.layout
        tensors = list(base.tensors)
        tensors[i] = entry
        return self._layout(
            Layout(base.kvs, tensors, base.source, base.data_start, base.alignment), label
        )

    MAKERS = (
        "int_value",
        "int_value",
        "int_value",
        "wrong_type",
        "truncate_array",
        "remove_key",
        "special_token",
        "tensor_shape",
        "tensor_type",
        "tensor_offset",
        "tensor_rename",
        "tensor_drop",
        "extra_block",
        "bit_flips",
        "bit_flips",
        "bit_flips",
    )

    def generate(self, seed: int, count: int) -> Iterator[Mutation]:
        rng = random.Random(seed)
        # A projector has no vocabulary: its special-token ids are not there to break.
        makers = tuple(
            m if m != "special_token" or "tokenizer.ggml.tokens" in self.fields else "int_value"
            for m in self.MAKERS
        )
        for _ in range(count):
            maker: Callable[[random.Random], Mutation] = getattr(self, rng.choice(makers))
            yield maker(rng)


_BLOCK = re.compile(r"^((?:[a-z]+\.)?blk)\.(\d+)\.")


# -- feeding files to the loader in a child ------------------------------------------------

_WORKER = r"""
import json, sys, traceback
from engine.model.gguf import GGUFError
from engine.memory.estimate import estimate
from engine.memory.params import EstimateParams
from engine.errors import EngineError
from engine.settings import LoadParams
from engine.host.runtime import Model
for line in sys.stdin:
    path = line.rstrip("\n")
    try:
        estimate(path, EstimateParams(LoadParams(n_ctx=256)))
        with Model(path, LoadParams(n_ctx=256, n_threads=1, n_batch=64, n_ubatch=64,
                                    state_cache_mb=0)):
            pass
        out = {"outcome": "loaded"}
    except (GGUFError, EngineError) as e:
        out = {"outcome": "refused", "message": str(e)}
    except Exception:
        out = {"outcome": "traceback", "message": traceback.format_exc()}
    sys.stdout.write("FUZZ " + json.dumps(out) + "\n")
    sys.stdout.flush()
"""


@dataclass
class Result:
    label: str
    outcome: str  # loaded, refused, traceback, crash, hang
    message: str = ""
    seconds: float = 0.0


@dataclass
class LoaderPool:
    """One child process that loads files in turn; restarted after a crash or a hang."""

    timeout_s: float = 60.0
    _proc: subprocess.Popen[str] | None = field(default=None, repr=False)

    def _start(self) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
        return subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=ROOT,
        )

    def load(self, path: Path, label: str) -> Result:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        t0 = time.monotonic()
        proc.stdin.write(f"{path}\n")
        proc.stdin.flush()
        while True:
            left = self.timeout_s - (time.monotonic() - t0)
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
            if not ready:
                self.close()
                return Result(
                    label, "hang", f"no answer in {self.timeout_s:.0f} s", time.monotonic() - t0
                )
            line = proc.stdout.readline()
            if not line:  # the child died
                rc = proc.wait()
                self.close()
                how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
                return Result(label, "crash", how, time.monotonic() - t0)
            if line.startswith("FUZZ "):
                out = json.loads(line[5:])
                return Result(label, out["outcome"], out.get("message", ""), time.monotonic() - t0)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


@dataclass
class CliLoader:
    """Each file through the real command line, as a user runs it: `candlewick run FILE`.
    Exit code 0 is a load, 2 with one line on stderr a refusal; a signal is a crash, a
    Python traceback on stderr a traceback, no exit within the timeout a hang."""

    home: Path
    timeout_s: float = 60.0
    # Fuzz projectors: each file is given as `--mmproj` to this (sound) model.
    projector_for: Path | None = None

    def load(self, path: Path, label: str) -> Result:
        env = {
            **os.environ,
            "CANDLEWICK_HOME": str(self.home),
            "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path]),
        }
        t0 = time.monotonic()
        try:
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "app.cli",
                    "run",
                    *(
                        (str(self.projector_for), "Hi", "--mmproj", str(path))
                        if self.projector_for is not None
                        else (str(path), "Hi")
                    ),
                    "--max-tokens",
                    "2",
                    "--threads",
                    "1",
                ],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                env=env,
                cwd=ROOT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return Result(
                label, "hang", f"no exit in {self.timeout_s:.0f} s", time.monotonic() - t0
            )
        took = time.monotonic() - t0
        err = r.stderr.strip()
        if r.returncode < 0:
            return Result(label, "crash", f"signal {-r.returncode}: {err[-300:]}", took)
        if "Traceback (most recent call last)" in r.stderr:
            return Result(label, "traceback", err[-2000:], took)
        if r.returncode == 0:
            return Result(label, "loaded", "", took)
        if r.returncode == 2:
            return Result(label, "refused", err.removeprefix("candlewick: error: "), took)
        return Result(label, "traceback", f"exit code {r.returncode}: {err[-300:]}", took)

    def close(self) -> None:
        pass


def run_corpus(
    source: Path,
    seed: int,
    count: int,
    work: Path,
    *,
    timeout_s: float = 60.0,
    cli: bool = False,
    on_result: Callable[[Result], None] | None = None,
    projector_for: Path | None = None,
) -> list[Result]:
    """Write each mutation to `work`, load it (in the loader child, or through the command
    line with `cli`), delete it; one Result each. `projector_for`: `source` is a projector,
    each mutation loaded through the command line as this model's `--mmproj`."""
    corpus = Corpus(source)
    pool: LoaderPool | CliLoader = (
        CliLoader(work / "home", timeout_s, projector_for)
        if cli or projector_for is not None
        else LoaderPool(timeout_s)
    )
    results = []
    path = work / "fuzzed.gguf"
    try:
        for m in corpus.generate(seed, count):
            m.write(path)
            res = pool.load(path, m.label)
            results.append(res)
            if on_result is not None:
                on_result(res)
    finally:
        pool.close()
        path.unlink(missing_ok=True)
    return results


def is_one_line(message: str) -> bool:
    return bool(message.strip()) and "\n" not in message.strip()


__all__ = ["CliLoader", "Corpus", "LoaderPool", "Mutation", "Result", "is_one_line", "run_corpus"]
