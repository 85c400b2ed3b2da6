"""Which CPU kernels and weight copies this llama.cpp build picks, by the vendored source's rules.

Two consequences of the CPU follow from the same facts and live here together:

* **Extra weight copies.** With `use_extra_bufts` (the default), llama.cpp puts a weight matrix
  of a CPU layer into the first "extra buffer" type that takes it, as a repacked copy beside the
  mapped file: AMX tiles on Intel CPUs with AMX (ggml-cpu/amx), else interleaved CPU_REPACK
  layouts (ggml-cpu/repack.cpp `ggml_repack_get_optimal_repack_type`) on AVX2/AVX-512 and ARM.
  The memory estimate counts these copies (`copy_bytes`).
* **Batch invariance.** A token's logits are bit-identical whether it is decoded alone or inside
  a batch only where one row and many rows take the same kernel. They do not for: weights in
  an extra buffer (gemv vs gemm kernels), weight types llamafile's sgemm takes for two or more
  rows (`llamafile_sgemm`: "only enable sgemm for prompt processing"), ARM's two-row int8
  matrix kernels, attention products without flash attention, and within upstream's flash
  attention the split-KV path of a single query over 512+ cached cells and the tiled path of
  64+ queries (ggml-cpu/ops.cpp); the project's build takes every batch over an f16/f32 cache
  through the tiled kernel, whose rows do not depend on each other
  (installers/llama_cpp/flash_attn_small_batch.patch, `fa_small_tiles`). `batch_exactness`
  computes the guarantee from those rules; nothing else in the engine may assume it.

The CPU's features are what the build was compiled for (ggml's `ggml_cpu_has_*` are compile-time
checks), read from `llama_print_system_info()`; every rule takes them as an argument so tests
can force each side of a switch on any machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.model.facts import model_facts
from engine.model.gguf import GGUFFile, TensorInfo
from engine.native import llama_lib
from engine.settings import FlashAttn, resolve_flash_attn

ExtraBuffer = Literal["AMX", "CPU_REPACK"]

# ggml-cpu/ops.cpp: flash attention of one query over at least this many KV cells splits the
# cache across threads; llama.cpp views the cache in steps of 256 cells, so exactness holds
# while fewer than 256 positions are cached (the view is then 256 cells).
SPLIT_KV_CELLS = 512
KV_VIEW_PAD = 256
# ggml-cpu/common.h GGML_FA_TILE_Q: batches of this many queries take the tiled kernel.
FA_TILE_Q = 64
# Cached cells per sequence up to which flash attention makes a context of heads narrower than
# 128 faster on an AVX512-FP16 CPU whose build steps in AVX-512F's 64 (SmolLM2, AMX Xeon,
# llama-batched-bench, docs/benchmarks.md "Flash attention on the CPU"): it reads prompts
# 1.36-1.50x faster at every depth, decodes 1.36x (1.49x eight at once) at 128 cached tokens,
# even at 1,000-2,000, 0.86x at 4,000 and 0.71x at 7,600. Averaged over a context as it fills,
# half prompt and half reply, it breaks even at 4,096 cells (0.99; a chat's 20% prompt: 0.96,
# an agent's 80%: 1.09) and loses past it (0.86 at 8,192).
FLASH_ATTN_NARROW_CROSSOVER = 4096
_NARROW_HEAD = 128  # AVX512-FP16's f16 step: what the crossover above was measured under


@dataclass(frozen=True)
class CpuFeatures:
    """What ggml's CPU backend was compiled for (the names of `llama_print_system_info`)."""

    avx: bool = False
    avx2: bool = False
    f16c: bool = False
    avx512: bool = False
    avx512_vnni: bool = False
    avx512_bf16: bool = False
    amx_int8: bool = False
    neon: bool = False
    fp16_va: bool = False
    matmul_int8: bool = False
    dotprod: bool = False
    sve: bool = False
    sve_cnt: int = 0
    llamafile: bool = False
    repack: bool = False
    # Not in llama_print_system_info: whether the build's f16 vectors are AVX512-FP16 ones
    # (`detect` infers it for a native build; see `f16_vector_step`).
    avx512_fp16: bool = False
    # Nor whether the build steps in AVX-512F's 64 on a CPU that has AVX512-FP16
    # (llama_lib.f16_vectors_avx512f: installers/llama_cpp/amx_tilecfg.h).
    f16_avx512f_steps: bool = False
    # Nor whether its AMX code verifies small batches on the vector kernels
    # (llama_lib.amx_small_batches: installers/llama_cpp/amx_small_batch.patch).
    amx_small_batch: bool = False
    # Nor whether its flash attention takes small batches in tiles like prompts
    # (llama_lib.flash_attn_small_tiles: installers/llama_cpp/flash_attn_small_batch.patch).
    fa_small_tiles: bool = False
    # Nor whether its Q4_1 and Q8_0 products read a weight row once for a few columns
    # (llama_lib.quant_columns: installers/llama_cpp/quant_columns.patch).
    quant_columns: bool = False

    @classmethod
    def parse(cls, system_info: str) -> CpuFeatures:
        """From "CPU : SSE3 = 1 | AVX2 = 1 | ... | SVE_CNT = 32 | REPACK = 1 |"."""
        vals = {k.lower(): v for k, v in re.findall(r"([A-Z0-9_]+) = (\d+)", system_info)}

        def on(name: str) -> bool:
            return vals.get(name, "0") not in ("0", "")

        return cls(
            avx=on("avx"),
            avx2=on("avx2"),
            f16c=on("f16c"),
            avx512=on("avx512"),
            avx512_vnni=on("avx512_vnni"),
            avx512_bf16=on("avx512_bf16"),
            amx_int8=on("amx_int8"),
            neon=on("neon"),
            fp16_va=on("fp16_va"),
            matmul_int8=on("matmul_int8"),
            dotprod=on("dotprod"),
            sve=on("sve"),
            sve_cnt=int(vals.get("sve_cnt", "0")),
            llamafile=on("llamafile"),
            repack=on("repack"),
        )

    @property
    def summary(self) -> str:
        """'AVX2 AVX512 ... REPACK' for benchmark records."""
        return " ".join(
            k.upper() for k, v in vars(self).items() if v is True or (k == "sve_cnt" and v)
        )


@functools.cache
def detect() -> CpuFeatures:
    """This build's CPU features. AVX512-FP16 is not among the features llama.cpp prints:
    a native build (the project's own: GGML_NATIVE) compiles its f16 vectors with it when the
    CPU has it, so a build with AVX-512 on a CPU that has it is taken to use it, unless the
    build says it steps in AVX-512F's 64 instead (the project's own build does). Nor does it
    print whether the AMX code takes small batches on its vector kernels, flash attention
    small batches in tiles, or Q4_1 and Q8_0 products a few columns per weight row (the project's
    patches)."""
    f = CpuFeatures.parse(llama_lib.system_info())
    if f.amx_int8 and llama_lib.amx_small_batches():
        f = dataclasses.replace(f, amx_small_batch=True)
    if llama_lib.flash_attn_small_tiles():
        f = dataclasses.replace(f, fa_small_tiles=True)
    if llama_lib.quant_columns():
        f = dataclasses.replace(f, quant_columns=True)
    if f.avx512 and "avx512_fp16" in _cpu_flags():
        if llama_lib.f16_vectors_avx512f():
            f = dataclasses.replace(f, f16_avx512f_steps=True)
        else:
            f = dataclasses.replace(f, avx512_fp16=True)
    return f


def _cpu_flags() -> frozenset[str]:
    """The CPU's flags as Linux reports them (empty elsewhere)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    return frozenset()


# -- flash attention's f16 vector step (ggml-cpu/simd-mappings.h, vec.cpp) ---------------------


def f16_vector_step(f: CpuFeatures) -> int | None:
    """GGML_F16_STEP: ggml_vec_dot_f16 and ggml_vec_mad_f16 work in whole steps of this many
    elements and do the rest one element at a time. None where the tail is vectorised too
    (SVE) or the build has no f16 vectors."""
    if f.sve:
        return None
    if f.avx512_fp16:
        return 128
    if f.avx512:
        return 64
    if f.avx:
        return 32
    if f.neon:
        return 32 if f.fp16_va else 16
    return None


def flash_attn_scalar(f: CpuFeatures, head_dims: Iterable[int]) -> bool:
    """Whether CPU flash attention would take the element-by-element path: its per-cell
    K·Q dot product and V accumulation (ggml-cpu/ops.cpp, one query over an f16 cache) run over
    one head's width, and a width that is not a whole number of f16 steps leaves that much to
    scalar code. With AVX512-FP16 (a step of 128) a 64-wide head is all scalar: SmolLM2 decodes
    at 0.40x at 2,000 cached tokens and 0.31x at 7,600 on an AMX Xeon (docs/benchmarks.md),
    where Gemma-3's 256-wide heads decode as fast with it as without. The project's own build
    compiles the f16 vectors without AVX512-FP16 (installers/llama_cpp/amx_tilecfg.h), which
    covers 64-wide heads whole and makes flash attention 2-2.5x faster at depth there, but on
    that CPU it still decodes them slower than without at depth (0.86x at 4,000 cached
    tokens, 0.71x at 7,600) unless it also has the small tiles: `flash_attn_ctx_limit` says
    so."""
    step = f16_vector_step(f)
    return step is not None and any(d > 0 and d % step for d in head_dims)


def flash_attn_ctx_limit(f: CpuFeatures, head_dims: Iterable[int]) -> int | None:
    """The cells per sequence past which a context runs slower with flash attention than
    without it (its faster prompts and short-history decoding against its slower decoding at
    depth, over the context's fill), or None where no such limit was measured. Only heads
    narrower than 128 on an AVX512-FP16 CPU whose build steps in 64 (`f16_avx512f_steps`)
    have one: whole steps, but the per-cell overhead of the one-query kernel outweighs the
    smaller cache reads at depth. The project's build (`fa_small_tiles`) decodes through the
    tiled kernel instead and has none: flash attention decodes as fast at 7,600 cached tokens
    (0.99x) and reads prompts 2.2x faster (docs/benchmarks.md, "Flash attention on the CPU")."""
    if f.fa_small_tiles:
        return None
    if f.f16_avx512f_steps and any(0 < d < _NARROW_HEAD for d in head_dims):
        return FLASH_ATTN_NARROW_CROSSOVER
    return None


def f16_head_dims(gf: GGUFFile, type_k: str, type_v: str) -> list[int]:
    """The model's head widths over the f16 parts of its cache (a quantized cache type takes
    its own dot product)."""
    facts = model_facts(gf)
    dims = [facts.head_dim_k] if type_k == "f16" else []
    return dims + ([facts.head_dim_v] if type_v == "f16" else [])


def resolve_flash_attn_for(
    requested: FlashAttn,
    gf: GGUFFile,
    type_k: str,
    type_v: str,
    *,
    n_ctx: int,
    n_seq_max: int = 1,
    gpu: bool | None = None,
) -> FlashAttn:
    """`engine.settings.resolve_flash_attn` for a model file on this build: whether its heads
    take the element-by-element kernel, the crossover they have, and the cells a sequence of
    an `n_ctx` context shared by `n_seq_max` may hold. The one place the engine's load, the
    memory estimate and the tests resolve 'auto' for a file."""
    f, dims = detect(), f16_head_dims(gf, type_k, type_v)
    return resolve_flash_attn(
        requested,
        type_v,
        gpu=gpu,
        scalar_kernel=flash_attn_scalar(f, dims),
        ctx_limit=flash_attn_ctx_limit(f, dims),
        ctx_per_seq=n_ctx // max(n_seq_max, 1),
    )


# -- which weights are matrix products (and so may be copied) -------------------------------

_ROW_LOOKUPS = ("token_embd.weight", "pos_embd.weight", "token_types.weight")


def matmul_weight(t: TensorInfo, *, tied_output: bool = False) -> bool:
    """Whether llama.cpp multiplies by this tensor (MUL_MAT, or MUL_MAT_ID for 3-D expert
    stacks) rather than looking rows up or scaling by it. The token embedding is a lookup,
    except as the output matrix of a model with tied embeddings (`tied_output`)."""
    if not t.name.endswith(".weight") or "norm" in t.name:
        return False
    if t.name in _ROW_LOOKUPS and not (tied_output and t.name == "token_embd.weight"):
        return False
    return len(t.shape) == 2 or (len(t.shape) == 3 and "_exps." in t.name)


# -- AMX (ggml-cpu/amx/amx.cpp) ----------------------------------------------------------------

# The weight types the AMX buffer takes, the K (row length) alignment each needs and the extra
# bytes per block its packed layout adds (ggml_backend_amx_get_alloc_size). Output rows must
# come in multiples of 32 (TILE_N * 2). 2-D MUL_MAT only.
_AMX_TYPES = {
    "Q4_0": (32, 0),
    "Q4_1": (32, 0),
    "Q8_0": (32, 4),
    "Q4_K": (256, 4),
    "Q5_K": (256, 4),
    "Q6_K": (256, 0),
    "IQ4_XS": (256, 2),
    "F16": (16, 0),
}
_AMX_TENSOR_ALIGN = 64
_TENSOR_ALIGN = 32  # ggml-impl.h TENSOR_ALIGNMENT: CPU_REPACK's alignment


def _amx_takes(t: TensorInfo) -> bool:
    kind = _AMX_TYPES.get(t.type_name)
    if kind is None or len(t.shape) != 2:
        return False
    k, n = t.shape
    return k % kind[0] == 0 and n % 32 == 0


# -- CPU_REPACK (ggml-cpu/repack.cpp ggml_repack_get_optimal_repack_type) ---------------------


def _repack_takes(type_name: str, n_rows: int, f: CpuFeatures) -> bool:
    """The vendored rules, branch by branch (RISC-V and s390x left out: not targets here)."""
    arm_i8mm = f.neon and f.matmul_int8
    arm_dot = f.neon and f.dotprod
    rows8, rows4 = n_rows % 8 == 0, n_rows % 4 == 0
    if type_name == "Q4_0":
        return ((f.avx2 or (f.sve and f.matmul_int8 and f.sve_cnt == 32)) and rows8) or (
            (arm_i8mm or arm_dot) and rows4
        )
    if type_name == "Q4_K":
        return (f.avx2 or arm_i8mm or arm_dot) and rows8
    if type_name == "Q2_K":
        return f.avx512 and rows8
    if type_name in ("Q5_K", "Q6_K"):
        return (arm_i8mm or arm_dot) and rows8
    if type_name in ("IQ4_NL", "MXFP4"):
        return (f.avx2 and rows8) or (arm_dot and rows4)
    if type_name in ("Q8_0", "Q1_0"):
        return (arm_i8mm or arm_dot) and rows4
    return False


def extra_buffer(t: TensorInfo, f: CpuFeatures, *, tied_output: bool = False) -> ExtraBuffer | None:
    """The extra buffer a CPU layer's weight goes into when extra buffers are on (AMX first,
    as ggml lists them), or None: it stays in the mapped file."""
    if not matmul_weight(t, tied_output=tied_output):
        return None
    if f.amx_int8 and f.avx512_vnni and _amx_takes(t):
        return "AMX"
    if f.repack and _repack_takes(t.type_name, t.shape[1], f):
        return "CPU_REPACK"
    return None


# The weight types whose products the project's build forms a few columns at a time on x86
# (installers/llama_cpp/quant_columns.patch): a verification batch of a few tokens costs little
# more than one token there.
COLUMN_KERNEL_TYPES = frozenset({"Q4_1", "Q8_0"})


def multiplied_weights(
    tensors: Iterable[TensorInfo], f: CpuFeatures, *, extra_buffers: bool, tied_output: bool = False
) -> Iterator[tuple[TensorInfo, ExtraBuffer | None]]:
    """The weights matrix products read (the output among them where it is tied to the token
    embeddings), each with the extra buffer it is moved to, whose kernels then multiply it
    (None: it stays in the mapped file)."""
    for t in tensors:
        if matmul_weight(t, tied_output=tied_output):
            yield t, extra_buffer(t, f, tied_output=tied_output) if extra_buffers else None


def column_kernels_take(
    tensors: Iterable[TensorInfo], f: CpuFeatures, *, extra_buffers: bool, tied_output: bool = False
) -> bool:
    """Whether the build's column kernels multiply most of the weights' bytes (those not moved
    to an extra buffer, whose kernels are other ones)."""
    if not f.quant_columns:
        return False
    taken = total = 0
    for t, buf in multiplied_weights(
        tensors, f, extra_buffers=extra_buffers, tied_output=tied_output
    ):
        total += t.n_bytes
        if t.type_name in COLUMN_KERNEL_TYPES and buf is None:
            taken += t.n_bytes
    return total > 0 and 2 * taken >= total


def copy_bytes(t: TensorInfo, buffer: ExtraBuffer) -> int:
    """Bytes of the repacked copy of `t` in that buffer (matched to llama.cpp's log to the byte:
    AMX for SmolLM2 Q4_1 and Gemma-3 Q4_K_M, CPU_REPACK for Gemma-3's Q4_K on AVX-512)."""
    if buffer == "AMX":
        k, n = t.shape
        block = GGML_QUANT_SIZES[GGMLQuantizationType[t.type_name]][0]
        size = t.n_bytes + k // block * _AMX_TYPES[t.type_name][1] * n
        return -(-size // _AMX_TENSOR_ALIGN) * _AMX_TENSOR_ALIGN
    # CPU_REPACK keeps ggml_nbytes (no get_alloc_size of its own).
    return -(-t.n_bytes // _TENSOR_ALIGN) * _TENSOR_ALIGN


# -- batch invariance --------------------------------------------------------------------------


def _sgemm_types(f: CpuFeatures) -> frozenset[str]:
    """Weight types llamafile's sgemm multiplies when two or more rows come (x86 and ARM NEON
    branches of `llamafile_sgemm`); one row always takes ggml's own dot product."""
    if not f.llamafile:
        return frozenset()
    types: set[str] = set()
    if f.avx or f.avx2 or f.avx512:
        types |= {"F32", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL"}
        if f.avx512 or f.f16c:
            types.add("F16")
        if f.avx2 or f.avx512:
            types.add("BF16")
    elif f.neon:
        types |= {"F32", "F16"}
        if f.dotprod:
            types |= {"Q8_0", "Q4_0"}
    return frozenset(types)


# ggml-cpu/quants: types whose ARM int8 matrix kernel does two rows at once (nrows = 2).
_ARM_TWO_ROW = frozenset({"Q4_0", "Q4_1", "Q8_0", "IQ4_NL", "Q4_K", "Q6_K"})


@dataclass(frozen=True)
class Exactness:
    """Whether greedy decoding gives the same tokens however tokens are grouped into batches
    (alone, in a prompt batch, beside other sequences, in a draft verification)."""

    exact: bool
    reason: str  # why not, in words; '' when exact
    max_positions: int | None = None  # exact only while fewer positions are cached
    max_batch: int | None = None  # ... and batches carry fewer tokens than this

    def covers(self, positions: int, batch: int = 1) -> bool:
        """Whether the guarantee holds for a sequence of `positions` cached tokens and batches
        of up to `batch` tokens."""
        return (
            self.exact
            and (self.max_positions is None or positions < self.max_positions)
            and (self.max_batch is None or batch < self.max_batch)
        )


def weights_exactness(
    tensors: Iterable[TensorInfo], f: CpuFeatures, *, extra_buffers: bool, tied_output: bool = False
) -> Exactness:
    """The weights' half of `batch_exactness`: whether every matrix product by a weight takes
    the same kernel for one row and for many."""
    sgemm = _sgemm_types(f)
    for t, buf in multiplied_weights(
        tensors, f, extra_buffers=extra_buffers, tied_output=tied_output
    ):
        if buf is not None:
            return Exactness(
                False,
                f"{t.type_name} weights are repacked for {buf} kernels, "
                "which multiply one token and a batch differently",
            )
        if t.type_name in sgemm:
            return Exactness(
                False,
                f"{t.type_name} weights are multiplied by llamafile's sgemm "
                "for a batch but by ggml's dot product for one token",
            )
        if f.neon and f.matmul_int8 and t.type_name in _ARM_TWO_ROW:
            return Exactness(
                False, f"{t.type_name} weights use ARM's two-row int8 kernel in a batch"
            )
    return Exactness(True, "")


def batch_exactness(
    tensors: Iterable[TensorInfo],
    f: CpuFeatures,
    *,
    extra_buffers: bool,
    flash_attn: bool,
    type_k: str,
    type_v: str,
    gpu_layers: int,
    tied_output: bool = False,
) -> Exactness:
    """The guarantee for a load with these settings (see the module doc)."""
    if gpu_layers > 0:
        return Exactness(False, "GPU kernels are chosen by batch size")
    w = weights_exactness(tensors, f, extra_buffers=extra_buffers, tied_output=tied_output)
    if not w.exact:
        return w
    if not flash_attn:
        if _sgemm_types(f) & {type_k.upper(), type_v.upper()}:
            return Exactness(
                False,
                "without flash attention a batch's attention products use "
                "llamafile's sgemm, one token's ggml's dot product",
            )
        return Exactness(True, "")
    if type_k in ("f16", "f32") and type_k == type_v and not f.fa_small_tiles:
        return Exactness(True, "", max_positions=KV_VIEW_PAD, max_batch=FA_TILE_Q)
    return Exactness(True, "")


# How a prompt may be split into batches without changing its logits (engine.host.batch_plan):
# "any": however it is batched, even token by token; "multi": any split into batches of two or
# more tokens (only llamafile's sgemm differs, and only between one row and many: its tiles
# sum each element in the same order); "tiled": any split into batches of FA_TILE_Q or more
# tokens (flash attention's tiled kernel gives each query row the same sums whatever rows
# share its batch); "grid": only the same batches as before.
SplitRule = Literal["any", "multi", "tiled", "grid"]


def split_rule(
    tensors: Iterable[TensorInfo],
    f: CpuFeatures,
    *,
    extra_buffers: bool,
    flash_attn: bool,
    type_k: str,
    type_v: str,
    gpu_layers: int,
    tied_output: bool = False,
) -> SplitRule:
    """Which splits of a prompt into batches give the same logits, for a load with these
    settings. Repacked weights (gemm in groups of rows, gemv for the rest), ARM's two-row
    kernel and GPU kernels depend on the batch's size, not only on whether it has one row:
    only the same batches are safe there. CPU flash attention over an f16/f32 cache has three
    paths upstream (ggml-cpu/ops.cpp): one query over 512+ cells splits the cache across
    threads, 2-63 queries go row by row over every cell, 64+ take the tiled kernel; each row's
    sums depend only on its path, the cache and the cells' order, so batches of FA_TILE_Q+
    tokens agree with each other. The project's build (`fa_small_tiles`) takes every batch
    through the tiled kernel, so flash attention then constrains no split
    (tests/engine/test_batch_plan.py checks the bits either way)."""
    tensors = list(tensors)
    ex = batch_exactness(
        tensors,
        f,
        extra_buffers=extra_buffers,
        flash_attn=flash_attn,
        type_k=type_k,
        type_v=type_v,
        gpu_layers=gpu_layers,
        tied_output=tied_output,
    )
    if ex.exact and ex.max_positions is None and ex.max_batch is None:
        return "any"
    if gpu_layers > 0:
        return "grid"
    for t, buf in multiplied_weights(
        tensors, f, extra_buffers=extra_buffers, tied_output=tied_output
    ):
        if buf is not None:
            return "grid"
        if f.neon and f.matmul_int8 and t.type_name in _ARM_TWO_ROW:
            return "grid"
    if flash_attn and type_k in ("f16", "f32") and type_k == type_v and not f.fa_small_tiles:
        return "tiled"
    return "multi"


def tied_output(tensors: Iterable[TensorInfo]) -> bool:
    """Whether the model multiplies by its token embedding for the logits (no output.weight)."""
    return not any(t.name == "output.weight" for t in tensors)


__all__ = [
    "FLASH_ATTN_NARROW_CROSSOVER",
    "CpuFeatures",
    "Exactness",
    "ExtraBuffer",
    "SplitRule",
    "batch_exactness",
    "copy_bytes",
    "detect",
    "extra_buffer",
    "f16_head_dims",
    "matmul_weight",
    "multiplied_weights",
    "resolve_flash_attn_for",
    "split_rule",
    "tied_output",
    "weights_exactness",
]
