"""What a quant made from the bundled SmolLM2 must be: the source's tensors and shapes (llama.cpp
writes them in its own order), each tensor's bytes from its type's block size (the `gguf`
package's table), the file exactly its header plus the tensors one after the other, each
padded to the alignment, and the types llama.cpp gives SmolLM2's tensors. The tensor table is
read with engine.model.gguf (the `gguf` package's reader takes ten seconds over SmolLM2's
vocabulary); the sizes are computed here.

SmolLM2-135M's rows are 576 elements wide (1536 for ffn_down): a type with 256-element blocks
(the K-quants) does not fit a 576-element row, and llama.cpp falls back to a 32-element type
for those tensors. The embedding, which is also the output matrix (tied), gets llama.cpp's
output type (Q6_K, Q8_0 for a row that does not fit 256).
"""

from __future__ import annotations

from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.model.gguf import read_gguf

G = GGMLQuantizationType

# The types llama.cpp (the vendored version's llama-quant.cpp) gives SmolLM2's layer matrices,
# by the tensor's kind: Q4_0 fits every row; the Q2_K mix raises ffn_down to Q3_K, whose
# 256-element blocks fit ffn_down's 1536-element rows, and the 576-element rows of the rest
# fall back from Q2_K (and attn_v's Q3_K) to Q4_0.
SMOLLM2_LAYER_TYPES: dict[str, dict[str, GGMLQuantizationType]] = {
    "Q4_0": {"ffn_down": G.Q4_0, "other": G.Q4_0},
    "Q2_K": {"ffn_down": G.Q3_K, "other": G.Q4_0},
}


def check_smollm2_quant(path: Path, source: Path, qtype: str) -> dict[str, GGMLQuantizationType]:
    """Assert what `path`, made from SmolLM2 `source` as `qtype`, must be; its types by name."""
    made, src = read_gguf(path), read_gguf(source)
    assert sorted((t.name, t.shape) for t in made.tensors) == sorted(
        (t.name, t.shape) for t in src.tensors
    )
    alignment = made.metadata.get("general.alignment", 32)
    at = 0
    for t in made.tensors:
        block, size = GGML_QUANT_SIZES[G(t.ggml_type)]
        assert t.shape[0] % block == 0, t.name
        n_bytes = t.n_elements // block * size
        assert t.n_bytes == n_bytes, t.name
        assert t.offset == at, t.name  # one after the other, in table order
        at += -(-n_bytes // alignment) * alignment
    # the header plus every tensor, padded: nothing more
    assert path.stat().st_size == made.data_offset + at
    types = {t.name: G(t.ggml_type) for t in made.tensors}
    wanted = SMOLLM2_LAYER_TYPES[qtype]
    for t in made.tensors:
        if len(t.shape) == 1:
            assert types[t.name] == G.F32, t.name  # norms stay as they are
        elif t.name == "token_embd.weight":
            assert types[t.name] == G.Q8_0  # the tied output: Q6_K, whose rows are 256: Q8_0
        else:
            kind = "ffn_down" if ".ffn_down." in t.name else "other"
            assert types[t.name] == wanted[kind], (t.name, types[t.name])
    return types
