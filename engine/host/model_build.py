"""How a `Model` comes to be: its load settings resolved for the file, the weights loaded
and its context created through llama.cpp's C API, and what this build and CPU do with them
probed (flash attention, batch invariance, what was allocated). `Model` is the loaded
object; this module is its construction, so the class keeps to what a loaded model does."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import EngineError, LoadCancelled
from engine.memory import cpu_kernels, hardware
from engine.memory.actual import ActualMemory, actual_from_log
from engine.memory.estimate import fit_gpu_layers
from engine.memory.params import EstimateParams
from engine.model.facts import embedding_pooling
from engine.model.gguf import GGUFFile
from engine.native import llama_lib
from engine.native.native_load import NativeLoad
from engine.settings import (
    FLASH_TYPES,
    KV_TYPES,
    FlashAttn,
    GpuLayers,
    LoadParams,
    default_threads,
    use_extra_buffers,
)

if TYPE_CHECKING:
    from engine.native.load_probe import FirstLoads

ProgressCallback = Callable[[float], None]


@dataclass
class LoadInfo:
    path: str
    load_s: float
    n_ctx: int
    n_gpu_layers: int
    n_layer: int
    n_threads: int
    log: list[str] = field(default_factory=list)


def resolve_params(params: LoadParams, gguf: GGUFFile) -> tuple[LoadParams, bool]:
    """The settings a file is loaded with, and whether it is a sentence-embedding model (its
    file says how it pools): its one context computes pooled vectors, the whole input in one
    batch (its attention is not causal), and nothing is ever generated from it
    (engine.server.embeddings uses it)."""
    params.validate()
    if embedding_pooling(gguf) <= 0:
        return params, False
    train = int(gguf.arch_value("context_length", 0) or 0) or 512
    n = min(params.n_ctx or train, train)
    return (
        replace(
            params,
            n_ctx=n,
            n_seq_max=1,
            n_batch=n,
            n_ubatch=n,
            embeddings=True,
            speculative=None,
            state_cache_mb=0,  # no prompt to keep: nothing is generated from it
        ),
        True,
    )


@dataclass(frozen=True)
class ContextShape:
    """What every context of a loaded model shares (a recreated one too): its settings,
    threads and resolved flash attention."""

    params: LoadParams
    n_threads: int
    flash: FlashAttn

    def context_params(self, n_ctx: int, n_seq_max: int) -> Any:
        """llama.cpp's context parameters for `n_seq_max` sequences over `n_ctx` cells."""
        C = llama_lib.lib()
        p = self.params
        cp = C.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = p.n_batch
        cp.n_ubatch = min(p.n_ubatch, p.n_batch)
        cp.n_seq_max = n_seq_max
        cp.n_threads = self.n_threads
        cp.n_threads_batch = p.n_threads_batch or self.n_threads
        cp.flash_attn_type = FLASH_TYPES[self.flash]
        cp.type_k = KV_TYPES[p.type_k]
        cp.type_v = KV_TYPES[p.type_v]
        cp.embeddings = p.embeddings
        cp.no_perf = False
        return cp


@dataclass
class Loaded:
    """The weights and first context of a model, and what the load found out."""

    model_ptr: Any
    vocab: Any
    ctx: Any
    shape: ContextShape
    memory_actual: ActualMemory
    load_info: LoadInfo
    amx_weights: bool  # AMX kernels in use: the verification cost differs (speculative)
    column_kernels: bool  # ... and the project's column kernels (cpu_kernels.column_kernels_take)
    flash_attn_on: bool  # what llama.cpp did with flash attention ('auto' resolved)
    # Whether greedy output is the same however tokens are batched, for these settings on
    # this build and CPU (engine.memory.cpu_kernels); tests and speculation rely on nothing
    # else.
    exactness: cpu_kernels.Exactness
    # Which ways of cutting a prompt into batches keep its logits (engine.host.batch_plan).
    split_rule: cpu_kernels.SplitRule


def load(
    path: Path,
    params: LoadParams,
    gguf: GGUFFile,
    *,
    progress: ProgressCallback | None,
    cancel: threading.Event | None,
    first_loads: FirstLoads | None,
) -> Loaded:
    """Load `path`'s weights and create its context with `params` (resolved). Raises
    LoadCancelled when `cancel` is set meanwhile, EngineError with llama.cpp's reason."""
    C = llama_lib.lib()
    t0 = time.perf_counter()
    rss0 = hardware.process_rss()
    mp = C.llama_model_default_params()
    n_layer = int(gguf.arch_value("block_count", 0) or 0)
    mp.n_gpu_layers = resolve_gpu_layers(params.n_gpu_layers, n_layer, gguf=gguf, params=params)
    mp.load_mode = C.LLAMA_LOAD_MODE_MMAP if params.use_mmap else C.LLAMA_LOAD_MODE_NONE
    mp.use_extra_bufts = extra = use_extra_buffers(params.extra_buffers)
    cpu = cpu_kernels.detect()
    tied = cpu_kernels.tied_output(gguf.tensors)

    def on_progress(p: float, _user: Any) -> bool:
        if cancel is not None and cancel.is_set():
            return False
        if progress is not None:
            with contextlib.suppress(Exception):  # a UI callback must not abort the load
                progress(float(p))
        return True

    cb = C.llama_progress_callback(on_progress)
    mp.progress_callback = cb
    flash = cpu_kernels.resolve_flash_attn_for(
        params.flash_attn,
        gguf,
        params.type_k,
        params.type_v,
        n_ctx=params.n_ctx,
        n_seq_max=params.n_seq_max,
    )
    shape = ContextShape(params, params.n_threads or default_threads(), flash)
    cp = shape.context_params(params.n_ctx, params.n_seq_max)
    if first_loads is not None:
        first_loads.probe_unless_known(_native_load(path, mp, cp))
    with llama_lib.capture_log() as lines:
        if extra and llama_lib.amx_build():
            model = on_passing_thread(lambda: C.llama_model_load_from_file(str(path).encode(), mp))
        else:
            model = C.llama_model_load_from_file(str(path).encode(), mp)
        if not model:
            if cancel is not None and cancel.is_set():
                raise LoadCancelled("loading was cancelled")
            raise EngineError(
                f"llama.cpp could not load {path.name}: {llama_lib.last_error(lines)}"
            )
        ctx = C.llama_init_from_model(model, cp)
        if not ctx:
            C.llama_model_free(model)
            raise EngineError(
                f"llama.cpp could not create a context for {path.name}: "
                f"{llama_lib.last_error(lines)}"
            )
    if first_loads is not None:
        first_loads.remember(path)
    flash_on = _flash_enabled(lines, flash)
    kernels: dict[str, Any] = {
        "extra_buffers": extra,
        "flash_attn": flash_on,
        "type_k": params.type_k,
        "type_v": params.type_v,
        "gpu_layers": mp.n_gpu_layers,
        "tied_output": tied,
    }
    return Loaded(
        model_ptr=model,
        vocab=C.llama_model_get_vocab(model),
        ctx=ctx,
        shape=shape,
        # What llama.cpp really allocated, for "estimated X, actual Y" (engine.memory).
        memory_actual=actual_from_log(
            lines, rss_growth_bytes=hardware.process_rss() - rss0 if rss0 else None
        ),
        load_info=LoadInfo(
            path=str(path),
            load_s=time.perf_counter() - t0,
            n_ctx=int(C.llama_n_ctx(ctx)),
            n_gpu_layers=mp.n_gpu_layers,
            n_layer=n_layer,
            n_threads=shape.n_threads,
            log=list(lines),
        ),
        amx_weights=extra and cpu.amx_int8,
        column_kernels=mp.n_gpu_layers == 0
        and cpu_kernels.column_kernels_take(
            gguf.tensors, cpu, extra_buffers=extra, tied_output=tied
        ),
        flash_attn_on=flash_on,
        exactness=cpu_kernels.batch_exactness(gguf.tensors, cpu, **kernels),
        split_rule=cpu_kernels.split_rule(gguf.tensors, cpu, **kernels),
    )


def _native_load(path: Path, mp: Any, cp: Any) -> NativeLoad:
    """The probe's copy of a real load's settings. Layers stay on the CPU: this llama.cpp's
    no-alloc load with offload crashes on CUDA builds (engine.memory.dry_run), and what a
    broken file trips over (header, vocabulary, tensors, the graph) is the same there."""
    return NativeLoad(
        path=str(path),
        n_gpu_layers=0,
        use_extra_bufts=bool(mp.use_extra_bufts),
        n_ctx=int(cp.n_ctx),
        n_batch=int(cp.n_batch),
        n_ubatch=int(cp.n_ubatch),
        n_seq_max=int(cp.n_seq_max),
        flash_attn_type=int(cp.flash_attn_type),
        type_k=int(cp.type_k),
        type_v=int(cp.type_v),
        embeddings=bool(cp.embeddings),
        swa_full=bool(cp.swa_full),
        kv_unified=bool(cp.kv_unified),
    )


def on_passing_thread(fn: Callable[[], Any]) -> Any:
    """Run `fn` on a thread that ends when it returns.

    Repacking weights for AMX runs on an OpenMP team that belongs to the calling thread and
    lives as long as it does. If that thread is not the one that decodes (a server's
    scheduler, the benchmark's), the process then has more OpenMP workers than cores, libgomp
    stops letting idle workers spin, and decoding runs several times slower (SmolLM2 through
    the scheduler: 24 t/s instead of 150). A loader thread that ends takes its team along.
    """
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # re-raised on the caller's thread
            box.append(e)

    t = threading.Thread(target=run, name="candlewick-load-weights")
    t.start()
    t.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _flash_enabled(lines: Sequence[str], resolved: FlashAttn) -> bool:
    """What llama.cpp did with flash attention ('auto' is its own choice), from its log."""
    for line in lines:
        if "flash_attn" in line and "=" in line:
            value = line.split("=", 1)[1].strip()
            if value in ("enabled", "disabled"):
                return value == "enabled"
    return resolved == "on"


def resolve_gpu_layers(
    requested: GpuLayers,
    n_layer: int,
    *,
    gguf: GGUFFile | None = None,
    params: LoadParams | None = None,
) -> int:
    """Turn 'all'/'auto'/N into the layer count llama.cpp gets.

    'all' offloads every repeating layer plus the output layer (n_layer + 1). 'auto' offloads
    nothing on a build that cannot offload; otherwise, given the model header and settings, as
    many layers as fit in the GPUs' free memory minus a margin (engine.memory), else all.
    """
    if requested == "all":
        return n_layer + 1 if n_layer else 999
    if requested == "auto":
        if not llama_lib.supports_gpu_offload():
            return 0
        if gguf is not None and params is not None:
            return fit_gpu_layers(gguf, EstimateParams(params), hardware.detect())
        return n_layer + 1 if n_layer else 999
    return int(requested)


__all__ = [
    "ContextShape",
    "LoadInfo",
    "Loaded",
    "ProgressCallback",
    "load",
    "on_passing_thread",
    "resolve_gpu_layers",
    "resolve_params",
]
