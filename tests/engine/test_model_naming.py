"""One readable name per model file (engine.model.naming), on file names and `general.*`
metadata as published: the bundled SmolLM2 (whose `general.name` is its training run's
folder), Gemma 3, Qwen2.5, Llama 3.1, the DeepSeek-R1 distills, split files, Ollama blobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.model.facts import model_facts
from engine.model.gguf import read_gguf
from engine.model.naming import (
    derive_name,
    file_stem,
    looks_like_run_id,
    model_slug,
    says_nothing,
    split_quantization,
)

SMOLLM2_MD = {
    "general.name": "Smollm2 135M 8k Lc100K Mix1 Ep2",
    "general.basename": "smollm2",
    "general.size_label": "135M",
    "general.finetune": "8k-lc100k-mix1-ep2",
    "general.organization": "HuggingFaceTB",
}
BLOB = "sha256-6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"

CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # file name, metadata, file type's quantization, expected
    ("SmolLM2-135M-Instruct.Q4_1.gguf", SMOLLM2_MD, "Q4_1", "SmolLM2 135M Instruct · Q4_1"),
    ("smollm2-135m-instruct-q8_0.gguf", SMOLLM2_MD, "Q8_0", "SmolLM2 135M Instruct · Q8_0"),
    (
        "gemma-3-270m-q4_k_m.gguf",
        {"general.name": "Gemma 3 270m", "general.basename": "gemma-3"},
        "Q4_K_M",
        "Gemma 3 270M · Q4_K_M",
    ),
    (
        "gemma-3-4b-it-Q4_K_M.gguf",
        {"general.name": "Gemma-3-4B-It"},
        "Q4_K_M",
        "Gemma 3 4B IT · Q4_K_M",
    ),
    (
        "gemma-3-1b-it-qat-q4_0.gguf",
        {"general.name": "Gemma 3 1b It Qat Q4_0 Unquantized"},
        "Q4_0",
        "Gemma 3 1B IT QAT · Q4_0",
    ),
    (
        "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
        {"general.name": "Qwen2.5 7B Instruct"},
        "Q4_K_M",
        "Qwen2.5 7B Instruct · Q4_K_M",
    ),
    (
        "qwen2.5-7b-instruct-q4_k_m.gguf",
        {"general.name": "Qwen2.5 7B Instruct"},
        "Q4_K_M",
        "Qwen2.5 7B Instruct · Q4_K_M",
    ),
    (
        "Meta-Llama-3.1-8B-Instruct.Q8_0.gguf",
        {"general.name": "Meta Llama 3.1 8B Instruct"},
        "Q8_0",
        "Meta Llama 3.1 8B Instruct · Q8_0",
    ),
    (
        "DeepSeek-R1-Distill-Qwen-1.5B-Q4_K_M.gguf",
        {"general.name": "DeepSeek R1 Distill Qwen 1.5B"},
        "Q4_K_M",
        "DeepSeek R1 Distill Qwen 1.5B · Q4_K_M",
    ),
    # No quantization in the file name: the file type's.
    ("DeepSeek-R1-Distill-Qwen-1.5B.gguf", {}, "Q4_K_M", "DeepSeek R1 Distill Qwen 1.5B · Q4_K_M"),
    (
        "deepseek-r1-distill-qwen-1.5b-q4_k_m.gguf",
        {},
        "Q4_K_M",
        "DeepSeek R1 Distill Qwen 1.5B · Q4_K_M",
    ),
    # Split files: every part has the model's one name.
    (
        "Qwen2.5-72B-Instruct-Q4_K_M-00001-of-00003.gguf",
        {"general.name": "Qwen2.5 72B Instruct"},
        "Q4_K_M",
        "Qwen2.5 72B Instruct · Q4_K_M",
    ),
    (
        "Qwen2.5-72B-Instruct-Q4_K_M-00003-of-00003.gguf",
        {},
        "Q4_K_M",
        "Qwen2.5 72B Instruct · Q4_K_M",
    ),
    ("Mixtral-8x7B-Instruct-v0.1.Q5_K_M.gguf", {}, "Q5_K_M", "Mixtral 8x7B Instruct v0.1 · Q5_K_M"),
    ("tinyllama-1.1b-chat-v1.0.Q4_K_M.gguf", {}, "Q4_K_M", "TinyLlama 1.1B Chat v1.0 · Q4_K_M"),
    ("Llama-3.2-1B-Instruct-IQ4_XS.gguf", {}, "IQ4_XS", "Llama 3.2 1B Instruct · IQ4_XS"),
    # The file's own label tells variants apart; an abbreviated one gives way to the type's.
    ("gpt-oss-20b-UD-Q4_K_XL.gguf", {}, "Q4_K_M", "GPT OSS 20B · UD-Q4_K_XL"),
    (
        "Phi-3-mini-4k-instruct-q4.gguf",
        {"general.name": "Phi3"},
        "Q4_K_M",
        "Phi 3 Mini 4K Instruct · Q4_K_M",
    ),
    # A file name that says nothing: the metadata's name, when it is a model's name.
    (BLOB, {"general.name": "Llama 3.2 3B Instruct"}, "Q4_K_M", "Llama 3.2 3B Instruct · Q4_K_M"),
    (
        "ggml-model-q4_0.gguf",
        {"general.name": "Mistral 7B Instruct v0.3"},
        "Q4_0",
        "Mistral 7B Instruct v0.3 · Q4_0",
    ),
    # ... and not a training run's id: then general.basename and size label.
    ("model.gguf", SMOLLM2_MD, "Q4_1", "SmolLM2 135M · Q4_1"),
]


@pytest.mark.parametrize(
    ("file_name", "metadata", "quant", "expected"), CASES, ids=[c[0][:40] for c in CASES]
)
def test_names_of_published_files(
    file_name: str, metadata: dict[str, Any], quant: str, expected: str
) -> None:
    assert derive_name(file_name, metadata, quantization=quant) == expected


def test_where_a_file_came_from_names_a_blob() -> None:
    # An Ollama blob with a run id for a name: the tag ("latest" says nothing).
    assert (
        derive_name(
            BLOB, {"general.name": "run-0042 ep3"}, quantization="Q4_K_M", origin="tinyllama:latest"
        )
        == "TinyLlama · Q4_K_M"
    )
    assert derive_name(BLOB, {}, quantization="Q4_0", origin="llama3.2:3b") == "Llama3.2 3B · Q4_0"
    # A generic file in a repository: the repository's words, without "-GGUF".
    assert (
        derive_name(
            "model-q4_k_m.gguf",
            {"general.name": "Smollm2 135M 8k Lc100K Mix1 Ep2"},
            origin="someone/Cool-Model-GGUF/model-q4_k_m.gguf",
        )
        == "Cool Model · Q4_K_M"
    )
    # An informative file name wins over the repository's.
    assert (
        derive_name(
            "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
            {},
            origin="bartowski/Other-GGUF/Qwen2.5-7B-Instruct-Q4_K_M.gguf",
        )
        == "Qwen2.5 7B Instruct · Q4_K_M"
    )


def test_nothing_to_go_on_still_gives_a_name() -> None:
    assert derive_name("model.gguf", {}) == "model"
    assert derive_name("weird name.gguf", {}, quantization="unknown") == "Weird Name"
    assert derive_name("x.gguf", {}, quantization="ftype99") == "X"


def test_training_run_ids() -> None:
    assert looks_like_run_id("Smollm2 135M 8k Lc100K Mix1 Ep2")
    assert looks_like_run_id("checkpoint-12000")
    assert looks_like_run_id("llama-sft-step4000")
    for name in (
        "Qwen2.5 7B Instruct",
        "Meta Llama 3.1 8B Instruct",
        "Gemma 3 270m",
        "Mistral 7B Instruct v0.3",
        "DeepSeek R1 Distill Qwen 1.5B",
    ):
        assert not looks_like_run_id(name), name


def test_parts_of_a_file_name() -> None:
    assert (
        file_stem("/m/Qwen2.5-72B-Instruct-Q4_K_M-00001-of-00003.gguf")
        == "Qwen2.5-72B-Instruct-Q4_K_M"
    )
    assert file_stem("C:\\models\\Tiny.GGUF") == "Tiny"
    assert split_quantization("Meta-Llama-3.1-8B-Instruct.Q8_0") == (
        "Meta-Llama-3.1-8B-Instruct",
        "Q8_0",
    )
    assert split_quantization("smollm2-135m-q4_1-embd") == ("smollm2-135m-embd", "Q4_1")
    assert split_quantization("Qwen2.5-7B-Instruct") == ("Qwen2.5-7B-Instruct", "")
    assert says_nothing(BLOB + ".gguf") and says_nothing("ggml-model-f16.gguf")
    assert not says_nothing("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_slugs_are_machine_ids() -> None:
    assert model_slug("SmolLM2 135M Instruct · Q4_1") == "smollm2-135m-instruct-q4_1"
    assert model_slug("Meta Llama 3.1 8B Instruct · Q8_0") == "meta-llama-3.1-8b-instruct-q8_0"
    assert model_slug("  Mein Modell: «schnell»! ") == "mein-modell-schnell"
    assert model_slug("···") == "model"


def test_facts_of_the_bundled_model(smollm2_path: Path) -> None:
    facts = model_facts(read_gguf(smollm2_path))
    assert facts.name == "Smollm2 135M 8k Lc100K Mix1 Ep2"  # the file's general.name
    assert facts.display_name == "SmolLM2 135M Instruct · Q4_1"
