"""Build llama-architecture GGUF models with random weights and a real tokenizer.

Memory and speed depend on a model's shape and weight types, not on what its weights say, so a
model with random weights measures VRAM use, load time and tokens/s like the real thing while
being built in seconds from a file of a few megabytes. Its text is gibberish.

The tokenizer, chat template and special tokens are copied from a real GGUF (SmolLM2 by
default), so chat templating and tokenization behave as with that model:

    # the tokenizer and template alone (a ~2 MB GGUF without tensors)
    python benchmarks/synthetic_gguf.py header --source SmolLM2.gguf --out header.gguf
    # SmolLM2's own shape with random weights, and an 8B-class shape with the same tokenizer
    python benchmarks/synthetic_gguf.py model --source header.gguf --preset smollm2 --out s.gguf
    python benchmarks/synthetic_gguf.py model --source header.gguf --preset 8b --out big.gguf

Each repeating layer holds the same random bytes (generated once per tensor role), so building
an 8B model costs one layer of random numbers plus writing the file.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

# Metadata copied from the source model: everything about tokens and chat formatting.
_COPY_PREFIXES = ("tokenizer.",)


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_ctx_train: int = 8192
    weight_type: str = "q4_0"
    tied: bool = False  # the output matrix is the token embedding (no output.weight)
    rope_base: float = 100000.0


PRESETS: dict[str, Shape] = {
    # SmolLM2-135M: 30 layers, 576 wide, GQA 9/3, tied embeddings.
    "smollm2": Shape(30, 576, 1536, 9, 3, 8192, "q4_0", tied=True),
    # A Llama-3-8B-like body (32 layers, 4096 wide, 14336 FFN, GQA 32/8) with a 49k vocabulary.
    "8b": Shape(32, 4096, 14336, 32, 8, 8192, "q4_0", tied=False, rope_base=500000.0),
    # Tiny, for tests: builds in well under a second.
    "tiny": Shape(2, 64, 128, 4, 2, 512, "q8_0", tied=True),
}

_TYPES = {
    "q4_0": GGMLQuantizationType.Q4_0,
    "q8_0": GGMLQuantizationType.Q8_0,
    "f16": GGMLQuantizationType.F16,
    "f32": GGMLQuantizationType.F32,
}


def _block_rows(rng: np.random.Generator, rows: int, cols: int, kind: str) -> np.ndarray:
    """`rows` rows of `cols` random values in ggml's layout for `kind`, scaled so that a
    matrix-vector product keeps the input's magnitude (no overflow through the layers)."""
    if kind == "f32":
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(
            np.float32
        )
    if kind == "f16":
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(
            np.float16
        )
    if cols % 32:
        raise SystemExit(f"a {kind} row needs a multiple of 32 values, not {cols}")
    nb = cols // 32
    if kind == "q4_0":  # f16 scale + 16 bytes of 4-bit values (q - 8) * d
        blocks = np.empty((rows, nb, 18), dtype=np.uint8)
        blocks[..., 2:] = rng.integers(0, 256, size=(rows, nb, 16), dtype=np.uint8)
        scale = 1.0 / (4.6 * np.sqrt(cols))  # uniform 0..15 minus 8 has a std of about 4.6
    else:  # q8_0: f16 scale + 32 int8 values q * d
        blocks = np.empty((rows, nb, 34), dtype=np.uint8)
        blocks[..., 2:] = rng.integers(0, 256, size=(rows, nb, 32), dtype=np.uint8)
        scale = 1.0 / (74.0 * np.sqrt(cols))  # uniform int8 has a std of about 74
    blocks[..., :2] = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)
    return blocks.reshape(rows, nb * blocks.shape[-1])


def _copy_metadata(w: GGUFWriter, source: GGUFReader) -> None:
    for name, f in source.fields.items():
        if not name.startswith(_COPY_PREFIXES):
            continue
        main = f.types[0]
        if main == GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), main, sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), main)


def _vocab_size(source: GGUFReader) -> int:
    tokens = source.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise SystemExit("the source file has no tokenizer (tokenizer.ggml.tokens)")
    return len(tokens.data)


def write_header(source: Path, out: Path) -> None:
    """The tokenizer and chat template of `source`, without hyperparameters or tensors."""
    r = GGUFReader(source)
    w = GGUFWriter(out, "llama")
    w.add_name("tokenizer of " + source.name)
    _copy_metadata(w, r)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_model(source: Path, out: Path, shape: Shape, *, name: str, seed: int = 0) -> int:
    """Write a random-weight llama model with `source`'s tokenizer; returns the file size."""
    r = GGUFReader(source)
    n_vocab = _vocab_size(r)
    head_dim = shape.n_embd // shape.n_head
    kind = shape.weight_type
    rng = np.random.default_rng(seed)
    w = GGUFWriter(out, "llama")
    w.add_name(name)
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(shape.rope_base)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type({"q4_0": 2, "q8_0": 7, "f16": 1, "f32": 0}[kind])
    _copy_metadata(w, r)
    qt = _TYPES[kind]

    def add(tname: str, data: np.ndarray) -> None:
        if data.dtype == np.uint8:
            w.add_tensor(tname, data, raw_dtype=qt)
        else:
            w.add_tensor(tname, data)

    kv = shape.n_head_kv * head_dim
    # One array per tensor role, shared by every layer (numpy shape = (rows, cols) = (out, in)).
    role = {
        "attn_q": _block_rows(rng, shape.n_embd, shape.n_embd, kind),
        "attn_k": _block_rows(rng, kv, shape.n_embd, kind),
        "attn_v": _block_rows(rng, kv, shape.n_embd, kind),
        "attn_output": _block_rows(rng, shape.n_embd, shape.n_embd, kind),
        "ffn_gate": _block_rows(rng, shape.n_ff, shape.n_embd, kind),
        "ffn_up": _block_rows(rng, shape.n_ff, shape.n_embd, kind),
        "ffn_down": _block_rows(rng, shape.n_embd, shape.n_ff, kind),
    }
    norm = np.ones(shape.n_embd, dtype=np.float32)
    add("token_embd.weight", _block_rows(rng, n_vocab, shape.n_embd, kind))
    for il in range(shape.n_layer):
        w.add_tensor(f"blk.{il}.attn_norm.weight", norm)
        w.add_tensor(f"blk.{il}.ffn_norm.weight", norm)
        for rname, data in role.items():
            add(f"blk.{il}.{rname}.weight", data)
    w.add_tensor("output_norm.weight", norm)
    if not shape.tied:
        add("output.weight", _block_rows(rng, n_vocab, shape.n_embd, kind))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out.stat().st_size


def _shape_from_args(args: argparse.Namespace) -> Shape:
    shape = PRESETS[args.preset]
    over: dict[str, Any] = {}
    for field in ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv"):
        value = getattr(args, field)
        if value is not None:
            over[field] = value
    if args.type is not None:
        over["weight_type"] = args.type
    return replace(shape, **over)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("header", help="copy just the tokenizer and chat template")
    h.add_argument("--source", type=Path, required=True)
    h.add_argument("--out", type=Path, required=True)
    m = sub.add_parser("model", help="write a model with random weights")
    m.add_argument(
        "--source",
        type=Path,
        required=True,
        help="a GGUF with the tokenizer to copy (a model or a header file)",
    )
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--preset", choices=sorted(PRESETS), default="smollm2")
    m.add_argument("--type", choices=sorted(_TYPES), default=None)
    for field in ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv"):
        m.add_argument("--" + field.replace("_", "-"), dest=field, type=int, default=None)
    m.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "header":
            write_header(args.source, args.out)
            print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB")
            return 0
        t0 = time.perf_counter()
        shape = _shape_from_args(args)
        size = write_model(
            args.source, args.out, shape, name=f"synthetic-{args.preset}", seed=args.seed
        )
        print(f"{args.out}: {size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s ({shape})")
        return 0
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
