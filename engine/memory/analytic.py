"""The analytic model: KV cache, output and compute buffers from a model's header numbers.

KV per layer is `row_size(type, head_dim * n_head_kv) * cells`, with sliding-window layers and
`swa_full`; the context is padded to 256; the compute buffer is fitted on this llama.cpp's dry
runs (docs/memory.md): the logits of a full micro-batch dominate small models with big
vocabularies.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.memory.model_spec import ModelSpec, row_size
from engine.memory.params import EstimateParams

CTX_PAD = 256  # llama.cpp pads the context (and the SWA cache) to a multiple of 256


def pad(n: int, to: int = CTX_PAD) -> int:
    return (n + to - 1) // to * to


# -- the analytic model ----------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """Context geometry after llama.cpp's own adjustments."""

    n_ctx: int  # total cells of a full-attention layer (all streams)
    n_ctx_seq: int  # cells per stream (= what one sequence can attend to)
    n_stream: int
    n_ubatch: int
    n_outputs: int  # rows of logits the worst-case graph computes


def shape(spec: ModelSpec, p: EstimateParams) -> Shape:
    n_ctx = p.load.n_ctx if p.load.n_ctx > 0 else spec.n_ctx_train
    n_batch = min(n_ctx, p.load.n_batch)  # causal attention: a batch never exceeds the context
    n_ubatch = min(n_batch, p.load.n_ubatch)
    n_ctx = pad(n_ctx)
    if p.kv_unified:
        n_ctx_seq, n_stream = n_ctx, 1
    else:
        n_ctx_seq = pad(n_ctx // p.load.n_seq_max)
        n_stream = p.load.n_seq_max
        n_ctx = n_ctx_seq * n_stream
    return Shape(n_ctx, n_ctx_seq, n_stream, n_ubatch, min(n_ubatch, n_batch))


def kv_bytes_per_layer(spec: ModelSpec, p: EstimateParams) -> list[int]:
    s = shape(spec, p)
    full = s.n_ctx_seq
    swa = (
        full
        if p.swa_full
        else pad(min(full, spec.n_swa * (p.load.n_seq_max if p.kv_unified else 1) + s.n_ubatch))
    )
    out = []
    for il in range(spec.n_layer):
        cells = (swa if il < len(spec.swa_layers) and spec.swa_layers[il] else full) * s.n_stream
        n_kv = spec.n_head_kv[il]
        out.append(
            (
                row_size(p.load.type_k, spec.head_dim_k * n_kv)
                + row_size(p.load.type_v, spec.head_dim_v * n_kv)
            )
            * cells
        )
    return out


def output_buffer_bytes(spec: ModelSpec, p: EstimateParams) -> int:
    """Host buffer for the logits (and embeddings) of one output row per sequence."""
    per_row = spec.n_vocab * 4 + (spec.n_embd * 4 if p.load.embeddings else 0)
    return per_row * p.load.n_seq_max


def flash_attention_used(p: EstimateParams) -> bool:
    # `estimate()` has already resolved the engine's 'auto'; what is left as 'auto' is
    # llama.cpp's, which turns it on for CPU, CUDA, Metal and Vulkan with common head sizes.
    return p.load.flash_attn != "off"


def compute_phases(spec: ModelSpec, p: EstimateParams) -> tuple[int, int]:
    """(output phase, layer phase) peak bytes of the worst-case graph (one full micro-batch).

    The compute buffer holds the peak of live intermediate tensors. Fitted on this llama.cpp's
    dry runs (docs/memory.md): the output phase is the logits of every token of the
    micro-batch plus two activation rows; a layer holds the FFN and a few activation rows, and
    without flash attention the full f32 attention scores (n_head + the mask) over the cache.
    """
    s = shape(spec, p)
    ub = s.n_ubatch
    out_phase = 4 * (s.n_outputs * spec.n_vocab + 2 * ub * spec.n_embd)
    body = 4 * ub * (spec.n_ff + 3 * spec.n_embd)
    if flash_attention_used(p):
        attn = 2 * ub * s.n_ctx_seq  # the f16 mask
    else:
        attn = 4 * ub * s.n_ctx_seq * (spec.n_head + 1)  # f32 scores + f32 mask
    return out_phase, body + attn


# make setup's llama.cpp (installers/llama_cpp/graph_lanes.patch) keeps a graph of its own for
# each of the last GRAPH_LANES batch sizes from 2 to GRAPH_LANE_MAX_TOKENS tokens, beside the
# main one, each with a compute buffer sized by its own graph.
GRAPH_LANES = 4
GRAPH_LANE_MAX_TOKENS = 8


def graph_lanes_share(spec: ModelSpec, p: EstimateParams) -> float:
    """The small-batch lanes' compute buffers as a share of the main one (its graph's size
    grows with the micro-batch): at most the largest lane sizes' tokens over a micro-batch."""
    ub = shape(spec, p).n_ubatch
    top = min(GRAPH_LANE_MAX_TOKENS, ub)
    return sum(range(max(2, top - GRAPH_LANES + 1), top + 1)) / ub


def mask_bytes(spec: ModelSpec, p: EstimateParams) -> int:
    """The KQ mask of one micro-batch: f16 with flash attention, f32 without."""
    s = shape(spec, p)
    return (2 if flash_attention_used(p) else 4) * s.n_ubatch * s.n_ctx_seq
