"""Broken copies of the bundled SmolLM2 through the real loader: refused in one line, never a
crash, a traceback or a hang (the corpus: tests/fuzz_gguf.py; numbers: docs/reliability.md)."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gguf import GGUFValueType

from engine.host.runtime import Model
from engine.native.llama_lib import last_error as _last_error
from engine.settings import LoadParams
from tests.fuzz_gguf import ROOT, Corpus, LoaderPool, is_one_line, run_corpus

U32 = GGUFValueType.UINT32


@pytest.fixture(scope="module")
def corpus(smollm2_path: Path) -> Corpus:
    return Corpus(smollm2_path)


@pytest.fixture(scope="module")
def pool() -> Iterator[LoaderPool]:
    p = LoaderPool(timeout_s=60)
    yield p
    p.close()


# The files that killed `candlewick run` with SIGABRT inside llama.cpp, and the ones refused
# only with "failed to load model"; each now gets the message below, before llama.cpp runs.
ABORTED = {
    "llama.block_count = 0": (
        ("llama.block_count", 0),
        "llama.block_count is 0 but the file has tensors for 30 blocks",
    ),
    "llama.block_count = 1000": (
        ("llama.block_count", 1000),
        "llama.block_count is 1000 but the file has tensors for 30 blocks",
    ),
}
VAGUE = {
    "head_count = 0": (
        ("llama.attention.head_count", 0),
        "llama.attention.head_count is 0 (a llama model needs at least one attention head)",
    ),
    "head_count = 7": (
        ("llama.attention.head_count", 7),
        "llama.attention.head_count is 7, which does not divide llama.embedding_length 576",
    ),
    "head_count = 12": (
        ("llama.attention.head_count", 12),
        "llama.attention.head_count_kv is 3 (x head size 48 = 576 / llama.attention.head_count "
        "12) but tensor 'blk.0.attn_k.weight' is 576 x 192 (expected 576 x 144)",
    ),
    "head_count_kv = 5": (
        ("llama.attention.head_count_kv", 5),
        "llama.attention.head_count_kv is 5, which does not divide llama.attention.head_count 9",
    ),
    "head_count_kv = 9": (
        ("llama.attention.head_count_kv", 9),
        "llama.attention.head_count_kv is 9 (x head size 64 = 576 / llama.attention.head_count "
        "9) but tensor 'blk.0.attn_k.weight' is 576 x 192 (expected 576 x 576)",
    ),
    "feed_forward_length = 1": (
        ("llama.feed_forward_length", 1),
        "llama.feed_forward_length is 1 but tensor 'blk.0.ffn_gate.weight' is 576 x 1536 "
        "(expected 576 x 1)",
    ),
    "feed_forward_length = 0": (("llama.feed_forward_length", 0), "llama.feed_forward_length is 0"),
}


def _write(corpus: Corpus, tmp_path: Path, key: str, value: int) -> Path:
    path = tmp_path / "m.gguf"
    corpus._set(key, U32, value).write(path)
    return path


@pytest.mark.parametrize("case", [*ABORTED, *VAGUE])
def test_known_cases_have_exact_messages(
    case: str, corpus: Corpus, pool: LoaderPool, tmp_path: Path
) -> None:
    (key, value), expected = {**ABORTED, **VAGUE}[case]
    res = pool.load(_write(corpus, tmp_path, key, value), case)
    assert (res.outcome, res.message) == ("refused", f"m.gguf: {expected}")


def test_cli_says_why_instead_of_aborting(corpus: Corpus, tmp_path: Path) -> None:
    path = _write(corpus, tmp_path, "llama.block_count", 1000)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "run",
            str(path),
            "hi",
            "--max-tokens",
            "1",
            "--threads",
            "1",
            "--ctx",
            "256",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert (r.returncode, r.stderr) == (
        2,
        "candlewick: error: m.gguf: llama.block_count is "
        "1000 but the file has tensors for 30 blocks\n",
    )


def test_llama_cpp_reason_reaches_the_message(corpus: Corpus, tmp_path: Path) -> None:
    # A rotary dimension that llama.cpp checks and the validation leaves to it.
    path = _write(corpus, tmp_path, "llama.rope.dimension_count", 7)
    with pytest.raises(Exception) as exc:
        Model(path, LoadParams(n_ctx=256, n_threads=1, state_cache_mb=0))
    assert str(exc.value) == (
        "llama.cpp could not load m.gguf: error loading model "
        "hyperparameters: invalid n_rot: 7, expected 64"
    )


def test_last_error_skips_the_generic_line() -> None:
    lines = [
        "print_info: file size   = 92.10 MiB (5.74 BPW) ",
        "llama_model_load: error loading model: error loading model vocabulary: key "
        "tokenizer.ggml.padding_token_id has wrong type i32 but expected type u32",
        "llama_model_load_from_file_impl: failed to load model",
    ]
    assert _last_error(lines) == (
        "error loading model vocabulary: key tokenizer.ggml."
        "padding_token_id has wrong type i32 but expected type u32"
    )
    assert _last_error(lines[-1:]) == "failed to load model"
    parser = [
        "gguf_init_from_file_impl: duplicate key 'general.name' for KV pair 5",
        "gguf_init_from_file_impl: failed to read key-value pairs",
        "llama_model_load: error loading model: llama_model_loader: failed to load model "
        "from m.gguf",
        "llama_model_load_from_file_impl: failed to load model",
    ]
    assert _last_error(parser) == "duplicate key 'general.name' for KV pair 5"
    assert _last_error([]) == "see the log for details"


FUZZ_SEED = 18
FUZZ_FILES = 150


def test_fuzzed_files_never_crash_the_loader(smollm2_path: Path, tmp_path: Path) -> None:
    results = run_corpus(smollm2_path, FUZZ_SEED, FUZZ_FILES, tmp_path, timeout_s=60)
    counts = collections.Counter(r.outcome for r in results)
    bad = [r for r in results if r.outcome in ("crash", "traceback", "hang")]
    assert not bad, [(r.label, r.outcome, r.message[-300:]) for r in bad]
    refused = [r for r in results if r.outcome == "refused"]
    assert all(is_one_line(r.message) for r in refused), [
        r.message for r in refused if not is_one_line(r.message)
    ]
    # The corpus must really exercise both sides: most files refused, some still loading.
    assert counts["refused"] > FUZZ_FILES // 3 and counts["loaded"] > 0, counts
    assert len(results) == FUZZ_FILES


def test_an_abort_in_the_sizing_child_becomes_one_line(corpus: Corpus, tmp_path: Path) -> None:
    # Straight to the child, past the validation: llama.cpp asserts block_count > 0.
    from engine.errors import EngineError
    from engine.memory.dry_run import _dry_run_in_child
    from engine.memory.params import EstimateParams

    path = _write(corpus, tmp_path, "llama.block_count", 0)
    with pytest.raises(EngineError) as exc:
        _dry_run_in_child(path, EstimateParams(LoadParams(n_ctx=256)), 0)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith("llama.cpp crashed while sizing m.gguf (SIGABRT): ")
    assert re.search(
        r"\): llama-model\.cpp:\d+: GGML_ASSERT\(hparams\.n_layer_all > 0 && "
        r"hparams\.n_layer_all <= LLAMA_MAX_LAYERS\) failed$",
        msg,
    ), msg


def test_fuzzed_files_through_the_command_line(smollm2_path: Path, tmp_path: Path) -> None:
    """A few corpus files through `candlewick run` itself, one process each (the script's
    `--cli` runs thousands): exit 0 or 2, one line on stderr, never a signal or traceback."""
    results = run_corpus(smollm2_path, 21, 8, tmp_path, timeout_s=120, cli=True)
    outcomes = collections.Counter(r.outcome for r in results)
    assert set(outcomes) <= {"refused", "loaded"}, [
        r for r in results if r.outcome not in ("refused", "loaded")
    ]
    assert outcomes["refused"] > 0
    assert all(is_one_line(r.message) for r in results if r.outcome == "refused")
