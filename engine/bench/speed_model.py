"""Decode speed predicted from a GGUF header and this machine's measured figures, before the
weights are downloaded or loaded.

What is predicted is the speed a chat reply shows (its tok/s): one request decoding alone at the
chat's default sampling. One token costs a decode step and its sampling; the step does three
kinds of work:

* **Matrix products**: every weight matrix of the layers and the output matrix is read once
  and multiplied by one vector. The token embedding is a row lookup (one row read), except as
  the output matrix of a model with tied embeddings. How fast bytes go through a product
  depends on the weight type *and* on the kernel llama.cpp picks for it (AMX tiles,
  CPU_REPACK layouts or the generic kernels: `engine.memory.cpu_kernels` has the rules), so
  each (type, kernel) has its own measured rate (`MachineSpeed.rates`). A layer's products
  are small (a few hundred KiB each in a model of 576-640 wide), and a kernel goes through a
  small product at a fraction of its rate on a large one (Q4_1/AMX on a 2-core Xeon: 10-14
  GB/s on 576-wide layers against 34-36 on large matrices; per-product work the size does
  not amortise: quantizing the input on one thread, a barrier inside the kernel, rows split
  unevenly over the threads). So a layer's products are keyed by their width class too
  (`layer_width`: the model's embedding and FFN widths in whole blocks of the type,
  "Q4_1/AMX@576x1536") and measured on layers of that shape; the output matrix, one large
  product, keeps the plain key.
* **Attention**: reading the cached keys and values of the context, at memory bandwidth.
* **Fixed work**: graph building, scheduling, and the threads meeting after each operation,
  a cost per layer and a cost per token that do not depend on the weights' size (on two
  cores about 0.7 ms of SmolLM2-135M's 7), which a bandwidth roofline ignores.

The step's time is the slower of the kernels' time and the memory's time (all bytes at the
measured read bandwidth) plus the fixed work. Then the token is sampled: the chat's default
sampler chain (repeat penalty, top-k, top-p, min-p, temperature) goes over every logit of the
vocabulary, a cost per vocabulary entry that the probe's small vocabularies hide (Gemma 3's
262,144 tokens: a few hundredths of a millisecond a token through the engine's sampling on a
2-core Xeon). `engine.bench.speed_probe`
measures every figure on this machine through the engine itself; nothing here is a constant
measured somewhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.memory import cpu_kernels
from engine.memory.cpu_kernels import CpuFeatures
from engine.memory.model_spec import ModelSpec, row_size
from engine.model.gguf import GGUFFile, TensorInfo

# A machine busier than this (load average per core) when measured: its figures are low.
BUSY_LOAD = 1.0


# A probe layer's widths are whole heads of this many values.
HEAD_WIDTH = 64


def kernel_key(type_name: str, buffer: str | None, width: tuple[int, int] | None = None) -> str:
    """The name a measured rate is kept under: the weight type and its kernel ("Q4_K/AMX",
    "Q5_0/generic"), and for a layer's products their width class ("Q4_1/AMX@576x1536")."""
    key = f"{type_name}/{buffer or 'generic'}"
    return key if width is None else f"{key}@{width[0]}x{width[1]}"


def split_key(key: str) -> tuple[str, str, tuple[int, int] | None]:
    """(type, kernel, width class or None) of a kernel key; ValueError when it is not one."""
    base, at, width = key.partition("@")
    type_name, _, buffer = base.partition("/")
    if not at:
        return type_name, buffer, None
    e, _, f = width.partition("x")
    return type_name, buffer, (int(e), int(f))


def base_key(key: str) -> str:
    """The kernel key without its width class."""
    return key.partition("@")[0]


def layer_width(type_name: str, n_embd: int, n_ff: int) -> tuple[int, int] | None:
    """The width class of a layer's products of `type_name`: the model's embedding and FFN
    widths rounded up to whole blocks of the type and whole 64-value heads (the shape the
    probe can build a layer of). None without both widths in the header."""
    if n_embd <= 0 or n_ff <= 0:
        return None
    try:
        block = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0]
    except KeyError:
        block = 1
    step = max(block, HEAD_WIDTH)
    return -(-n_embd // step) * step, -(-n_ff // step) * step


@dataclass(frozen=True)
class DecodeCost:
    """What one decode step of a model reads and runs, from its header alone."""

    name: str
    n_layer: int
    # Weight bytes multiplied per token, by kernel key.
    matmul_bytes: Mapping[str, int]
    # Bytes read besides the products: the embedding row, norms and biases.
    other_bytes: int
    # Bytes of cached keys and values read per token, at `n_past` cells of context.
    kv_bytes: int
    n_past: int
    n_vocab: int = 0  # what every token's sampling goes over

    @property
    def weight_bytes(self) -> int:
        return sum(self.matmul_bytes.values()) + self.other_bytes

    @property
    def bytes_per_token(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @classmethod
    def of(
        cls,
        gf: GGUFFile,
        *,
        features: CpuFeatures,
        extra_buffers: bool,
        n_past: int = 256,
        type_k: str = "f16",
        type_v: str = "f16",
    ) -> DecodeCost:
        """`features`/`extra_buffers`: the CPU whose kernel rules apply and whether the load
        may use repacked copies; `n_past`: the context already cached when the token is made."""
        tied = cpu_kernels.tied_output(gf.tensors)
        spec = ModelSpec.from_gguf(gf, features)
        matmul: dict[str, int] = {}
        other = 0
        for t in gf.tensors:
            embd = t.name == "token_embd.weight"
            if cpu_kernels.matmul_weight(t, tied_output=tied):
                width = (
                    layer_width(t.type_name, spec.n_embd, spec.n_ff)
                    if t.name.startswith("blk.")
                    else None
                )
                key = _key_of(t, features, extra_buffers, tied=tied and embd, width=width)
                matmul[key] = matmul.get(key, 0) + t.n_bytes
                if embd:
                    other += _row_bytes(t)  # and its row looked up for the input
            elif embd:
                other += _row_bytes(t)
            else:
                other += t.n_bytes
        return cls(
            name=spec.name,
            n_layer=spec.n_layer,
            matmul_bytes=matmul,
            other_bytes=other,
            kv_bytes=_kv_read(spec, n_past, type_k, type_v),
            n_past=n_past,
            n_vocab=spec.n_vocab,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "n_layer": self.n_layer,
            "matmul_bytes": dict(self.matmul_bytes),
            "other_bytes": self.other_bytes,
            "kv_bytes": self.kv_bytes,
            "n_past": self.n_past,
            "n_vocab": self.n_vocab,
        }


def _key_of(
    t: TensorInfo,
    f: CpuFeatures,
    extra_buffers: bool,
    *,
    tied: bool,
    width: tuple[int, int] | None,
) -> str:
    buffer = cpu_kernels.extra_buffer(t, f, tied_output=tied) if extra_buffers else None
    return kernel_key(t.type_name, buffer, width)


def _row_bytes(t: TensorInfo) -> int:
    rows = t.shape[1] if len(t.shape) > 1 else 1
    return t.n_bytes // max(1, rows)


def _kv_read(spec: ModelSpec, n_past: int, type_k: str, type_v: str) -> int:
    """Keys and values read by one token's attention: every cached cell of a full-attention
    layer, at most the window of a sliding-window layer."""
    total = 0
    for il in range(spec.n_layer):
        swa = il < len(spec.swa_layers) and spec.swa_layers[il] and spec.n_swa > 0
        cells = min(n_past, spec.n_swa) if swa else n_past
        n_kv = spec.n_head_kv[il] if il < len(spec.n_head_kv) else spec.n_head
        total += cells * (
            row_size(type_k, spec.head_dim_k * n_kv) + row_size(type_v, spec.head_dim_v * n_kv)
        )
    return total


@dataclass(frozen=True)
class MachineSpeed:
    """This machine's decode figures, as `engine.bench.speed_probe` measured them."""

    cpu: str
    threads: int
    bandwidth_bytes_per_s: float  # memory read bandwidth
    per_layer_s: float  # fixed work of one layer in a decode step
    per_token_s: float  # fixed work of a decode step beside the layers
    rates: Mapping[str, float] = field(default_factory=dict)  # kernel key -> weight bytes/s
    # Other programs' load when the fixed work was measured (1-minute load average per
    # core): above 1, threads waited for cores and every figure came out slow.
    load_per_core: float = 0.0
    # Sampling a token at the chat's defaults, seconds per vocabulary entry (None: not
    # measured yet, a profile kept before this figure existed).
    per_vocab_s: float | None = None

    @property
    def measured_busy(self) -> bool:
        return self.load_per_core > BUSY_LOAD

    def with_rates(self, rates: Mapping[str, float]) -> MachineSpeed:
        return replace(self, rates={**self.rates, **rates})

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpu": self.cpu,
            "threads": self.threads,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "per_layer_s": self.per_layer_s,
            "per_token_s": self.per_token_s,
            "rates": dict(self.rates),
            "load_per_core": self.load_per_core,
            "per_vocab_s": self.per_vocab_s,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MachineSpeed:
        return cls(
            cpu=str(d["cpu"]),
            threads=int(d["threads"]),
            bandwidth_bytes_per_s=float(d["bandwidth_bytes_per_s"]),
            per_layer_s=float(d["per_layer_s"]),
            per_token_s=float(d["per_token_s"]),
            rates={str(k): float(v) for k, v in dict(d.get("rates") or {}).items()},
            load_per_core=float(d.get("load_per_core") or 0.0),
            per_vocab_s=None if d.get("per_vocab_s") is None else float(d["per_vocab_s"]),
        )


@dataclass(frozen=True)
class SpeedPrediction:
    """Predicted decode speed of one model on one machine, and the parts it is made of."""

    tokens_per_s: float
    kernel_s: float  # matrix products at the measured kernel rates, plus the KV read
    memory_s: float  # every byte at the memory bandwidth
    fixed_s: float  # per-layer and per-token work
    bytes_per_token: int
    unmeasured: tuple[str, ...]  # kernel keys without a measured rate (taken at bandwidth)
    cpu: str
    threads: int
    measured_busy: bool = False
    sample_s: float = 0.0  # sampling the token at the chat's defaults

    @property
    def bound(self) -> str:
        """What limits the speed most: 'compute', 'memory' or 'overhead' (fixed work and
        sampling)."""
        step = max(self.kernel_s, self.memory_s)
        if self.fixed_s + self.sample_s > step:
            return "overhead"
        return "compute" if self.kernel_s >= self.memory_s else "memory"

    def basis(self) -> str:
        """One line saying what the figure is based on (a tooltip)."""
        ms = 1000.0
        text = (
            f"A chat reply's speed at the default sampling, predicted from the file's tensor "
            f"table and this machine's measured figures ({self.cpu}, {self.threads} threads): "
            f"{self.bytes_per_token / 2**20:.0f} MiB read per token; matrix kernels "
            f"{self.kernel_s * ms:.1f} ms, memory {self.memory_s * ms:.1f} ms, fixed work "
            f"{self.fixed_s * ms:.1f} ms, sampling {self.sample_s * ms:.2f} ms per token"
            f" ({self.bound}-bound)"
        )
        if self.unmeasured:
            text += f"; not measured here, taken at memory speed: {', '.join(self.unmeasured)}"
        if self.measured_busy:
            text += "; measured while other programs kept the cores busy, so it is low"
        return text + ". CPU decoding, one request."

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens_per_s": self.tokens_per_s,
            "kernel_s": self.kernel_s,
            "memory_s": self.memory_s,
            "fixed_s": self.fixed_s,
            "sample_s": self.sample_s,
            "bytes_per_token": self.bytes_per_token,
            "bound": self.bound,
            "unmeasured": list(self.unmeasured),
            "cpu": self.cpu,
            "threads": self.threads,
            "measured_busy": self.measured_busy,
        }


def predict(cost: DecodeCost, machine: MachineSpeed) -> SpeedPrediction:
    """Tokens per second of one request decoding alone on the CPU at the chat's default
    sampling.

    token = max(kernels, memory) + n_layer * per_layer + per_token + n_vocab * per_vocab,
    where kernels = the matrix bytes of each kernel at its measured rate, plus the rest at
    memory bandwidth; memory = every byte at memory bandwidth. A layer's kernel not measured
    at its width class takes the kernel's large-matrix rate, and a kernel never measured here
    counts at memory bandwidth (either is named in `unmeasured`)."""
    bw = machine.bandwidth_bytes_per_s
    if bw <= 0:
        raise ValueError("the memory bandwidth must be positive")
    kernel_s = (cost.other_bytes + cost.kv_bytes) / bw
    unmeasured = []
    for key, n in sorted(cost.matmul_bytes.items()):
        rate = machine.rates.get(key) or 0.0
        if rate <= 0:
            unmeasured.append(key)
            rate = machine.rates.get(base_key(key)) or bw
        kernel_s += n / rate
    memory_s = cost.bytes_per_token / bw
    fixed_s = cost.n_layer * machine.per_layer_s + machine.per_token_s
    sample_s = cost.n_vocab * (machine.per_vocab_s or 0.0)
    step = max(kernel_s, memory_s) + fixed_s + sample_s
    return SpeedPrediction(
        tokens_per_s=1.0 / step if step > 0 else 0.0,
        kernel_s=kernel_s,
        memory_s=memory_s,
        fixed_s=fixed_s,
        bytes_per_token=cost.bytes_per_token,
        unmeasured=tuple(unmeasured),
        cpu=machine.cpu,
        threads=machine.threads,
        measured_busy=machine.measured_busy,
        sample_s=sample_s,
    )


__all__ = [
    "DecodeCost",
    "MachineSpeed",
    "SpeedPrediction",
    "base_key",
    "kernel_key",
    "layer_width",
    "predict",
    "split_key",
]
