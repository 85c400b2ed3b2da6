"""The numbers a model's memory depends on, read from its GGUF header alone."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import EngineError
from engine.memory import cpu_kernels
from engine.memory.cpu_kernels import CpuFeatures
from engine.memory.params import EstimateParams
from engine.model.facts import swa_layer_pattern
from engine.model.gguf import ArraySummary, GGUFFile, TensorInfo
from engine.settings import KV_TYPES, use_extra_buffers

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
        return use_extra_buffers(p.load.extra_buffers)
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
