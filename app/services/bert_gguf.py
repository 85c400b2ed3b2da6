"""A sentence-transformers BERT folder (config.json, tokenizer.json, model.safetensors and its
pooling module) written as the GGUF llama.cpp's own converter (vendor/llama.cpp/conversion/bert.py)
would write it: the `bert` architecture, a WordPiece vocabulary in llama.cpp's "phantom space"
form, F16 matrices and F32 norms, biases and position/token-type embeddings. No torch and no
network: the `gguf` and `safetensors` packages only. The default embedding model
(app.services.default_embedding) is made with it, and the tests' reranker from the same folder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load_file

# Tensors llama.cpp's BERT graph does not use: the position index buffer and the NSP pooler.
_SKIPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
# 2-D tensors the converter keeps in F32 even in an F16 file (they are looked up, not multiplied).
_F32_TENSORS = (gguf.MODEL_TENSOR.POS_EMBD, gguf.MODEL_TENSOR.TOKEN_TYPES)
_SPECIAL = ("bos", "eos", "unk", "sep", "pad", "mask")


def load_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_gguf(
    model_dir: Path,
    out: Path,
    *,
    name: str,
    pooling: gguf.PoolingType | None = None,
    labels: Sequence[str] = (),
    extra: Mapping[str, np.ndarray[Any, Any]] | None = None,
) -> None:
    """The GGUF of the folder's BERT. `pooling`: the file's (default: the sentence-transformers
    module's); `labels`: classifier output labels; `extra`: more tensors by GGUF name (a
    classifier head), typed by the same rule as the encoder's."""
    hp: dict[str, Any] = load_json(model_dir / "config.json")
    n_blocks = int(hp["num_hidden_layers"])
    arch = gguf.MODEL_ARCH.BERT
    w = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[arch])

    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_block_count(n_blocks)
    w.add_context_length(int(hp["max_position_embeddings"]))
    w.add_embedding_length(int(hp["hidden_size"]))
    w.add_feed_forward_length(int(hp["intermediate_size"]))
    w.add_head_count(int(hp["num_attention_heads"]))
    w.add_layer_norm_eps(float(hp["layer_norm_eps"]))
    w.add_causal_attention(False)
    w.add_pooling_type(pooling if pooling is not None else _pooling_type(model_dir))
    if labels:
        w.add_classifier_output_labels(list(labels))

    tokens, toktypes = _vocab(model_dir, int(hp["vocab_size"]))
    w.add_token_type_count(int(hp.get("type_vocab_size", 1)))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")  # llama.cpp ignores the pre-tokenizer of a WordPiece vocab
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    # [CLS] and [SEP] come out as bos and eos (from tokenizer.json's post-processor); GGUF has no
    # cls key, so asking for one only logs that it is skipped.
    special = gguf.SpecialVocab(model_dir, n_vocab=len(tokens), special_token_types=_SPECIAL)
    special.add_to_gguf(w, quiet=True)

    tensor_map = gguf.get_tensor_name_map(arch, n_blocks)
    f32_names = {gguf.TENSOR_NAMES[t] for t in _F32_TENSORS}

    def add(new_name: str, data: np.ndarray[Any, Any]) -> None:
        matrix = (
            data.ndim >= 2
            and new_name.endswith(".weight")
            and not new_name.endswith("_norm.weight")
            and new_name.removesuffix(".weight") not in f32_names
        )
        w.add_tensor(new_name, data.astype(np.float16 if matrix else np.float32))

    for hf_name, data in load_file(model_dir / "model.safetensors").items():
        short = hf_name.removeprefix("bert.")
        if short in _SKIPPED or short.startswith("cls."):
            continue
        new_name = tensor_map.get_name(short, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ValueError(f"{hf_name}: no GGUF name for this tensor")
        add(new_name, data)
    for new_name, data in (extra or {}).items():
        add(new_name, data)

    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:  # a failed write (a full disk) must not keep the file open
        w.close()


def _pooling_type(model_dir: Path) -> gguf.PoolingType:
    """The sentence-transformers pooling module's mode (`modules.json` names its folder)."""
    folder = "1_Pooling"
    if (modules := model_dir / "modules.json").is_file():
        folder = next(
            (m["path"] for m in load_json(modules) if str(m["type"]).endswith("Pooling")), folder
        )
    cfg: dict[str, Any] = load_json(model_dir / folder / "config.json")
    if cfg.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if cfg.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    if cfg.get("pooling_mode_lasttoken"):
        return gguf.PoolingType.LAST
    raise ValueError(f"{folder}/config.json: unsupported pooling {cfg}")


def _vocab(model_dir: Path, vocab_size: int) -> tuple[list[str], list[int]]:
    """tokenizer.json's WordPiece vocabulary by id, in llama.cpp's phantom-space form: a word
    start gets a leading U+2581, a `##` continuation loses its `##`, control tokens stay as they
    are. Added special tokens ([PAD], [CLS], ...) are CONTROL, everything else NORMAL."""
    tok: dict[str, Any] = load_json(model_dir / "tokenizer.json")
    if tok["model"]["type"] != "WordPiece":
        raise ValueError(f"tokenizer.json: a {tok['model']['type']} model, not WordPiece")
    by_id = {int(i): t for t, i in tok["model"]["vocab"].items()}
    added = {int(a["id"]): a for a in tok.get("added_tokens", [])}
    by_id.update((i, str(a["content"])) for i, a in added.items())
    if max(by_id) >= vocab_size:
        raise ValueError(f"token id {max(by_id)} is past vocab_size {vocab_size}")

    tokens: list[str] = []
    toktypes: list[int] = []
    for i in range(vocab_size):
        text = by_id.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            toktypes.append(gguf.TokenType.UNUSED)
        elif i in added and added[i].get("special"):
            tokens.append(text)
            toktypes.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(text[2:] if text.startswith("##") else "\u2581" + text)
            toktypes.append(gguf.TokenType.USER_DEFINED if i in added else gguf.TokenType.NORMAL)
    return tokens, toktypes
