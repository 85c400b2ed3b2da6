"""The quantization types a model can be made into here, and what is decided before making one.

The names are llama-quantize's (`Q4_K_M`, `IQ4_XS`, ...), each with the llama.cpp file type
it asks for and the tensor type most big weights of that file take (llama.cpp's
`llama_ftype_get_default_type`). The types that need an importance matrix (IQ1/IQ2, IQ3_XXS,
IQ3_XS, Q2_K_S: llama.cpp refuses them without one) are named but not offered, since
Candlewick makes none yet; ternary and MXFP4/NVFP4 types are for models trained for them.

Before a quant is made: the source's main type and its bits per weight (`source_quant`), the
rule that refuses requantizing an already quantized file unless asked (`requantize_refusal`),
the size a GGUF with a given tensor table must have (`layout_size`) and an estimate of the
output's size (`estimate_size`, for the free-space check). Sizes come from the `gguf`
package's block sizes (GGML_QUANT_SIZES).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from engine.errors import EngineError
from engine.model.gguf import DEFAULT_ALIGNMENT, GGUFFile, TensorInfo, file_type_name
from engine.model.naming import file_stem, split_quantization

G = GGMLQuantizationType
F = LlamaFileType


class QuantizeError(EngineError):
    """A quant that cannot or will not be made; `str()` is one line for a user."""


class RequantizeRefused(QuantizeError):
    """The source is already quantized: made only when requantizing is allowed."""


@dataclass(frozen=True)
class QuantType:
    """One quantization a file can be made into."""

    name: str  # as llama-quantize spells it
    file_type: LlamaFileType  # what llama_model_quantize is asked for
    base: GGMLQuantizationType  # the tensor type most big weights take

    @property
    def bits_per_weight(self) -> float:
        """The base type's bits per weight (a K-quant mix raises a few tensors above it)."""
        return bits_per_weight(self.base)

    @property
    def is_float(self) -> bool:
        return self.base in FLOAT_TYPES


FLOAT_TYPES = frozenset({G.F32, G.F16, G.BF16})

# Offered, from the largest to the smallest.
QUANT_TYPES: tuple[QuantType, ...] = (
    QuantType("F16", F.MOSTLY_F16, G.F16),
    QuantType("BF16", F.MOSTLY_BF16, G.BF16),
    QuantType("Q8_0", F.MOSTLY_Q8_0, G.Q8_0),
    QuantType("Q6_K", F.MOSTLY_Q6_K, G.Q6_K),
    QuantType("Q5_1", F.MOSTLY_Q5_1, G.Q5_1),
    QuantType("Q5_K_M", F.MOSTLY_Q5_K_M, G.Q5_K),
    QuantType("Q5_K_S", F.MOSTLY_Q5_K_S, G.Q5_K),
    QuantType("Q5_0", F.MOSTLY_Q5_0, G.Q5_0),
    QuantType("Q4_1", F.MOSTLY_Q4_1, G.Q4_1),
    QuantType("Q4_K_M", F.MOSTLY_Q4_K_M, G.Q4_K),
    QuantType("Q4_K_S", F.MOSTLY_Q4_K_S, G.Q4_K),
    QuantType("Q4_0", F.MOSTLY_Q4_0, G.Q4_0),
    QuantType("IQ4_NL", F.MOSTLY_IQ4_NL, G.IQ4_NL),
    QuantType("IQ4_XS", F.MOSTLY_IQ4_XS, G.IQ4_XS),
    QuantType("Q3_K_L", F.MOSTLY_Q3_K_L, G.Q3_K),
    QuantType("Q3_K_M", F.MOSTLY_Q3_K_M, G.Q3_K),
    QuantType("Q3_K_S", F.MOSTLY_Q3_K_S, G.Q3_K),
    QuantType("IQ3_M", F.MOSTLY_IQ3_M, G.IQ3_S),
    QuantType("IQ3_S", F.MOSTLY_IQ3_S, G.IQ3_S),
    QuantType("Q2_K", F.MOSTLY_Q2_K, G.Q2_K),
)
_BY_NAME = {t.name: t for t in QUANT_TYPES}
# llama-quantize's short names for the medium K-quant mixes.
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
NEEDS_IMATRIX = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M"}) | {
    "IQ3_XXS",
    "IQ3_XS",
    "Q2_K_S",
}


def quant_type_names() -> list[str]:
    """The types `parse_quant_type` accepts (aliases aside), largest first."""
    return [t.name for t in QUANT_TYPES]


def parse_quant_type(name: str) -> QuantType:
    """A type by name (any case; llama-quantize's aliases Q3_K, Q4_K, Q5_K too), or
    QuantizeError naming the valid ones."""
    key = name.strip().upper().replace("-", "_")
    key = ALIASES.get(key, key)
    found = _BY_NAME.get(key)
    if found is not None:
        return found
    if key in NEEDS_IMATRIX:
        raise QuantizeError(
            f"{key} needs an importance matrix, which Candlewick does not make; "
            f"choose one of {', '.join(quant_type_names())}"
        )
    raise QuantizeError(
        f"unknown quantization type '{name}'; choose one of {', '.join(quant_type_names())}"
    )


def bits_per_weight(ggml_type: int) -> float:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return size * 8 / block


# The tensors llama.cpp gives their own types whatever the file type (the input embedding and
# the output projection): they say little about what a file is.
_EDGE_TENSORS = frozenset({"token_embd.weight", "output.weight"})


@dataclass(frozen=True)
class SourceQuant:
    """What a file is quantized as: the type holding most of its big weights."""

    main_type: GGMLQuantizationType
    file_type: int | None  # general.file_type, when the file says

    @property
    def bits_per_weight(self) -> float:
        return bits_per_weight(self.main_type)

    @property
    def is_float(self) -> bool:
        return self.main_type in FLOAT_TYPES

    @property
    def label(self) -> str:
        """'Q4_K_M' from the file type when it names one, else the main type ('Q4_1')."""
        if self.file_type is not None and self.file_type in {t.file_type for t in QUANT_TYPES}:
            return file_type_name(self.file_type)
        return self.main_type.name


def source_quant(gf: GGUFFile) -> SourceQuant:
    """The source's main type: by elements, over its weights of two or more dimensions but the
    embedding and the output (a file with only those counts them)."""
    weights = [t for t in gf.tensors if len(t.shape) >= 2 and t.ggml_type in GGML_QUANT_SIZES]
    body = [t for t in weights if t.name not in _EDGE_TENSORS] or weights
    if not body:
        raise QuantizeError(f"{gf.source_name} has no weight matrices to quantize")
    elements: Counter[int] = Counter()
    for t in body:
        elements[t.ggml_type] += t.n_elements
    main = GGMLQuantizationType(elements.most_common(1)[0][0])
    ft = gf.metadata.get("general.file_type")
    return SourceQuant(main, ft if isinstance(ft, int) else None)


RefusalKind = Literal["not-smaller", "requantize"]


def refusal_kind(source: SourceQuant, target: QuantType) -> RefusalKind | None:
    """Why `target` from `source` waits to be allowed: a target with as many bits per weight
    as the source or more only grows the file (the detail lost stays lost); a quantized
    source quantized again loses more than its 16-bit original would."""
    if target.bits_per_weight >= source.bits_per_weight:
        return "not-smaller"
    if not source.is_float:
        return "requantize"
    return None


def requantize_refusal(source: SourceQuant, target: QuantType, name: str) -> str | None:
    """`refusal_kind` in one line for a user, naming the file `name`; None when allowed."""
    kind = refusal_kind(source, target)
    src = f"{source.label}, {source.bits_per_weight:.2f} bits per weight"
    if kind == "not-smaller":
        return (
            f"{target.name} ({target.bits_per_weight:.2f} bits per weight) is not smaller than "
            f"{name} ({src}): the file would not shrink, and what the source lost stays lost"
        )
    if kind == "requantize":
        return (
            f"{name} is already quantized ({src}): quantizing it again to {target.name} "
            "loses more quality than quantizing its 16-bit original"
        )
    return None


def check_requantize(
    source: SourceQuant, target: QuantType, name: str, *, allow_requantize: bool
) -> None:
    """Raise RequantizeRefused unless `target` may be made from `source`. The same file type
    again is refused even when requantizing is allowed: it would be a copy."""
    if source.file_type is not None and source.file_type == target.file_type:
        raise QuantizeError(f"{name} is already {target.name}")
    why = requantize_refusal(source, target, name)
    if why is not None and not allow_requantize:
        raise RequantizeRefused(why)


def _pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def alignment_of(gf: GGUFFile) -> int:
    a = gf.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    return a if isinstance(a, int) and a > 0 else DEFAULT_ALIGNMENT


def layout_size(gf: GGUFFile) -> int:
    """The size a GGUF with this header and tensor table has when its tensors lie one after
    the other in table order, each padded to the alignment, as llama.cpp writes them; 0 when
    they do not lie so (an offset out of place)."""
    alignment = alignment_of(gf)
    at = 0
    for t in gf.tensors:
        if t.offset != at:
            return 0
        at += _pad(t.n_bytes, alignment)
    return gf.data_offset + at


def tensor_bytes(shape: tuple[int, ...], ggml_type: int) -> int:
    """A tensor's data size in `ggml_type` (its rows must fill whole blocks)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    n = 1
    for d in shape:
        n *= d
    return n // block * size


# llama.cpp's tensor_type_fallback: a row that does not fill whole blocks of the wanted type
# takes a type with 32-element blocks instead (F16 when even that does not fit).
_FALLBACK = {
    G.Q2_K: G.Q4_0,
    G.Q3_K: G.Q4_0,
    G.Q4_K: G.Q5_0,
    G.Q5_K: G.Q5_1,
    G.Q6_K: G.Q8_0,
    G.IQ3_S: G.IQ4_NL,
    G.IQ4_XS: G.IQ4_NL,
}


def shape_type(wanted: GGMLQuantizationType, row: int) -> GGMLQuantizationType:
    """The type a tensor whose rows have `row` elements takes when `wanted` is asked for."""
    if row % GGML_QUANT_SIZES[wanted][0] == 0:
        return wanted
    fallback = _FALLBACK.get(wanted, wanted)
    return fallback if row % GGML_QUANT_SIZES[fallback][0] == 0 else G.F16


def _quantized_alike(t: TensorInfo) -> bool:
    # llama.cpp quantizes weight matrices; norms, biases and other vectors stay as they are.
    return len(t.shape) >= 2 and t.name.endswith(".weight")


def planned_type(t: TensorInfo, target: QuantType, *, tied: bool) -> GGMLQuantizationType:
    """The type llama.cpp gives `t` before a K-quant mix raises some layers: a float target
    for every matrix; else the output matrix (the embedding too when `tied`: it is the output)
    in Q6_K (Q8_0 when its rows do not fill the target's blocks, or for a Q8_0 target), the
    other matrices in the target's base type; each then fitted to its row."""
    if not _quantized_alike(t):
        return GGMLQuantizationType(t.ggml_type)
    if target.is_float:
        return target.base
    kind = target.base
    if t.name == "output.weight" or (tied and t.name == "token_embd.weight"):
        fits = t.shape[0] % GGML_QUANT_SIZES[kind][0] == 0
        kind = G.Q6_K if fits and kind != G.Q8_0 else G.Q8_0
    return shape_type(kind, t.shape[0])


QUANTIZATION_VERSION = "general.quantization_version"


def estimate_size(gf: GGUFFile, target: QuantType) -> int:
    """About the size of `target` made from `gf`, header and padding included: each tensor in
    `planned_type`. Exact for the single-type targets (Q4_0, Q8_0, ...); a K-quant mix (Q4_K_M,
    Q2_K, ...) raises a few layers above the base type, so its file is a few percent larger."""
    alignment = alignment_of(gf)
    tied = gf.tensor("output.weight") is None
    header = gf.header_end
    if QUANTIZATION_VERSION not in gf.metadata:  # llama.cpp adds it: key, value type, u32
        header += 8 + len(QUANTIZATION_VERSION) + 4 + 4
    total = _pad(header, alignment)
    for t in gf.tensors:
        kind = planned_type(t, target, tied=tied)
        total += _pad(tensor_bytes(t.shape, kind), alignment)
    return total


_NAME_SAFE = re.compile(r"[^\w.+-]+")


def output_name(source: Path, target: QuantType) -> str:
    """`<stem without its quantization>-<TYPE>.gguf`: SmolLM2-135M-Instruct.Q4_1.gguf made
    into Q4_0 is SmolLM2-135M-Instruct-Q4_0.gguf."""
    stem, _quant = split_quantization(file_stem(source.name))
    stem = _NAME_SAFE.sub("-", stem).strip("-.") or "model"
    return f"{stem}-{target.name}.gguf"


@dataclass(frozen=True)
class QuantChoice:
    """One type a file could be made into: its size before it is made, and why it would be
    refused without allowing requantization (None: made without asking)."""

    qtype: QuantType
    estimated_bytes: int
    exact: bool  # a single-type target of a dense model: the estimate is the file's size
    refusal: str | None
    refusal_kind: RefusalKind | None


def quant_choices(gf: GGUFFile, name: str) -> list[QuantChoice]:
    """Every offered type for `gf` (its file `name`), largest first, but its own type."""
    src = source_quant(gf)
    experts = gf.arch_value("expert_count", 0)
    dense = not isinstance(experts, int) or experts <= 1  # llama.cpp mixes expert models' types
    return [
        QuantChoice(
            t,
            estimate_size(gf, t),
            dense and t.name in _SINGLE_TYPE,
            requantize_refusal(src, t, name),
            refusal_kind(src, t),
        )
        for t in QUANT_TYPES
        if src.file_type is None or src.file_type != t.file_type
    ]


# The targets without a mix (without an importance matrix): every matrix but the output takes
# the base type.
_SINGLE_TYPE = frozenset({"F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0"})
