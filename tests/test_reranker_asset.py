"""The test reranker (tests/reranker_gguf.py) is what llama.cpp takes as one: pooling RANK, one
classifier output, pairs written as llama-server writes them, and scores that are the same
weights' forward pass in numpy. Its head is untrained: only agreement is checked, not meaning."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.host.runtime import Model
from engine.model.facts import model_facts
from engine.model.gguf import read_gguf
from engine.native import llama_lib
from engine.server.embeddings import Embedder
from engine.settings import LoadParams
from tests.reranker_gguf import NAME, Reference

# F16 matrices against float64: the scores here are a few hundredths, the error ~1e-4.
ABS_TOL = 1e-3
REL_TOL = 2e-2
QUERY = "How do I bake bread at home?"
DOCS = [
    "Mix flour, water, salt and yeast, knead, let it rise and bake it in a hot oven.",
    "The stock market closed higher today.",
    "hello",
    "Bread needs time: a slow rise gives it flavour.",
    "A man is eating food.",
    "The girl is carrying a baby.",
]


@pytest.fixture(scope="module")
def reranker(reranker_path: Path) -> Iterator[tuple[Model, Embedder]]:
    model = Model(reranker_path, LoadParams(n_threads=2))
    embedder = Embedder(model)
    yield model, embedder
    embedder.close()
    model.close()


def test_the_file_is_a_rank_pooling_bert(reranker_path: Path) -> None:
    facts = model_facts(read_gguf(reranker_path))
    assert facts.name == NAME and facts.architecture == "bert"
    assert facts.pooling_type == 4 and facts.is_reranker and facts.embedding_only
    assert facts.n_embd == 384 and facts.n_layer == 6


def test_llama_cpp_loads_its_head(reranker: tuple[Model, Embedder]) -> None:
    model, embedder = reranker
    C = llama_lib.lib()
    assert model.embedding_only and model.n_ctx == 512
    assert int(C.llama_model_n_cls_out(model.model_ptr)) == 1
    assert C.llama_model_cls_label(model.model_ptr, 0) == b"score"
    assert embedder.is_reranker


def test_a_pair_is_written_as_llama_server_writes_it(reranker: tuple[Model, Embedder]) -> None:
    model, embedder = reranker
    sp = model.special_tokens()
    # The file says what BERT's tokenizer does with a pair: [CLS] A [SEP] B [SEP] (no extra SEP).
    assert (sp.bos, sp.eos, sp.add_bos, sp.add_eos, sp.add_sep) == (101, 102, True, True, False)
    assert model.named_template("rerank") is None
    assert embedder._pair("hello", "world", 0, 1) == [101, 7592, 102, 2088, 102]
    # Special-token text in a query or document is text, not a marker.
    assert 102 not in embedder._pair("[SEP]", "x", 0, 1)[1:-3]


def test_scores_are_the_weights_forward_pass(reranker: tuple[Model, Embedder]) -> None:
    _, embedder = reranker
    ref = Reference()
    got = embedder.rerank(QUERY, DOCS)
    want = [ref.score(embedder._pair(QUERY, d, 0, 1)) for d in DOCS]
    for (score, n), expected, doc in zip(got, want, DOCS, strict=True):
        assert n == len(embedder._pair(QUERY, doc, 0, 1))
        assert score == pytest.approx(expected, rel=REL_TOL, abs=ABS_TOL), doc
    # Where the reference tells two documents apart by more than the tolerance, so does
    # llama.cpp; the scores are spread enough for several such pairs.
    apart = [
        (i, j)
        for i in range(len(DOCS))
        for j in range(len(DOCS))
        if want[i] - want[j] > 2 * ABS_TOL
    ]
    assert len(apart) >= 3, want
    assert all(got[i][0] > got[j][0] for i, j in apart)
