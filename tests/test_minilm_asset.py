"""The all-MiniLM-L6-v2 test asset: a BERT embedding model that llama.cpp loads and embeds with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.model.gguf import read_gguf

pytestmark = pytest.mark.slow


def test_metadata(minilm_path: Path) -> None:
    gf = read_gguf(minilm_path)
    assert gf.architecture == "bert"
    assert gf.metadata["general.name"] == "all-MiniLM-L6-v2"
    assert gf.arch_value("pooling_type") == 1  # MEAN
    assert gf.arch_value("embedding_length") == 384
    assert gf.arch_value("block_count") == 6
    assert gf.arch_value("attention.causal") is False
    assert gf.metadata["tokenizer.ggml.model"] == "bert"
    assert len(gf.metadata["tokenizer.ggml.tokens"]) == 30522
    assert gf.tensor("embeddings.position_ids") is None
    assert {t.type_name for t in gf.tensors} == {"F16", "F32"}


def test_llama_cpp_embeds(minilm_path: Path) -> None:
    from llama_cpp import Llama

    model = Llama(model_path=str(minilm_path), embedding=True, n_threads=2, verbose=False)
    try:
        sentences = [
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "The girl is carrying a baby.",
        ]
        vectors = np.array([model.embed(s) for s in sentences], dtype=np.float64)
        assert model.tokenize(b"hello") == [101, 7592, 102]  # [CLS] hello [SEP]
    finally:
        model.close()
    assert vectors.shape == (3, 384)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    similar, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    # sentence-transformers gives 0.755 and -0.105 for these pairs
    assert similar == pytest.approx(0.755, abs=0.02)
    assert unrelated == pytest.approx(-0.105, abs=0.05)
