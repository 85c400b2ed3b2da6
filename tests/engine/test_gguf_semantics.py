"""An incoherent model inside a sound GGUF container is refused with one line naming the key.

The cases edit the parsed header of the real SmolLM2 (and Gemma-3) file in memory; the same
edits written to disk and given to llama.cpp are in tests/engine/test_gguf_fuzz.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.model.gguf import ArraySummary, GGUFError, GGUFFile, TensorInfo, read_gguf
from engine.model.semantics import check_model, find_problem


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> GGUFFile:
    return read_gguf(smollm2_path)


def _with(gf: GGUFFile, **metadata: Any) -> GGUFFile:
    md = dict(gf.metadata)
    for key, value in metadata.items():
        key = key.replace("__", ".")
        if value is None:
            md.pop(key, None)
        else:
            md[key] = value
    return replace(gf, metadata=md, _by_name={})


def _problem(gf: GGUFFile) -> str:
    with pytest.raises(GGUFError) as exc:
        check_model(gf)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f"{gf.source_name}: ")
    return msg.removeprefix(f"{gf.source_name}: ")


def test_real_files_pass(smol: GGUFFile, gemma_path: Path) -> None:
    assert find_problem(smol) is None
    assert find_problem(read_gguf(gemma_path)) is None


def test_block_count_against_tensors(smol: GGUFFile) -> None:
    for n in (0, 1000, 29, 31):
        assert _problem(_with(smol, llama__block_count=n)) == (
            f"llama.block_count is {n} but the file has tensors for 30 blocks"
        )


def test_head_counts_must_divide(smol: GGUFFile) -> None:
    assert _problem(_with(smol, llama__attention__head_count=7)) == (
        "llama.attention.head_count is 7, which does not divide llama.embedding_length 576"
    )
    assert _problem(_with(smol, llama__attention__head_count_kv=5)) == (
        "llama.attention.head_count_kv is 5, which does not divide llama.attention.head_count 9"
    )
    assert _problem(_with(smol, llama__attention__head_count=0)) == (
        "llama.attention.head_count is 0 (a llama model needs at least one attention head)"
    )


def test_shapes_follow_hyper_parameters(smol: GGUFFile) -> None:
    assert _problem(_with(smol, llama__feed_forward_length=1)) == (
        "llama.feed_forward_length is 1 but tensor 'blk.0.ffn_gate.weight' is 576 x 1536 "
        "(expected 576 x 1)"
    )
    assert _problem(_with(smol, llama__embedding_length=585)) == (
        "llama.embedding_length is 585 but tensor 'output_norm.weight' is 576 (expected 585)"
    )
    # Head size 48 instead of 576/9 = 64: attn_q would be 576 x 432.
    assert _problem(_with(smol, llama__attention__key_length=48)) == (
        "llama.attention.head_count is 9 (x llama.attention.key_length 48) but tensor "
        "'blk.0.attn_q.weight' "
        "is 576 x 576 (expected 576 x 432)"
    )


def test_missing_tensor(smol: GGUFFile) -> None:
    gone = replace(
        smol, tensors=[t for t in smol.tensors if t.name != "blk.7.ffn_up.weight"], _by_name={}
    )
    assert _problem(gone) == "tensor 'blk.7.ffn_up.weight' is missing (a llama model needs it)"


def test_embedding_rows_follow_vocabulary(smol: GGUFFile) -> None:
    tensors = [
        TensorInfo(t.name, (576, 49000), t.ggml_type, t.offset, t.n_bytes)
        if t.name == "token_embd.weight"
        else t
        for t in smol.tensors
    ]
    assert _problem(replace(smol, tensors=tensors, _by_name={})) == (
        "tensor 'token_embd.weight' has 49000 rows but tokenizer.ggml.tokens has 49152 tokens"
    )


def test_vocabulary_arrays(smol: GGUFFile) -> None:
    assert _problem(_with(smol, tokenizer__ggml__token_type=ArraySummary(5, 49151))) == (
        "tokenizer.ggml.token_type has 49151 entries but tokenizer.ggml.tokens has 49152"
    )
    assert _problem(_with(smol, tokenizer__ggml__tokens=ArraySummary(8, 49152, 4000))) == (
        "tokenizer.ggml.tokens has a duplicate token at index 4000"
    )
    assert _problem(_with(smol, tokenizer__ggml__tokens=[])) == "tokenizer.ggml.tokens is empty"
    assert _problem(_with(smol, tokenizer__ggml__tokens="hello")) == (
        "tokenizer.ggml.tokens is 'hello', not a list of token strings"
    )


def test_bos_eos_inside_vocabulary(smol: GGUFFile) -> None:
    assert _problem(_with(smol, tokenizer__ggml__eos_token_id=49152)) == (
        "tokenizer.ggml.eos_token_id is 49152 but the vocabulary has 49152 tokens"
    )
    assert _problem(_with(smol, tokenizer__ggml__bos_token_id=-1)) == (
        "tokenizer.ggml.bos_token_id is -1 but the vocabulary has 49152 tokens"
    )
    # llama.cpp ignores a padding id outside the vocabulary, and real files carry them.
    assert find_problem(_with(smol, tokenizer__ggml__padding_token_id=49152)) is None


def test_wrong_types_and_missing_keys(smol: GGUFFile) -> None:
    assert _problem(_with(smol, llama__block_count="30")) == (
        "llama.block_count is '30', not a whole number"
    )
    assert _problem(_with(smol, llama__embedding_length=None)) == (
        "llama.embedding_length is missing"
    )
    assert _problem(_with(smol, llama__attention__head_count=[9] * 29)) == (
        "llama.attention.head_count has 29 entries but llama.block_count is 30"
    )
    assert _problem(_with(smol, llama__rope__scaling__type="sideways")) == (
        "llama.rope.scaling.type is 'sideways' (llama.cpp knows none, linear, yarn, longrope)"
    )


def test_expert_limits(smol: GGUFFile) -> None:
    assert _problem(_with(smol, llama__expert_count=2000)) == (
        "llama.expert_count is 2000 (llama.cpp supports at most 1024)"
    )
    assert _problem(_with(smol, llama__expert_used_count=2)) == (
        "llama.expert_used_count is 2, more than llama.expert_count 0"
    )


def test_per_layer_head_counts_accepted(smol: GGUFFile) -> None:
    assert (
        find_problem(
            _with(
                smol,
                llama__attention__head_count=[9] * 30,
                llama__attention__head_count_kv=[3] * 30,
            )
        )
        is None
    )


def test_unknown_architecture_passes_through(smol: GGUFFile) -> None:
    md = {**smol.metadata, "general.architecture": "alienformer", "alienformer.block_count": 0}
    assert find_problem(replace(smol, metadata=md)) is None


def test_first_part_of_a_split_model_skips_the_tensor_table(smol: GGUFFile) -> None:
    part = replace(
        smol,
        tensors=smol.tensors[:100],
        _by_name={},
        metadata={**smol.metadata, "split.count": 2, "split.tensors.count": len(smol.tensors)},
    )
    assert find_problem(part) is None
