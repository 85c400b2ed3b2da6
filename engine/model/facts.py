"""Model facts from GGUF metadata alone: what a model is, without loading its weights."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from engine.model.gguf import ArraySummary, GGUFFile, file_type_name, ggml_type_name
from engine.model.naming import derive_name

# llama.cpp's LLAMA_POOLING_TYPE_RANK: the pooled row goes through a classifier head and
# comes out as relevance scores (a reranker), not as a sentence vector.
POOLING_RANK = 4


@dataclass(frozen=True)
class ModelFacts:
    name: str  # general.name as the file has it (or the file name)
    architecture: str
    n_params: int
    quantization: str
    tensor_types: dict[str, int]  # ggml type name -> number of tensors
    size_bytes: int  # bytes of tensor data
    file_bytes: int
    context_length: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    sliding_window: int  # 0 = none
    swa_layers: tuple[bool, ...]  # per layer: uses the sliding window
    vocab_size: int
    chat_template: str | None
    # The readable name from the file name and `general.*` (engine.model.naming), e.g.
    # "SmolLM2 135M Instruct · Q4_1"; the library may know better (a repository, a rename).
    display_name: str = ""
    # How the file pools token vectors into one sentence vector (llama.cpp's
    # `{arch}.pooling_type`: 1 mean, 2 CLS, 3 last, 4 rank); 0: none said, a text generator.
    pooling_type: int = 0

    @property
    def embedding_only(self) -> bool:
        """A sentence-embedding model (BERT and its kind): it pools, it does not generate."""
        return self.pooling_type > 0

    @property
    def is_reranker(self) -> bool:
        """A reranker: it scores (query, document) pairs; it neither embeds nor generates."""
        return self.pooling_type == POOLING_RANK

    @property
    def params_label(self) -> str:
        n = self.n_params
        if n >= 1e9:
            return f"{n / 1e9:.1f}B"
        return f"{n / 1e6:.0f}M"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["swa_layers"] = sum(self.swa_layers)
        d.pop("chat_template")
        d["has_chat_template"] = self.chat_template is not None
        d["params_label"] = self.params_label
        return d


def _per_layer(value: Any, n_layer: int, default: int) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value][:n_layer] + [default] * max(0, n_layer - len(value))
    if value is None:
        return [default] * n_layer
    return [int(value)] * n_layer


def swa_layer_pattern(gf: GGUFFile, n_layer: int) -> tuple[bool, ...]:
    """Which layers attend through a sliding window, as this llama.cpp decides it.

    Newer GGUFs store `{arch}.attention.sliding_window_pattern` as a per-layer bool array;
    older Gemma-3 files store nothing and llama.cpp uses its built-in pattern of 6
    (every 6th layer is global). Gemma-2 alternates (pattern 2).
    """
    if not int(gf.arch_value("attention.sliding_window", 0) or 0):
        return tuple(False for _ in range(n_layer))
    pattern = gf.arch_value("attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return tuple(bool(v) for v in pattern[:n_layer])
    arch = gf.architecture
    period = (
        int(pattern)
        if isinstance(pattern, int) and pattern > 0
        else {
            "gemma2": 2,
            "gemma3": 6,
            "gemma3n": 5,
            "cohere2": 4,
            "llama4": 4,
        }.get(arch, 0)
    )
    if period <= 0:
        return tuple(True for _ in range(n_layer))
    # llama.cpp's `set_swa_pattern(n)`: layer il is SWA unless (il % n) == n - 1.
    return tuple((il % period) < period - 1 for il in range(n_layer))


def model_facts(gf: GGUFFile) -> ModelFacts:
    md = gf.metadata
    n_layer = int(gf.arch_value("block_count", 0) or 0)
    n_embd = int(gf.arch_value("embedding_length", 0) or 0)
    heads = _per_layer(gf.arch_value("attention.head_count"), n_layer, 0)
    n_head = max(heads, default=0)
    heads_kv = _per_layer(gf.arch_value("attention.head_count_kv"), n_layer, n_head)
    n_head_kv = max(heads_kv, default=n_head)
    default_head = n_embd // n_head if n_head else 0
    head_k = int(gf.arch_value("attention.key_length", default_head) or default_head)
    head_v = int(gf.arch_value("attention.value_length", default_head) or default_head)
    tokens = md.get("tokenizer.ggml.tokens")
    vocab = int(gf.arch_value("vocab_size", 0) or 0) or (
        len(tokens) if isinstance(tokens, list | ArraySummary) else 0
    )
    tmpl = md.get("tokenizer.chat_template")
    types = Counter(ggml_type_name(t.ggml_type) for t in gf.tensors)
    ft = md.get("general.file_type")
    quant = file_type_name(ft) if isinstance(ft, int) else _dominant_type(gf)
    name = md.get("general.name") or gf.source_name
    return ModelFacts(
        name=str(name),
        architecture=gf.architecture,
        n_params=sum(t.n_elements for t in gf.tensors),
        quantization=quant,
        tensor_types=dict(types.most_common()),
        size_bytes=sum(t.n_bytes for t in gf.tensors),
        file_bytes=gf.file_size,
        context_length=int(gf.arch_value("context_length", 0) or 0),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_k,
        head_dim_v=head_v,
        sliding_window=int(gf.arch_value("attention.sliding_window", 0) or 0),
        swa_layers=swa_layer_pattern(gf, n_layer),
        vocab_size=vocab,
        chat_template=tmpl if isinstance(tmpl, str) else None,
        display_name=derive_name(gf.source_name, md, quantization=quant),
        pooling_type=embedding_pooling(gf),
    )


def embedding_pooling(gf: GGUFFile) -> int:
    """The file's pooling type (0 when it has none, or an unknown value)."""
    value = gf.arch_value("pooling_type", 0)
    return (
        value
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= POOLING_RANK
        else 0
    )


def _dominant_type(gf: GGUFFile) -> str:
    by_bytes: Counter[str] = Counter()
    for t in gf.tensors:
        if len(t.shape) >= 2:
            by_bytes[ggml_type_name(t.ggml_type)] += t.n_bytes
    return by_bytes.most_common(1)[0][0] if by_bytes else "unknown"
