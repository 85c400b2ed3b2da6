"""A structural test reranker: all-MiniLM-L6-v2's encoder with a classifier head, as a GGUF whose
pooling is llama.cpp's RANK, and a numpy forward pass of the same weights to check its scores.

No trained reranker can be had without the network, so this one is assembled from the weights
the default embedding model is made of (app.services.default_embedding): the encoder, its BERT
pooler (`pooler.dense.*`, which the embedding GGUF leaves out) as llama.cpp's `cls` tensor, and
a fixed head `cls.output`: a seeded random vector (numpy default_rng(0), normal, scaled by
1/sqrt(384)) and a bias of 0, one output label. Its head is untrained: it proves the
rank-pooling path end to end (pair tokens, pooling, the head, the score read back, the API); it does
NOT rank documents well, and no test may read meaning into its order beyond agreeing with
`Reference`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt
from safetensors.numpy import load_file

from app.services.bert_gguf import load_json, write_gguf
from app.services.default_embedding import model_folder

NAME = "MiniLM rank test (untrained head)"
HEAD_SEED = 0


def head(n_embd: int) -> npt.NDArray[np.float32]:
    """The classifier's one output row, as the file stores it (F16, so rounded through it)."""
    rng = np.random.default_rng(HEAD_SEED)
    row = rng.standard_normal(n_embd) / math.sqrt(n_embd)
    return row.astype(np.float16).astype(np.float32)


def convert_reranker(target: Path) -> Path:
    """Write the reranker to `target` (through a part file: it appears whole or not at all)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    with model_folder() as model_dir:
        _write(model_dir, part)
    os.replace(part, target)
    return target


def _write(model_dir: Path, out: Path) -> None:
    weights = load_file(model_dir / "model.safetensors")
    n_embd = int(load_json(model_dir / "config.json")["hidden_size"])
    pooler = _strip(weights)
    write_gguf(
        model_dir,
        out,
        name=NAME,
        pooling=gguf.PoolingType.RANK,
        labels=["score"],
        extra={
            "cls.weight": pooler["pooler.dense.weight"],
            "cls.bias": pooler["pooler.dense.bias"],
            "cls.output.weight": head(n_embd)[None, :],  # ggml {n_embd, n_cls_out = 1}
            "cls.output.bias": np.zeros(1, dtype=np.float32),
        },
    )


def _strip(weights: dict[str, Any]) -> dict[str, npt.NDArray[np.float32]]:
    return {k.removeprefix("bert."): np.asarray(v, dtype=np.float32) for k, v in weights.items()}


class Reference:
    """The reranker's score in numpy from the safetensors: embeddings (+ token type row 0 for
    every token, as llama.cpp adds it) and LayerNorm, 6 layers of attention and GELU FFN, the
    [CLS] row through the pooler's dense + tanh, then the head."""

    def __init__(self) -> None:
        with model_folder() as model_dir:
            self.w = _strip(load_file(model_dir / "model.safetensors"))
            hp: dict[str, Any] = load_json(model_dir / "config.json")
        self.n_layer = int(hp["num_hidden_layers"])
        self.n_head = int(hp["num_attention_heads"])
        self.eps = float(hp["layer_norm_eps"])
        self.head = head(int(hp["hidden_size"]))

    def _norm(self, x: npt.NDArray[np.float64], prefix: str) -> npt.NDArray[np.float64]:
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        y: npt.NDArray[np.float64] = (x - mean) / np.sqrt(var + self.eps)
        return y * self.w[prefix + ".weight"] + self.w[prefix + ".bias"]

    def _dense(self, x: npt.NDArray[np.float64], prefix: str) -> npt.NDArray[np.float64]:
        out: npt.NDArray[np.float64] = x @ self.w[prefix + ".weight"].T + self.w[prefix + ".bias"]
        return out

    def score(self, tokens: Sequence[int]) -> float:
        w, n = self.w, len(tokens)
        x = (
            w["embeddings.word_embeddings.weight"][list(tokens)].astype(np.float64)
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        d = x.shape[1] // self.n_head
        for i in range(self.n_layer):
            p = f"encoder.layer.{i}."
            q, k, v = (
                self._dense(x, p + f"attention.self.{m}")
                .reshape(n, self.n_head, d)
                .transpose(1, 0, 2)
                for m in ("query", "key", "value")
            )
            att = q @ k.transpose(0, 2, 1) / math.sqrt(d)
            att = np.exp(att - att.max(axis=-1, keepdims=True))
            att /= att.sum(axis=-1, keepdims=True)
            ctx = (att @ v).transpose(1, 0, 2).reshape(n, -1)
            x = self._norm(
                self._dense(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm"
            )
            h = self._dense(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))  # BERT's exact GELU
            x = self._norm(self._dense(h, p + "output.dense") + x, p + "output.LayerNorm")
        pooled = np.tanh(self._dense(x[:1], "pooler.dense"))[0]
        return float(pooled @ self.head)


def _erf(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    out: npt.NDArray[np.float64] = np.vectorize(math.erf, otypes=[np.float64])(x)
    return out
