"""A small LoRA adapter (a GGUF "adapter" file) with seeded random weights for a base model,
in the layout the vendored llama.cpp's convert_lora_to_gguf.py writes and llama-adapter.cpp loads.

No adapter trained for SmolLM2-135M can be had without the network, so one is built here. The
PIPELINE is real (the GGUF keys, tensor names and shapes llama.cpp checks, its loader and the
adapter's matrices added in the graph); the WEIGHTS are noise: an adapted model says something
else, nothing better.

    keys    general.architecture = the base model's (llama.cpp refuses another),
            general.type "adapter", adapter.type "lora", adapter.lora.alpha = RANK
            (llama.cpp scales the product by scale * alpha / rank: scale 1 adds B·A as written)
    tensors blk.N.attn_q.weight.lora_a [RANK, n_embd] and .lora_b [n_embd, RANK],
            blk.N.attn_v.weight.lora_a [RANK, n_embd] and .lora_b [n_embd_v, RANK]
            for every layer N; F32. Shapes in PyTorch order ([out, in]); the GGUF stores them
            reversed, as ggml's ne: lora_a ne = [n_in, rank], lora_b ne = [rank, n_out], the
            checks in llama_adapter_lora_init ("tensor has incorrect shape").

Weights: numpy.random.default_rng(SEED), normal; A scaled by 1/sqrt(n_in) so A·x stays near the
size of x's entries, B by B_SCALE, large enough that the greedy answer of SmolLM2 changes at
scale 1 (tests/engine/server/test_lora.py checks it does).
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np

SEED = 20240611
RANK = 8
B_SCALE = 0.5
TARGETS = ("attn_q", "attn_v")


def write_lora(base: Path, out: Path) -> Path:
    """Write the test adapter for `base` (a GGUF model) to `out`; appears whole or not at all."""
    reader = gguf.GGUFReader(base)
    arch = str(reader.fields["general.architecture"].contents())
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    blocks = int(reader.fields[f"{arch}.block_count"].contents())
    rng = np.random.default_rng(SEED)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    w = gguf.GGUFWriter(part, arch=arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_name("Candlewick test LoRA (random weights)")
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(RANK))
    for n in range(blocks):
        for target in TARGETS:
            name = f"blk.{n}.{target}.weight"
            n_in, n_out = shapes[name][0], shapes[name][1]  # ggml's ne order
            a = rng.standard_normal((RANK, n_in)) / np.sqrt(n_in)
            b = rng.standard_normal((n_out, RANK)) * B_SCALE
            w.add_tensor(f"{name}.lora_a", a.astype(np.float32))
            w.add_tensor(f"{name}.lora_b", b.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(part, out)
    return out


def tensor_bytes(path: Path) -> int:
    """The adapter's tensor bytes: what llama.cpp allocates for it beside the model."""
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)
