"""The dry run: llama.cpp sizes its buffers without reading weights or allocating.

llama.cpp creates the model and context with `no_alloc=True` and `load_mode=NONE`, so it reads
no weights and allocates nothing, but logs the sizes of the KV cache, compute and output
buffers it would allocate (~0.1-0.5 s). With the mmap load mode this aborts the process inside
llama.cpp, so the load mode is always NONE here.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import EngineError
from engine.memory.buffer_log import BUFFER_LINE, CACHE_SIZE_LINE, device_of, mib
from engine.memory.params import EstimateParams
from engine.native import llama_lib, native_load
from engine.native.load_probe import run_in_child
from engine.native.native_load import NativeLoad
from engine.settings import FLASH_TYPES, KV_TYPES, resolve_flash_attn, use_extra_buffers


@dataclass(frozen=True)
class DryRun:
    kv_bytes: int
    compute: dict[str, int]  # device -> bytes
    output: dict[str, int]
    log: tuple[str, ...] = field(repr=False, default=())


# One dry run at a time: the log capture collects lines from every thread, and two dry runs
# would read each other's buffer sizes. (A real load running meanwhile can still interleave.)
_dry_run_lock = threading.Lock()


def dry_run(path: str | os.PathLike[str], p: EstimateParams, n_gpu_layers: int = 0) -> DryRun:
    """Let llama.cpp size its buffers without reading weights or allocating (see module doc).

    On a build that can offload (CUDA), this llama.cpp's no-alloc load crashes the process
    with a segmentation fault more often than not (seen on an H200, CUDA 13: 12 of 13
    processes), so there it runs in a child process and a crash becomes an EngineError.
    """
    if llama_lib.supports_gpu_offload():
        return _dry_run_in_child(path, p, n_gpu_layers)
    return _dry_run_here(path, p, n_gpu_layers)


def _native_load(path: str | os.PathLike[str], p: EstimateParams, n_gpu_layers: int) -> NativeLoad:
    """The no-alloc load both dry runs make, from the estimate's settings."""
    p.validate()
    return NativeLoad(
        path=str(path),
        n_gpu_layers=n_gpu_layers,
        use_extra_bufts=use_extra_buffers(p.load.extra_buffers),
        n_ctx=p.load.n_ctx,
        n_batch=p.load.n_batch,
        n_ubatch=p.load.n_ubatch,
        n_seq_max=p.load.n_seq_max,
        flash_attn_type=FLASH_TYPES[resolve_flash_attn(p.load.flash_attn, p.load.type_v)],
        type_k=KV_TYPES[p.load.type_k],
        type_v=KV_TYPES[p.load.type_v],
        embeddings=p.load.embeddings,
        swa_full=p.swa_full,
        kv_unified=p.kv_unified,
    )


def _dry_run_result(path: str | os.PathLike[str], stage: str, lines: Sequence[str]) -> DryRun:
    name = Path(path).name
    if stage == "model":
        raise EngineError(f"llama.cpp could not read {name}: {llama_lib.last_error(list(lines))}")
    if stage != "ok":
        raise EngineError(
            f"llama.cpp could not size a context for {name}: {llama_lib.last_error(list(lines))}"
        )
    return _sizes_from_log(tuple(lines))


def _dry_run_in_child(path: str | os.PathLike[str], p: EstimateParams, n_gpu_layers: int) -> DryRun:
    res = run_in_child(_native_load(path, p, n_gpu_layers), doing="sizing")
    return _dry_run_result(path, res.stage, res.log)


def _dry_run_here(path: str | os.PathLike[str], p: EstimateParams, n_gpu_layers: int = 0) -> DryRun:
    load = _native_load(path, p, n_gpu_layers)
    with _dry_run_lock, llama_lib.capture_log() as lines:
        stage = native_load.load_no_alloc(llama_lib.lib(), load)
    return _dry_run_result(path, stage, lines)


def _sizes_from_log(lines: tuple[str, ...]) -> DryRun:
    """The buffer sizes llama.cpp logged while creating a context."""
    kv = 0
    compute: dict[str, int] = {}
    output: dict[str, int] = {}
    for line in lines:
        m = CACHE_SIZE_LINE.search(line.strip())
        if m:
            kv += mib(m.group(2))
            continue
        b = BUFFER_LINE.search(line)
        if b and b.group(2) in ("compute", "output"):
            target = compute if b.group(2) == "compute" else output
            dev = device_of(b.group(1))
            target[dev] = target.get(dev, 0) + mib(b.group(3))
    return DryRun(kv, compute, output, lines)
