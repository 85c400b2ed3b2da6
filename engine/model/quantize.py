"""Make a quant of a GGUF model here, with llama.cpp's own quantizer.

`quantize_file(source, target, "Q4_K_M")` checks the source like any model file, refuses an
unknown type and (unless allowed) requantizing an already quantized file
(engine.model.quant_types), then runs `llama_model_quantize` in a child process
(engine.native.quantize_process: progress per tensor, cancellable). The child writes a hidden
temporary file beside the target; it becomes the target only once it passes the checks any
model file gets (engine.model.gguf, engine.model.semantics) and its size is exactly its header
and tensor table's. A failed or cancelled run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.model.gguf import (
    GGUFError,
    GGUFFile,
    human_bytes,
    merge_splits,
    read_gguf,
    split_count,
    split_names,
)
from engine.model.quant_types import (
    QuantizeError,
    QuantType,
    check_requantize,
    estimate_size,
    layout_size,
    parse_quant_type,
    source_quant,
)
from engine.model.semantics import check_model
from engine.native.quantize_child import QuantizeJob
from engine.native.quantize_process import Progress, QuantizeCancelled, run_quantize

# Free space asked beyond the estimate, which a K-quant mix exceeds by a few percent.
SPACE_MARGIN = 1.10


@dataclass(frozen=True)
class QuantizeResult:
    """A quant made: where it is and what it is."""

    source: Path
    output: Path
    qtype: str  # "Q4_K_M"
    size_bytes: int
    seconds: float
    n_weights: int  # elements in all tensors
    tensor_types: dict[str, int] = field(default_factory=dict)  # type name -> tensors

    @property
    def bits_per_weight(self) -> float:
        return self.size_bytes * 8 / max(self.n_weights, 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "output": str(self.output),
            "type": self.qtype,
            "size_bytes": self.size_bytes,
            "bits_per_weight": round(self.bits_per_weight, 3),
            "seconds": round(self.seconds, 3),
            "tensor_types": dict(self.tensor_types),
        }


def read_source(source: Path) -> GGUFFile:
    """The source's header, every part of a split model merged; GGUFError when unusable."""
    gf = read_gguf(source)
    check_model(gf)
    names = split_names(source.name, split_count(gf))
    if names:
        if names[0] != source.name:
            raise QuantizeError(f"{source.name} is part of a split model: give its first part")
        parts = [gf, *(read_gguf(source.with_name(n)) for n in names[1:])]
        gf = merge_splits(parts)
    return gf


def quantize_file(
    source: Path,
    target: Path,
    qtype: str | QuantType,
    *,
    allow_requantize: bool = False,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    threads: int = 0,
) -> QuantizeResult:
    """Make `target` from `source` in `qtype`. `progress(done, total)` is called with tensors
    as they are written (from this thread), `cancel` stops the work (QuantizeCancelled). Raises
    QuantizeError (RequantizeRefused for a refusal `allow_requantize` lifts) for what is
    refused, GGUFError for a broken source, EngineError when llama.cpp fails."""
    target_type = qtype if isinstance(qtype, QuantType) else parse_quant_type(qtype)
    source, target = Path(source), Path(target)
    try:
        gf = read_source(source)
    except GGUFError as e:
        raise QuantizeError(str(e)) from None
    src = source_quant(gf)
    check_requantize(src, target_type, source.name, allow_requantize=allow_requantize)
    if target.exists():
        raise QuantizeError(f"{target} already exists; choose another output")
    if not target.parent.is_dir():
        raise QuantizeError(f"no such folder: {target.parent}")
    need = int(estimate_size(gf, target_type) * SPACE_MARGIN)
    free = shutil.disk_usage(target.parent).free
    if need > free:
        raise QuantizeError(
            f"not enough disk space for {target.name}: about {human_bytes(need)} needed, "
            f"{human_bytes(free)} free in {target.parent}"
        )
    partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
    job = QuantizeJob(
        source=str(source),
        target=str(partial),
        file_type=int(target_type.file_type),
        # Whether to requantize was decided above; llama.cpp asks again, per tensor.
        allow_requantize=True,
        threads=threads,
    )
    started = time.monotonic()
    try:
        run_quantize(job, progress=progress, cancel=cancel)
        if cancel is not None and cancel.is_set():
            raise QuantizeCancelled(f"quantizing {source.name} was cancelled")
        made = _validated(partial, gf, target_type, target.name)
        if target.exists():  # made meanwhile by someone else: theirs stays
            raise QuantizeError(f"{target} already exists; choose another output")
        os.replace(partial, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    types = Counter(t.type_name for t in made.tensors)
    return QuantizeResult(
        source=source,
        output=target,
        qtype=target_type.name,
        size_bytes=made.file_size,
        seconds=time.monotonic() - started,
        n_weights=sum(t.n_elements for t in made.tensors),
        tensor_types=dict(types.most_common()),
    )


def _validated(path: Path, source: GGUFFile, target: QuantType, name: str) -> GGUFFile:
    """The made file checked like any model file, and against what was asked for."""
    try:
        made = read_gguf(path)
        check_model(made)
    except GGUFError as e:
        raise QuantizeError(f"the quantized file is not usable: {_without_name(e, path)}") from None
    if made.file_size != layout_size(made):
        raise QuantizeError(
            f"the quantized file is {human_bytes(made.file_size)}, its tensor table says "
            f"{human_bytes(layout_size(made))} (a full disk?)"
        )
    if sorted(t.name for t in made.tensors) != sorted(t.name for t in source.tensors):
        raise QuantizeError(f"{name} does not hold the source's tensors")
    if made.metadata.get("general.file_type") != int(target.file_type):
        raise QuantizeError(f"{name} was not made as {target.name}")
    return made


def _without_name(e: GGUFError, path: Path) -> str:
    return str(e).removeprefix(f"{path.name}: ")
