"""How much memory a model will take, where it goes, and whether it fits — before loading it.

Two methods, both kept (docs/memory.md explains the model and shows estimate vs actual):

* **dry run** (local files; on builds that can offload only when asked for, in a child
  process, see `dry_run`): llama.cpp creates the model and context with `no_alloc=True` and
  `load_mode=NONE`, so it reads no weights and allocates nothing, but logs the sizes of the KV
  cache, compute and output buffers it would allocate (~0.1-0.5 s). With the mmap load mode
  this aborts the process inside llama.cpp, so the load mode is always NONE here.
* **analytic** (from GGUF metadata alone: remote files, and a cross-check): weights per tensor
  from the tensor table; KV per layer `row_size(type, head_dim * n_head_kv) * cells` with
  sliding-window layers and `swa_full`; the context padded to 256; the output buffer; and a
  compute-buffer model (the logits of a full micro-batch dominate small models with big
  vocabularies).

`total_bytes` is what llama.cpp itself allocates (the sum of its buffers, the number a real load
logs). `overhead_bytes` is extra the runtime needs outside those buffers (a GPU driver context)
and only enters the fit check. Layers are split over devices as this llama.cpp does it: the
output layer is offloaded first, the input embedding always stays on the CPU, GPUs share the
offloaded layers in proportion to their free memory.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import EngineError
from engine.memory import cpu_kernels
from engine.memory.cpu_kernels import CpuFeatures
from engine.memory.hardware import Device, GiB, Hardware, MiB
from engine.memory.hardware import detect as detect_hardware
from engine.model.facts import swa_layer_pattern
from engine.model.gguf import (
    ArraySummary,
    GGUFFile,
    TensorInfo,
    merge_splits,
    read_gguf,
    split_count,
    split_names,
)
from engine.model.semantics import check_model
from engine.native import llama_lib, native_load
from engine.native.load_probe import run_in_child
from engine.native.native_load import NativeLoad
from engine.settings import (
    FLASH_TYPES,
    KV_TYPES,
    FlashAttn,
    GpuLayers,
    LoadParams,
    resolve_flash_attn,
    use_extra_buffers,
)

Method = Literal["dry-run", "analytic"]
Verdict = Literal["fits_gpu", "partial_offload", "ram_only", "does_not_fit"]
CPU = "CPU"
CTX_PAD = 256  # llama.cpp pads the context (and the SWA cache) to a multiple of 256
# GPU memory a process uses outside llama.cpp's buffers once it has loaded a model: cuBLAS
# handles and workspace, the CUDA memory pool, graphs. Measured on an H200 (CUDA 13,
# docs/gpu.md): 15-125 MiB per model plus 68 MiB kept after the first one. The CUDA context
# itself (527 MiB there) is not counted: detecting the GPU creates it, so the free memory the
# plan starts from is already net of it.
GPU_RUNTIME_OVERHEAD = 300 * MiB
VERDICT_TEXT: dict[Verdict, str] = {
    "fits_gpu": "fits on GPU",
    "partial_offload": "fits with partial offload",
    "ram_only": "fits in RAM only",
    "does_not_fit": "does not fit",
}


class DoesNotFitError(EngineError):
    """The estimate says the model does not fit; `str()` is the reason in words."""


@dataclass(frozen=True)
class EstimateParams:
    """The load settings that change memory use (a subset of `LoadParams`, plus fit options)."""

    n_ctx: int = 4096
    n_gpu_layers: GpuLayers = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: FlashAttn = "auto"
    n_seq_max: int = 1
    n_batch: int = 512
    n_ubatch: int = 512
    embeddings: bool = False
    swa_full: bool = True  # this llama.cpp's default: sliding-window layers cache the full context
    kv_unified: bool = False
    extra_buffers: bool | None = None
    margin_bytes: int | None = None  # kept free on every device; None = default_margin()

    @classmethod
    def from_load_params(cls, p: LoadParams, **overrides: Any) -> EstimateParams:
        base = cls(
            n_ctx=p.n_ctx,
            n_gpu_layers=p.n_gpu_layers,
            type_k=p.type_k,
            type_v=p.type_v,
            flash_attn=p.flash_attn,
            n_seq_max=p.n_seq_max,
            n_batch=p.n_batch,
            n_ubatch=p.n_ubatch,
            embeddings=p.embeddings,
            extra_buffers=p.extra_buffers,
        )
        return replace(base, **overrides)

    def to_load_params(self, **overrides: Any) -> LoadParams:
        base = LoadParams(
            n_ctx=self.n_ctx,
            n_gpu_layers=self.n_gpu_layers,
            type_k=self.type_k,
            type_v=self.type_v,
            flash_attn=self.flash_attn,
            n_seq_max=self.n_seq_max,
            n_batch=self.n_batch,
            n_ubatch=self.n_ubatch,
            embeddings=self.embeddings,
            extra_buffers=self.extra_buffers,
        )
        return replace(base, **overrides)

    def validate(self) -> None:
        self.to_load_params().validate()
        if self.margin_bytes is not None and self.margin_bytes < 0:
            raise EngineError("the safety margin cannot be negative")


def default_margin(total_bytes: int) -> int:
    """Memory kept free on a device: 5% of it, at least 64 MiB and at most 1 GiB."""
    return int(min(max(total_bytes * 0.05, 64 * MiB), GiB))


# -- what the estimate needs to know about a model ------------------------------------------

_BLK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class ModelSpec:
    """The numbers memory depends on, from the GGUF header alone."""

    name: str
    architecture: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: tuple[int, ...]  # per layer
    head_dim_k: int
    head_dim_v: int
    n_swa: int
    swa_layers: tuple[bool, ...]
    n_vocab: int
    n_ctx_train: int
    layer_bytes: tuple[int, ...]  # weights of each repeating layer
    input_bytes: int  # token embedding and anything else outside the layers (stays on the CPU)
    output_bytes: int  # output norm + output matrix
    tied_output_bytes: int  # token embedding duplicated on the output device when tied
    recurrent: bool  # has a recurrent state (Mamba, RWKV, hybrids): not modelled analytically
    # Repacked copies (AMX or CPU_REPACK, `engine.memory.cpu_kernels`) of each CPU layer's matrices
    # and of the output matrix, made when extra buffers are on; and the buffers they go to.
    copy_layer_bytes: tuple[int, ...] = ()
    copy_output_bytes: int = 0
    copy_buffers: tuple[str, ...] = ()

    @property
    def weights_bytes(self) -> int:
        return self.input_bytes + sum(self.layer_bytes) + self.output_bytes

    @classmethod
    def from_gguf(cls, gf: GGUFFile, cpu: CpuFeatures | None = None) -> ModelSpec:
        """`cpu`: the features whose extra-buffer rules apply (default: this build's)."""
        feats = cpu if cpu is not None else cpu_kernels.detect()
        buffers: set[str] = set()

        def copied(t: TensorInfo, tied: bool = False) -> int:
            buf = cpu_kernels.extra_buffer(t, feats, tied_output=tied)
            if buf is None:
                return 0
            buffers.add(buf)
            return cpu_kernels.copy_bytes(t, buf)

        n_layer = int(gf.arch_value("block_count", 0) or 0)
        n_embd = int(gf.arch_value("embedding_length", 0) or 0)
        heads = _per_layer(gf.arch_value("attention.head_count"), n_layer, 0)
        n_head = max(heads, default=0)
        heads_kv = _per_layer(gf.arch_value("attention.head_count_kv"), n_layer, n_head)
        default_head = n_embd // n_head if n_head else 0
        head_k = int(gf.arch_value("attention.key_length", default_head) or default_head)
        head_v = int(gf.arch_value("attention.value_length", default_head) or default_head)
        n_ff = max(_per_layer(gf.arch_value("feed_forward_length"), n_layer, 0), default=0)
        layer_bytes = [0] * n_layer
        copy_layers = [0] * n_layer
        input_bytes = output_bytes = copy_output = 0
        has_output = False
        tok_embd = gf.tensor("token_embd.weight")
        for t in gf.tensors:
            m = _BLK.match(t.name)
            if m and int(m.group(1)) < n_layer:
                layer_bytes[int(m.group(1))] += t.n_bytes
                copy_layers[int(m.group(1))] += copied(t)
            elif t.name.startswith("output"):
                output_bytes += t.n_bytes
                copy_output += copied(t)
                has_output = has_output or t.name == "output.weight"
            else:
                input_bytes += t.n_bytes
        if not has_output and tok_embd is not None:
            copy_output += copied(tok_embd, tied=True)
        tokens = gf.metadata.get("tokenizer.ggml.tokens")
        n_vocab = (
            tok_embd.shape[1]
            if tok_embd is not None and len(tok_embd.shape) > 1
            else int(gf.arch_value("vocab_size", 0) or 0)
            or (len(tokens) if isinstance(tokens, list | ArraySummary) else 0)
        )
        recurrent = any(
            k.startswith(f"{gf.architecture}.{p}")
            for k in gf.metadata
            for p in ("ssm.", "rwkv.", "wkv.")
        )
        name = gf.metadata.get("general.name") or gf.source_name
        return cls(
            name=str(name),
            architecture=gf.architecture,
            n_layer=n_layer,
            n_embd=n_embd,
            n_ff=n_ff,
            n_head=n_head,
            n_head_kv=tuple(heads_kv),
            head_dim_k=head_k,
            head_dim_v=head_v,
            n_swa=int(gf.arch_value("attention.sliding_window", 0) or 0),
            swa_layers=swa_layer_pattern(gf, n_layer),
            n_vocab=n_vocab,
            n_ctx_train=int(gf.arch_value("context_length", 0) or 0),
            layer_bytes=tuple(layer_bytes),
            input_bytes=input_bytes,
            output_bytes=output_bytes,
            tied_output_bytes=0 if has_output or tok_embd is None else tok_embd.n_bytes,
            recurrent=recurrent,
            copy_layer_bytes=tuple(copy_layers),
            copy_output_bytes=copy_output,
            copy_buffers=tuple(sorted(buffers)),
        )


def extra_copies(p: EstimateParams) -> bool:
    """Whether a load with these settings may copy CPU weights into llama.cpp's extra buffers
    (a load that asks for AMX kernels this build cannot run is refused, so plans none)."""
    try:
        return use_extra_buffers(p.extra_buffers)
    except EngineError:
        return False


def _per_layer(value: Any, n_layer: int, default: int) -> list[int]:
    if isinstance(value, list):
        vals = [int(v) for v in value][:n_layer]
        return vals + [default] * (n_layer - len(vals))
    if value is None:
        return [default] * n_layer
    return [int(value)] * n_layer


def row_size(type_name: str, n: int) -> int:
    """Bytes of one row of `n` values of a ggml type (ggml_row_size)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(KV_TYPES[type_name])]
    return n // block * size


def _pad(n: int, to: int = CTX_PAD) -> int:
    return (n + to - 1) // to * to


# -- the analytic model ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    """Context geometry after llama.cpp's own adjustments."""

    n_ctx: int  # total cells of a full-attention layer (all streams)
    n_ctx_seq: int  # cells per stream (= what one sequence can attend to)
    n_stream: int
    n_ubatch: int
    n_outputs: int  # rows of logits the worst-case graph computes


def _shape(spec: ModelSpec, p: EstimateParams) -> _Shape:
    n_ctx = p.n_ctx if p.n_ctx > 0 else spec.n_ctx_train
    n_batch = min(n_ctx, p.n_batch)  # causal attention: a batch never exceeds the context
    n_ubatch = min(n_batch, p.n_ubatch)
    n_ctx = _pad(n_ctx)
    if p.kv_unified:
        n_ctx_seq, n_stream = n_ctx, 1
    else:
        n_ctx_seq = _pad(n_ctx // p.n_seq_max)
        n_stream = p.n_seq_max
        n_ctx = n_ctx_seq * n_stream
    return _Shape(n_ctx, n_ctx_seq, n_stream, n_ubatch, min(n_ubatch, n_batch))


def kv_bytes_per_layer(spec: ModelSpec, p: EstimateParams) -> list[int]:
    s = _shape(spec, p)
    full = s.n_ctx_seq
    swa = (
        full
        if p.swa_full
        else _pad(min(full, spec.n_swa * (p.n_seq_max if p.kv_unified else 1) + s.n_ubatch))
    )
    out = []
    for il in range(spec.n_layer):
        cells = (swa if il < len(spec.swa_layers) and spec.swa_layers[il] else full) * s.n_stream
        n_kv = spec.n_head_kv[il]
        out.append(
            (
                row_size(p.type_k, spec.head_dim_k * n_kv)
                + row_size(p.type_v, spec.head_dim_v * n_kv)
            )
            * cells
        )
    return out


def output_buffer_bytes(spec: ModelSpec, p: EstimateParams) -> int:
    """Host buffer for the logits (and embeddings) of one output row per sequence."""
    per_row = spec.n_vocab * 4 + (spec.n_embd * 4 if p.embeddings else 0)
    return per_row * p.n_seq_max


def flash_attention_used(p: EstimateParams) -> bool:
    # `estimate()` has already resolved the engine's 'auto'; what is left as 'auto' is
    # llama.cpp's, which turns it on for CPU, CUDA, Metal and Vulkan with common head sizes.
    return p.flash_attn != "off"


def compute_phases(spec: ModelSpec, p: EstimateParams) -> tuple[int, int]:
    """(output phase, layer phase) peak bytes of the worst-case graph (one full micro-batch).

    The compute buffer holds the peak of live intermediate tensors. Fitted on this llama.cpp's
    dry runs (docs/memory.md): the output phase is the logits of every token of the
    micro-batch plus two activation rows; a layer holds the FFN and a few activation rows, and
    without flash attention the full f32 attention scores (n_head + the mask) over the cache.
    """
    s = _shape(spec, p)
    ub = s.n_ubatch
    out_phase = 4 * (s.n_outputs * spec.n_vocab + 2 * ub * spec.n_embd)
    body = 4 * ub * (spec.n_ff + 3 * spec.n_embd)
    if flash_attention_used(p):
        attn = 2 * ub * s.n_ctx_seq  # the f16 mask
    else:
        attn = 4 * ub * s.n_ctx_seq * (spec.n_head + 1)  # f32 scores + f32 mask
    return out_phase, body + attn


def _mask_bytes(spec: ModelSpec, p: EstimateParams) -> int:
    """The KQ mask of one micro-batch: f16 with flash attention, f32 without."""
    s = _shape(spec, p)
    return (2 if flash_attention_used(p) else 4) * s.n_ubatch * s.n_ctx_seq


# -- layer placement -------------------------------------------------------------------------


def layer_devices(n_layer: int, n_gpu_layers: int, gpus: Sequence[Device]) -> list[str]:
    """Device of each repeating layer and (last item) of the output layer, as llama.cpp assigns
    them: `i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)`; GPUs split by free memory."""
    if not gpus or n_gpu_layers <= 0:
        return [CPU] * (n_layer + 1)
    free = [float(g.free_bytes) for g in gpus]
    if not any(free):
        free = [1.0] * len(gpus)
    total = sum(free)
    splits, acc = [], 0.0
    for f in free:
        acc += f
        splits.append(acc / total)
    start = max(n_layer + 1 - n_gpu_layers, 0)
    act = min(n_gpu_layers, n_layer + 1)
    out = []
    for il in range(n_layer + 1):
        if il < start or il - start >= act:
            out.append(CPU)
        else:
            k = bisect.bisect_right(splits, (il - start) / act)
            out.append(gpus[min(k, len(gpus) - 1)].name)
    return out


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceUse:
    name: str
    kind: str  # cpu | gpu | igpu
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int
    layers: int  # repeating layers + output layer placed here
    free_bytes: int | None = None
    margin_bytes: int = 0
    simulated: bool = False

    @property
    def bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes

    @property
    def required_bytes(self) -> int:
        return self.bytes + self.overhead_bytes + self.margin_bytes

    @property
    def fits(self) -> bool:
        return self.free_bytes is None or self.required_bytes <= self.free_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bytes"] = self.bytes
        d["required_bytes"] = self.required_bytes
        d["fits"] = self.fits
        return d


@dataclass(frozen=True)
class MemoryEstimate:
    model: str
    method: Method
    params: EstimateParams
    n_ctx: int  # after padding
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int
    devices: tuple[DeviceUse, ...]
    gpu_layers: int
    n_layers: int  # offloadable layers: repeating layers + the output layer
    verdict: Verdict
    reason: str
    notes: tuple[str, ...] = ()
    max_ctx_fit: int | None = None  # largest context that fits, when the asked one does not

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes

    @property
    def fits(self) -> bool:
        return self.verdict != "does_not_fit"

    @property
    def ram_bytes(self) -> int:
        return sum(d.bytes for d in self.devices if d.name == CPU)

    @property
    def vram_bytes(self) -> int:
        return sum(d.bytes for d in self.devices if d.name != CPU)

    def device(self, name: str) -> DeviceUse | None:
        return next((d for d in self.devices if d.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        p = asdict(self.params)
        return {
            "model": self.model,
            "method": self.method,
            "n_ctx": self.n_ctx,
            "weights_bytes": self.weights_bytes,
            "kv_bytes": self.kv_bytes,
            "compute_bytes": self.compute_bytes,
            "output_bytes": self.output_bytes,
            "overhead_bytes": self.overhead_bytes,
            "total_bytes": self.total_bytes,
            "devices": [d.to_dict() for d in self.devices],
            "gpu_layers": self.gpu_layers,
            "n_layers": self.n_layers,
            "verdict": self.verdict,
            "verdict_text": VERDICT_TEXT[self.verdict],
            "reason": self.reason,
            "max_ctx_fit": self.max_ctx_fit,
            "notes": list(self.notes),
            "params": p,
        }

    def check(self) -> None:
        """Raise `DoesNotFitError` with the reason when the model does not fit."""
        if not self.fits:
            raise DoesNotFitError(self.reason)


# -- the dry run -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DryRun:
    kv_bytes: int
    compute: dict[str, int]  # device -> bytes
    output: dict[str, int]
    log: tuple[str, ...] = field(repr=False, default=())


_BUF = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size =\s*([\d.]+) MiB")
_CACHE_SIZE = re.compile(r"^(llama_kv_cache|llama_memory_recurrent)\S*: size =\s*([\d.]+) MiB")
_KIND = {"model": "weights", "KV": "kv", "RS": "kv", "compute": "compute", "output": "output"}


def _device_of(buffer_name: str) -> str:
    """Buffer type -> the memory it lives in: CPU_Mapped, CPU_REPACK, AMX, CUDA_Host -> CPU."""
    if buffer_name.startswith(("CPU", "AMX")) or buffer_name.endswith("_Host"):
        return CPU
    return buffer_name.removesuffix("_Mapped")


def _mib(text: str) -> int:
    return round(float(text) * MiB)


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
        use_extra_bufts=use_extra_buffers(p.extra_buffers),
        n_ctx=p.n_ctx,
        n_batch=p.n_batch,
        n_ubatch=p.n_ubatch,
        n_seq_max=p.n_seq_max,
        flash_attn_type=FLASH_TYPES[resolve_flash_attn(p.flash_attn, p.type_v)],
        type_k=KV_TYPES[p.type_k],
        type_v=KV_TYPES[p.type_v],
        embeddings=p.embeddings,
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
        m = _CACHE_SIZE.search(line.strip())
        if m:
            kv += _mib(m.group(2))
            continue
        b = _BUF.search(line)
        if b and b.group(2) in ("compute", "output"):
            target = compute if b.group(2) == "compute" else output
            dev = _device_of(b.group(1))
            target[dev] = target.get(dev, 0) + _mib(b.group(3))
    return DryRun(kv, compute, output, lines)


# -- the estimate ----------------------------------------------------------------------------

Source = str | os.PathLike[str] | GGUFFile


def _load(source: Source) -> tuple[GGUFFile, Path | None]:
    if isinstance(source, GGUFFile):
        return source, None
    path = Path(source)
    gf = read_gguf(path)
    names = split_names(path.name, split_count(gf))
    if names:
        # The first part holds the metadata; the others hold the rest of the tensor table.
        gf = merge_splits([gf if n == path.name else read_gguf(path.with_name(n)) for n in names])
    return gf, path


def estimate(
    source: Source,
    params: EstimateParams | None = None,
    *,
    hardware: Hardware | None = None,
    method: Method | Literal["auto"] = "auto",
    path: str | os.PathLike[str] | None = None,
) -> MemoryEstimate:
    """Estimate memory for a model (a path, or a parsed header) with these settings.

    `hardware` defaults to this machine (`engine.memory.hardware.detect()`); pass a simulated
    one for "what if" planning. `method='auto'` dry-runs local files and falls back to the analytic
    model for headers without a file (remote) or architectures llama.cpp cannot size.
    """
    p = params or EstimateParams()
    p.validate()
    gf, file_path = _load(source)
    check_model(gf)  # the dry run loads the file into llama.cpp
    if path is not None:
        file_path = Path(path)
    hw = hardware if hardware is not None else detect_hardware()
    # Plan with flash attention as the engine would resolve 'auto' on this hardware.
    p = replace(
        p, flash_attn=resolve_flash_attn(p.flash_attn, p.type_v, gpu=bool(hw.offload_devices))
    )
    spec = ModelSpec.from_gguf(gf, hw.cpu)
    notes: list[str] = []
    if method == "dry-run" and file_path is None:
        raise EngineError("a dry run needs the model file on disk; use the analytic method")
    dry: DryRun | None = None
    # On a GPU build 'auto' is analytic: the dry run sizes the CPU graph and adds llama.cpp's
    # GPU op-offload buffer on top (twice the real compute buffer on an H200), while the
    # analytic model matched the CUDA buffers (docs/gpu.md); and it needs a child process.
    if file_path is not None and (
        method == "dry-run" or (method == "auto" and not llama_lib.supports_gpu_offload())
    ):
        try:
            dry = dry_run(file_path, p)
        except EngineError as e:
            if method == "dry-run":
                raise
            # e.g. an architecture newer than this llama.cpp: the header still tells a lot.
            notes.append(f"llama.cpp could not size this model ({e}); analytic estimate")
    if spec.n_ctx_train and p.n_ctx > spec.n_ctx_train:
        notes.append(
            f"the context ({p.n_ctx}) is longer than the model was trained for "
            f"({spec.n_ctx_train}); quality may drop beyond that"
        )
    if split_count(gf) > 1 and len(gf.tensors) < int(
        gf.metadata.get("split.tensors.count", 0) or 0
    ):
        notes.append("only part of a split model was read; weights are under-counted")
    if dry is None and spec.recurrent:
        notes.append(
            f"{spec.architecture} keeps a recurrent state that the analytic model "
            "does not cover; download the file for an exact dry run"
        )
    est = _plan(spec, p, hw, dry, notes)
    copies = extra_copies_bytes(
        spec, p, layer_devices(spec.n_layer, est.gpu_layers, hw.offload_devices)
    )
    if copies:
        est = replace(
            est,
            notes=(
                *est.notes,
                f"the weights include llama.cpp's "
                f"{' and '.join(spec.copy_buffers)} copy of the CPU layers' "
                f"matrices ({_gb(copies)}), next to the mapped file",
            ),
        )
    if not est.fits and est.max_ctx_fit is None:
        est = replace(est, max_ctx_fit=fit_context(spec, p, hw, dry))
        if est.max_ctx_fit:
            est = replace(
                est, reason=est.reason + f"; a context of {est.max_ctx_fit} tokens would fit"
            )
    return est


def extra_copies_bytes(spec: ModelSpec, p: EstimateParams, where: Sequence[str]) -> int:
    """Bytes of the extra-buffer copies a load makes with this layer placement (only CPU
    layers are copied; 0 with extra buffers off)."""
    if not extra_copies(p):
        return 0
    n = sum(b for il, b in enumerate(spec.copy_layer_bytes) if where[il] == CPU)
    return n + (spec.copy_output_bytes if where[-1] == CPU else 0)


def _plan(
    spec: ModelSpec, p: EstimateParams, hw: Hardware, dry: DryRun | None, notes: list[str]
) -> MemoryEstimate:
    gpus = hw.offload_devices
    n_layers = spec.n_layer + 1
    kv_layers = kv_bytes_per_layer(spec, p)
    out_phase, layer_phase = compute_phases(spec, p)
    output = output_buffer_bytes(spec, p)
    if dry is not None:
        # Trust llama.cpp's own sizes where they differ from the formula by more than the
        # log's rounding (2 decimals of MiB); keep the per-layer shape of the KV cache.
        analytic_kv = sum(kv_layers)
        if not _same(analytic_kv, dry.kv_bytes, 2):
            if analytic_kv:
                kv_layers = [k * dry.kv_bytes // analytic_kv for k in kv_layers]
            else:
                kv_layers = [dry.kv_bytes // max(spec.n_layer, 1)] * spec.n_layer
        measured = sum(dry.compute.values())
        if measured:
            scale = measured / max(out_phase, layer_phase, 1)
            out_phase, layer_phase = int(out_phase * scale), int(layer_phase * scale)
        if dry.output and not _same(output, sum(dry.output.values()), len(dry.output)):
            output = sum(dry.output.values())

    def place(ngl: int) -> tuple[DeviceUse, ...]:
        return _place(spec, p, hw, gpus, ngl, kv_layers, out_phase, layer_phase, output)

    req = p.n_gpu_layers
    if not gpus:
        ngl = 0
    elif req == "all":
        ngl = n_layers
    elif req == "auto":
        ngl = 0
        for n in range(n_layers, -1, -1):
            if all(d.fits for d in place(n) if d.name != CPU):
                ngl = n
                break
    else:
        ngl = min(int(req), n_layers)
    devices = place(ngl)
    verdict, reason = _verdict(spec, p, hw, devices, ngl, n_layers)
    return MemoryEstimate(
        model=spec.name,
        method="dry-run" if dry is not None else "analytic",
        params=p,
        n_ctx=_shape(spec, p).n_ctx,
        weights_bytes=sum(d.weights_bytes for d in devices),
        kv_bytes=sum(d.kv_bytes for d in devices),
        compute_bytes=sum(d.compute_bytes for d in devices),
        output_bytes=sum(d.output_bytes for d in devices),
        overhead_bytes=sum(d.overhead_bytes for d in devices),
        devices=devices,
        gpu_layers=ngl,
        n_layers=n_layers,
        verdict=verdict,
        reason=reason,
        notes=tuple(notes),
    )


def _same(exact: int, logged: int, n_values: int) -> bool:
    """Whether a size llama.cpp logged (rounded to 0.01 MiB per value) matches `exact`."""
    return abs(exact - logged) <= n_values * 0.005 * MiB + 1


def _place(
    spec: ModelSpec,
    p: EstimateParams,
    hw: Hardware,
    gpus: Sequence[Device],
    ngl: int,
    kv_layers: Sequence[int],
    out_phase: int,
    layer_phase: int,
    output: int,
) -> tuple[DeviceUse, ...]:
    where = layer_devices(spec.n_layer, ngl, gpus)
    names = [CPU] + [g.name for g in gpus]
    w = dict.fromkeys(names, 0)
    kv = dict.fromkeys(names, 0)
    comp = dict.fromkeys(names, 0)
    layers = dict.fromkeys(names, 0)
    w[CPU] += spec.input_bytes  # the input embedding always stays on the CPU
    # With extra buffers, the matrices of CPU layers get a repacked copy besides the file.
    w[CPU] += extra_copies_bytes(spec, p, where)
    for il in range(spec.n_layer):
        w[where[il]] += spec.layer_bytes[il]
        kv[where[il]] += kv_layers[il]
        layers[where[il]] += 1
    out_dev = where[-1]
    layers[out_dev] += 1
    w[out_dev] += spec.output_bytes
    if out_dev != CPU:
        w[out_dev] += spec.tied_output_bytes  # a tied output matrix is copied to the GPU
    if out_dev == CPU:
        comp[CPU] = max(out_phase, layer_phase)
    else:
        # The graph runs where the layers are. The attention mask (micro-batch x context) is
        # an input built in host memory and copied to the GPU, where the copy lives through
        # the output phase; the host also stages the input embedding. Measured on an H200
        # (docs/gpu.md): 1 GiB on each side at a context of 1M tokens.
        mask = _mask_bytes(spec, p)
        comp[out_dev] = max(out_phase + mask, layer_phase)
        for name in names:
            if name != out_dev and layers[name]:
                comp[name] = max(comp[name], layer_phase)
        comp[CPU] = max(comp[CPU], 2 * 4 * _shape(spec, p).n_ubatch * spec.n_embd + mask)
    out: list[DeviceUse] = []
    cpu_margin = (
        p.margin_bytes if p.margin_bytes is not None else default_margin(hw.ram_total_bytes)
    )
    out.append(
        DeviceUse(
            CPU,
            "cpu",
            w[CPU],
            kv[CPU],
            comp[CPU],
            output,
            0,
            layers[CPU],
            hw.ram_available_bytes,
            cpu_margin,
        )
    )
    for g in gpus:
        used = layers[g.name] > 0
        margin = p.margin_bytes if p.margin_bytes is not None else default_margin(g.total_bytes)
        out.append(
            DeviceUse(
                g.name,
                g.kind,
                w[g.name],
                kv[g.name],
                comp[g.name],
                0,
                GPU_RUNTIME_OVERHEAD if used else 0,
                layers[g.name],
                g.free_bytes,
                margin,
                g.simulated,
            )
        )
    return tuple(out)


def _gb(n: float) -> str:
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.0f} MiB"


def _verdict(
    spec: ModelSpec,
    p: EstimateParams,
    hw: Hardware,
    devices: Sequence[DeviceUse],
    ngl: int,
    n_layers: int,
) -> tuple[Verdict, str]:
    for d in devices:
        if not d.fits:
            where = "RAM" if d.name == CPU else d.name
            return "does_not_fit", (
                f"needs {_gb(d.bytes + d.overhead_bytes)} of {where} but only "
                f"{_gb(d.free_bytes or 0)} is free (keeping {_gb(d.margin_bytes)} spare)"
            )
    gpu_names = ", ".join(d.name for d in devices if d.name != CPU and d.layers)
    if ngl >= n_layers:
        vram = sum(d.bytes for d in devices if d.name != CPU)
        return "fits_gpu", f"all {n_layers} layers on {gpu_names} ({_gb(vram)} of GPU memory)"
    if ngl > 0:
        return "partial_offload", (
            f"{ngl} of {n_layers} layers on {gpu_names}, the rest run from RAM (slower)"
        )
    cpu = devices[0]
    if hw.gpus and not hw.can_offload:
        why = "this llama.cpp build cannot offload to a GPU"
    elif not hw.gpus:
        why = "no GPU found"
    elif p.n_gpu_layers == 0:
        why = "GPU offload is turned off"
    else:
        why = "not even one layer fits in the GPU's free memory"
    return "ram_only", f"{_gb(cpu.bytes)} in RAM ({why})"


def fit_context(spec: ModelSpec, p: EstimateParams, hw: Hardware, dry: DryRun | None = None) -> int:
    """The largest context (a multiple of 256, up to the asked one) that fits; 0 if none.

    Uses the analytic model (a dry run per step would cost 0.4 s each); when a dry run of the
    asked settings exists its compute size is kept, which only shrinks with the context.
    """
    hi = max(_pad(p.n_ctx if p.n_ctx > 0 else spec.n_ctx_train) // CTX_PAD, 1)
    lo, best = 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        q = replace(p, n_ctx=mid * CTX_PAD)
        if _plan(spec, q, hw, None, []).fits:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best * CTX_PAD


def fit_gpu_layers(source: Source, params: EstimateParams, hardware: Hardware) -> int:
    """GPU layer count for `n_gpu_layers='auto'`: the most that fit in the devices' free memory
    minus the margin (analytic, so it adds no dry run to every load)."""
    gf, _ = _load(source)
    est = _plan(
        ModelSpec.from_gguf(gf, hardware.cpu),
        replace(params, n_gpu_layers="auto"),
        hardware,
        None,
        [],
    )
    return est.gpu_layers


# -- after a real load -----------------------------------------------------------------------


@dataclass(frozen=True)
class ActualMemory:
    """What llama.cpp reported it allocated during a real load, and how the process grew."""

    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    devices: dict[str, int]
    rss_growth_bytes: int | None = None

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["total_bytes"] = self.total_bytes
        return d


def actual_from_log(lines: Iterable[str], rss_growth_bytes: int | None = None) -> ActualMemory:
    """Sum the buffer sizes llama.cpp logs while it loads a model and creates a context."""
    kinds = {"weights": 0, "kv": 0, "compute": 0, "output": 0}
    devices: dict[str, int] = {}
    for line in lines:
        b = _BUF.search(line)
        if not b:
            continue
        n = _mib(b.group(3))
        kinds[_KIND[b.group(2)]] += n
        dev = _device_of(b.group(1))
        devices[dev] = devices.get(dev, 0) + n
    return ActualMemory(
        kinds["weights"], kinds["kv"], kinds["compute"], kinds["output"], devices, rss_growth_bytes
    )


def compare(est: MemoryEstimate, actual: ActualMemory) -> str:
    """'estimated 812 MiB, actual 820 MiB (-1.0%)' for the UI."""
    if not actual.total_bytes:
        return f"estimated {_gb(est.total_bytes)}, actual unknown"
    err = (est.total_bytes - actual.total_bytes) / actual.total_bytes * 100
    return f"estimated {_gb(est.total_bytes)}, actual {_gb(actual.total_bytes)} ({err:+.1f}%)"


__all__ = [
    "ActualMemory",
    "DeviceUse",
    "DoesNotFitError",
    "EstimateParams",
    "MemoryEstimate",
    "ModelSpec",
    "actual_from_log",
    "compare",
    "default_margin",
    "dry_run",
    "estimate",
    "fit_context",
    "fit_gpu_layers",
    "layer_devices",
]
