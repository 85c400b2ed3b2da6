"""Check that the model inside a GGUF file is coherent before llama.cpp loads it.

`engine.model.gguf` proves the container is sound (sizes, offsets, counts). A sound container can
still hold an impossible model: a block count of 0 or 1000, seven heads for 576-wide
embeddings, a vocabulary whose arrays disagree. llama.cpp meets some of these with a
GGML_ASSERT, which aborts the whole process, and others with a bare "failed to load model".
`check_model` finds them first and says, in one line, which key holds which value.

What is checked is only what llama.cpp itself relies on, so every file it loads still passes:
- for every architecture the `gguf` package knows: the limits llama.cpp asserts (block and
  expert counts), block_count against the `blk.N` tensors, head counts that divide, the
  vocabulary arrays, BOS/EOS inside the vocabulary, the embedding table's row count;
- for architectures whose llama.cpp loader uses the plain llama layout (`LLAMA_LAYOUT`): the
  tensors every block needs, with the shapes that follow from the hyper-parameters.
Architectures the `gguf` package does not know are passed through: llama.cpp decides.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from gguf.constants import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES

from engine.model.gguf import ArraySummary, GGUFError, GGUFFile, TensorInfo

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS: llama.cpp asserts 0 < block_count <= this
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # anything else is an assert
_STRING_ITEM = 8  # GGUF value type of a string

_ARCH_BY_NAME = {name: arch for arch, name in MODEL_ARCH_NAMES.items()}
# Loaders in llama.cpp (src/models/<arch>.cpp) that create, in every block: attn_norm, Q/K/V
# (or a fused QKV), attn_output, ffn_norm and, without experts, ffn_gate/up/down, all with the
# llama shapes. Others differ (fused up+gate in phi3, MLA in deepseek2, ...) and get the
# architecture-independent checks only.
LLAMA_LAYOUT = frozenset(
    {MODEL_ARCH.LLAMA, MODEL_ARCH.QWEN3, MODEL_ARCH.GEMMA2, MODEL_ARCH.GEMMA3, MODEL_ARCH.MISTRAL3}
)
_BLOCK = re.compile(r"^blk\.(\d+)\.")


class _Problem(Exception):
    """The first incoherence found; its text is the message, without the file name."""


def check_model(gf: GGUFFile) -> None:
    """Raise GGUFError with a one-line reason if the model in `gf` cannot be coherent."""
    problem = find_problem(gf)
    if problem is not None:
        raise GGUFError(f"{gf.source_name}: {problem}")


def find_problem(gf: GGUFFile) -> str | None:
    """The first reason the model in `gf` is incoherent, or None."""
    arch = _ARCH_BY_NAME.get(gf.architecture)
    if arch is None or arch == MODEL_ARCH.MMPROJ:  # projectors have no language-model keys
        return None
    try:
        _check(gf, arch)
    except _Problem as e:
        return str(e)
    return None


def _check(gf: GGUFFile, arch: MODEL_ARCH) -> None:
    md = gf.metadata
    k = _Keys(md, gf.architecture)
    n_layer = k.uint("block_count", required=True)
    assert n_layer is not None
    blocks = _blocks_present(gf)
    complete = _tensor_table_complete(gf)
    if not 0 < n_layer <= MAX_LAYERS:
        if blocks:
            raise _Problem(
                f"{k.name('block_count')} is {n_layer} but the file has tensors for {blocks} blocks"
            )
        raise _Problem(
            f"{k.name('block_count')} is {n_layer} (llama.cpp accepts 1 to {MAX_LAYERS})"
        )
    if complete and _uses_blocks(arch) and blocks != n_layer:
        raise _Problem(
            f"{k.name('block_count')} is {n_layer} but the file has tensors for {blocks} blocks"
        )
    k.uint("context_length", required=True)
    n_embd = k.uint("embedding_length", required=True)
    assert n_embd is not None
    if n_embd == 0:
        raise _Problem(f"{k.name('embedding_length')} is 0")

    n_head = k.per_layer("attention.head_count", n_layer, default=0)
    n_head_kv = k.per_layer("attention.head_count_kv", n_layer, default=None) or n_head
    head_k = k.uint("attention.key_length")
    head_v = k.uint("attention.value_length")
    for h, h_kv in zip(n_head, n_head_kv, strict=True):
        if h and head_k is None and n_embd % h:
            raise _Problem(
                f"{k.name('attention.head_count')} is {h}, which does not divide "
                f"{k.name('embedding_length')} {n_embd}"
            )
        if h and h_kv and h % h_kv:
            raise _Problem(
                f"{k.name('attention.head_count_kv')} is {h_kv}, which does not "
                f"divide {k.name('attention.head_count')} {h}"
            )
    for key in ("attention.key_length", "attention.value_length"):
        if k.uint(key) == 0:
            raise _Problem(f"{k.name(key)} is 0")
    n_ff = k.per_layer("feed_forward_length", n_layer, default=0)
    n_expert = _check_experts(k, n_layer)
    nextn = k.uint("nextn_predict_layers", default=0) or 0
    if nextn > n_layer:
        raise _Problem(
            f"{k.name('nextn_predict_layers')} is {nextn}, more than "
            f"{k.name('block_count')} {n_layer}"
        )
    scaling = md.get(k.name("rope.scaling.type"))
    if scaling is not None and scaling not in ROPE_SCALING_TYPES:
        raise _Problem(
            f"{k.name('rope.scaling.type')} is {_show(scaling)} (llama.cpp knows "
            f"{', '.join(ROPE_SCALING_TYPES)})"
        )

    n_vocab = _check_vocab(md)
    if not complete:
        return
    embd = gf.tensor("token_embd.weight")
    if (
        n_vocab is not None
        and embd is not None
        and len(embd.shape) == 2
        and embd.shape[1] != n_vocab
    ):
        raise _Problem(
            f"tensor 'token_embd.weight' has {embd.shape[1]} rows but "
            f"tokenizer.ggml.tokens has {n_vocab} tokens"
        )
    if arch in LLAMA_LAYOUT:
        if not all(n_head) or not all(n_head_kv):
            key = "attention.head_count" if not all(n_head) else "attention.head_count_kv"
            raise _Problem(
                f"{k.name(key)} is 0 (a {gf.architecture} model needs at least one attention head)"
            )
        if n_expert == 0 and not all(n_ff):
            raise _Problem(f"{k.name('feed_forward_length')} is 0")
        dims = _LlamaDims(k, n_embd, n_vocab, n_head, n_head_kv, head_k, head_v, n_ff)
        _check_llama_layout(gf, dims, n_layer, n_expert)


def _check_experts(k: _Keys, n_layer: int) -> int:
    """The expert limits llama.cpp asserts; returns the expert count."""
    n_expert = k.uint("expert_count", default=0) or 0
    if n_expert > MAX_EXPERTS:
        raise _Problem(
            f"{k.name('expert_count')} is {n_expert} (llama.cpp supports at most {MAX_EXPERTS})"
        )
    used = max(k.per_layer("expert_used_count", n_layer, default=0))
    if used > n_expert:
        raise _Problem(
            f"{k.name('expert_used_count')} is {used}, more than "
            f"{k.name('expert_count')} {n_expert}"
        )
    if n_expert and not used:
        raise _Problem(
            f"{k.name('expert_used_count')} is 0 but {k.name('expert_count')} is {n_expert}"
        )
    groups = k.uint("expert_group_count", default=0) or 0
    group_used = k.uint("expert_group_used_count", default=0) or 0
    if groups and (
        not n_expert
        or groups >= n_expert
        or n_expert % groups
        or (groups > 1 and not 0 < group_used < groups)
    ):
        raise _Problem(
            f"{k.name('expert_group_count')} is {groups}, which does not fit "
            f"{k.name('expert_count')} {n_expert} and "
            f"{k.name('expert_group_used_count')} {group_used}"
        )
    return n_expert


def _check_vocab(md: dict[str, Any]) -> int | None:
    """The vocabulary arrays agree and BOS/EOS are inside it; returns the token count."""
    tokens = md.get("tokenizer.ggml.tokens")
    if tokens is None:
        return None
    if not _is_string_array(tokens):
        raise _Problem(f"tokenizer.ggml.tokens is {_show(tokens)}, not a list of token strings")
    n_vocab = len(tokens)
    if n_vocab == 0:
        raise _Problem("tokenizer.ggml.tokens is empty")
    dup = tokens.duplicate if isinstance(tokens, ArraySummary) else _first_duplicate(tokens)
    if dup is not None:
        # llama.cpp asserts every token string is unique (its token-to-id map must be as long
        # as the list).
        raise _Problem(f"tokenizer.ggml.tokens has a duplicate token at index {dup}")
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        arr = md.get(key)
        if arr is None:
            continue
        if not _is_number_array(arr):
            raise _Problem(f"{key} is {_show(arr)}, not a list of numbers")
        if len(arr) != n_vocab:
            raise _Problem(f"{key} has {len(arr)} entries but tokenizer.ggml.tokens has {n_vocab}")
    # Only BOS and EOS: llama.cpp falls back to its default for any other special id out of
    # range, and published files carry e.g. a padding id one past the vocabulary.
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        tid = md.get(key)
        if tid is None:
            continue
        if not _is_int(tid):
            raise _Problem(f"{key} is {_show(tid)}, not a token id")
        if not 0 <= tid < n_vocab:
            raise _Problem(f"{key} is {tid} but the vocabulary has {n_vocab} tokens")
    return n_vocab


class _LlamaDims:
    """Expected tensor shapes of the llama layout, each dimension with the keys behind it."""

    def __init__(
        self,
        k: _Keys,
        n_embd: int,
        n_vocab: int | None,
        n_head: list[int],
        n_head_kv: list[int],
        head_k: int | None,
        head_v: int | None,
        n_ff: list[int],
    ) -> None:
        self.k = k
        self.n_embd = n_embd
        self.n_vocab = n_vocab
        self.n_head = n_head
        self.n_head_kv = n_head_kv
        self.head_k = head_k
        self.head_v = head_v
        self.n_ff = n_ff

    def embd(self) -> tuple[int, str]:
        return self.n_embd, f"{self.k.name('embedding_length')} is {self.n_embd}"

    def heads(self, il: int, kv: bool, value: bool) -> tuple[int, str]:
        key = "attention.head_count_kv" if kv else "attention.head_count"
        n = (self.n_head_kv if kv else self.n_head)[il]
        size = self.head_v if value else self.head_k
        if size is not None:
            length = "attention.value_length" if value else "attention.key_length"
            return n * size, f"{self.k.name(key)} is {n} (x {self.k.name(length)} {size})"
        h = self.n_head[il]
        size = self.n_embd // h
        return n * size, (
            f"{self.k.name(key)} is {n} (x head size {size} = {self.n_embd} / "
            f"{self.k.name('attention.head_count')} {h})"
        )

    def ff(self, il: int) -> tuple[int, str]:
        return self.n_ff[il], f"{self.k.name('feed_forward_length')} is {self.n_ff[il]}"

    def vocab(self) -> tuple[int, str] | None:
        if self.n_vocab is None:
            return None
        return self.n_vocab, f"tokenizer.ggml.tokens has {self.n_vocab} tokens"


Dim = tuple[int, str]
ShapeRule = Callable[[_LlamaDims, int], tuple[Dim, ...] | None]

_GLOBAL_RULES: dict[MODEL_TENSOR, ShapeRule] = {
    MODEL_TENSOR.OUTPUT_NORM: lambda d, _: (d.embd(),),
    MODEL_TENSOR.TOKEN_EMBD: lambda d, _: (d.embd(), v) if (v := d.vocab()) else None,
    MODEL_TENSOR.OUTPUT: lambda d, _: (d.embd(), v) if (v := d.vocab()) else None,
}
_BLOCK_RULES: dict[MODEL_TENSOR, ShapeRule] = {
    MODEL_TENSOR.ATTN_NORM: lambda d, _: (d.embd(),),
    MODEL_TENSOR.ATTN_Q: lambda d, il: (d.embd(), d.heads(il, kv=False, value=False)),
    MODEL_TENSOR.ATTN_K: lambda d, il: (d.embd(), d.heads(il, kv=True, value=False)),
    MODEL_TENSOR.ATTN_V: lambda d, il: (d.embd(), d.heads(il, kv=True, value=True)),
    MODEL_TENSOR.ATTN_OUT: lambda d, il: (d.heads(il, kv=False, value=False), d.embd()),
    MODEL_TENSOR.FFN_NORM: lambda d, _: (d.embd(),),
    MODEL_TENSOR.FFN_GATE: lambda d, il: (d.embd(), d.ff(il)),
    MODEL_TENSOR.FFN_UP: lambda d, il: (d.embd(), d.ff(il)),
    MODEL_TENSOR.FFN_DOWN: lambda d, il: (d.ff(il), d.embd()),
}
_REQUIRED_GLOBAL = (MODEL_TENSOR.TOKEN_EMBD, MODEL_TENSOR.OUTPUT_NORM)
_REQUIRED_BLOCK = (MODEL_TENSOR.ATTN_NORM, MODEL_TENSOR.ATTN_OUT, MODEL_TENSOR.FFN_NORM)
_REQUIRED_DENSE = (MODEL_TENSOR.FFN_GATE, MODEL_TENSOR.FFN_UP, MODEL_TENSOR.FFN_DOWN)


def _check_llama_layout(gf: GGUFFile, d: _LlamaDims, n_layer: int, n_expert: int) -> None:
    for kind in _REQUIRED_GLOBAL:
        _require(gf, f"{TENSOR_NAMES[kind]}.weight")
    for kind, rule in _GLOBAL_RULES.items():
        _check_shape(gf.tensor(f"{TENSOR_NAMES[kind]}.weight"), rule(d, 0))
    for il in range(n_layer):
        required = _REQUIRED_BLOCK + (_REQUIRED_DENSE if n_expert == 0 else ())
        for kind in required:
            _require(gf, _block_name(kind, il))
        if gf.tensor(_block_name(MODEL_TENSOR.ATTN_QKV, il)) is None:
            for kind in (MODEL_TENSOR.ATTN_Q, MODEL_TENSOR.ATTN_K, MODEL_TENSOR.ATTN_V):
                _require(gf, _block_name(kind, il))
        for kind, rule in _BLOCK_RULES.items():
            _check_shape(gf.tensor(_block_name(kind, il)), rule(d, il))


def _block_name(kind: MODEL_TENSOR, il: int) -> str:
    return f"{TENSOR_NAMES[kind].format(bid=il)}.weight"


def _require(gf: GGUFFile, name: str) -> None:
    if gf.tensor(name) is None:
        raise _Problem(f"tensor '{name}' is missing (a {gf.architecture} model needs it)")


def _check_shape(t: TensorInfo | None, expected: tuple[Dim, ...] | None) -> None:
    if t is None or expected is None:
        return
    want = tuple(v for v, _ in expected)
    if t.shape == want:
        return
    wrong = [why for (v, why), got in zip(expected, t.shape, strict=False) if v != got]
    if len(t.shape) != len(want) or not wrong:
        raise _Problem(f"tensor '{t.name}' is {_dims(t.shape)} (expected {_dims(want)})")
    raise _Problem(
        f"{' and '.join(dict.fromkeys(wrong))} but tensor '{t.name}' is "
        f"{_dims(t.shape)} (expected {_dims(want)})"
    )


def _dims(shape: Iterable[int]) -> str:
    return " x ".join(str(d) for d in shape)


def _blocks_present(gf: GGUFFile) -> int:
    """How many blocks the tensor names describe (the highest `blk.N` index + 1)."""
    top = -1
    for t in gf.tensors:
        m = _BLOCK.match(t.name)
        if m:
            top = max(top, int(m.group(1)))
    return top + 1


def _uses_blocks(arch: MODEL_ARCH) -> bool:
    """Whether this architecture names its layers `blk.N.*` (T5 uses enc./dec.)."""
    return any(TENSOR_NAMES[t].startswith("blk.{bid}.") for t in MODEL_TENSORS.get(arch, ()))


def _tensor_table_complete(gf: GGUFFile) -> bool:
    """False for a part of a split model read alone: its table lacks the others (a split
    without `split.tensors.count` cannot be told complete, so it is not checked either)."""
    total = gf.metadata.get("split.tensors.count")
    if not isinstance(total, int):
        count = gf.metadata.get("split.count", 1)
        return not isinstance(count, int) or count <= 1
    return len(gf.tensors) >= total


def _first_duplicate(items: list[Any]) -> int | None:
    seen: set[Any] = set()
    for i, item in enumerate(items):
        if item in seen:
            return i
        seen.add(item)
    return None


class _Keys:
    """Typed access to `{arch}.*` metadata; a value of the wrong type is a _Problem."""

    def __init__(self, md: dict[str, Any], arch: str) -> None:
        self.md = md
        self.arch = arch

    def name(self, key: str) -> str:
        return f"{self.arch}.{key}"

    def uint(self, key: str, *, required: bool = False, default: int | None = None) -> int | None:
        value = self.md.get(self.name(key))
        if value is None:
            if required:
                raise _Problem(f"{self.name(key)} is missing")
            return default
        if not _is_int(value):
            raise _Problem(f"{self.name(key)} is {_show(value)}, not a whole number")
        if value < 0:
            raise _Problem(f"{self.name(key)} is {value}, below 0")
        return int(value)

    def per_layer(self, key: str, n_layer: int, *, default: int | None) -> list[int]:
        """A key that is one number for all layers or an array with one per layer."""
        value = self.md.get(self.name(key))
        if isinstance(value, ArraySummary):  # more than 4096 entries: never one per layer
            raise _Problem(
                f"{self.name(key)} has {len(value)} entries but "
                f"{self.name('block_count')} is {n_layer}"
            )
        if isinstance(value, list):
            if len(value) != n_layer:
                raise _Problem(
                    f"{self.name(key)} has {len(value)} entries but "
                    f"{self.name('block_count')} is {n_layer}"
                )
            bad = [v for v in value if not _is_int(v) or v < 0]
            if bad:
                raise _Problem(
                    f"{self.name(key)} holds {_show(bad[0])}, not a whole number of 0 or more"
                )
            return [int(v) for v in value]
        one = self.uint(key, default=default)
        return [] if one is None else [one] * n_layer


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_string_array(value: Any) -> bool:
    if isinstance(value, ArraySummary):
        return value.item_type == _STRING_ITEM
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_number_array(value: Any) -> bool:
    if isinstance(value, ArraySummary):
        return value.item_type != _STRING_ITEM
    return isinstance(value, list) and all(isinstance(v, int | float) for v in value)


def _show(value: Any) -> str:
    if isinstance(value, ArraySummary | list):
        return f"an array of {len(value)} items"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "...")
    return repr(value)
