"""A few columns per Q4_1 or Q8_0 weight row (installers/llama_cpp/quant_columns.patch).

`make setup`'s build reads each Q4_1 or Q8_0 weight row once for up to eight tokens of a batch
of up to 32 (a speculative verification, a server's few requests), two or four rows at a time
when several tokens share them, forming each token's sums as upstream's kernels do. So
nothing a model computes changes: the test decodes the same batches in two processes, one with
the kernels and one without (LLAMA_QUANT_COLS=0; the library reads it once per process), and
wants the same logits bit for bit.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from engine.memory import cpu_kernels
from engine.memory.cpu_kernels import CpuFeatures
from engine.model.gguf import TensorInfo
from engine.native import llama_lib

REPO = Path(__file__).resolve().parents[2]

# Decodes batches of 1-5, 9, 12 and 33 tokens after 40 cached ones (every row's logits kept)
# and saves them: argv model, output .npz.
_CHILD = """
import os, sys
import numpy as np
from pathlib import Path
from engine.host.runtime import Model
from engine.settings import LoadParams
from tests.backend_batches import decode_at, decode_thread_of

m = Model(Path(sys.argv[1]), LoadParams(n_ctx=512, n_threads=min(2, os.cpu_count() or 1)))
out = {}

def work(be):
    decode_at(be, [100 + i for i in range(40)], 0, False)
    for n in (1, 2, 3, 4, 5, 9, 12, 33):
        decode_at(be, [200 + 37 * j % 900 for j in range(n)], 40, True)
        out[str(n)] = np.stack([be.logits(j).copy() for j in range(n)])
        be.seq_rm(0, 40, -1)

try:
    decode_thread_of(m)(work)
finally:
    m.close()
np.savez(sys.argv[2], **out)
"""


def _x86_with_avx2_f16c() -> bool:
    f = cpu_kernels.detect()
    return platform.machine().lower() in ("x86_64", "amd64") and f.avx2 and f.f16c


@pytest.mark.skipif(not _x86_with_avx2_f16c(), reason="the kernels are for x86 with AVX2 and F16C")
def test_setup_built_the_column_kernels() -> None:
    assert llama_lib.quant_columns(), "make setup builds llama.cpp with quant_columns.patch"
    assert cpu_kernels.detect().quant_columns


def _logits(model: Path, out: Path, setting: str) -> dict[str, np.ndarray]:
    env = {**os.environ, "LLAMA_QUANT_COLS": setting}
    run = subprocess.run(
        [sys.executable, "-c", _CHILD, str(model), str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    with np.load(out) as saved:
        return {k: saved[k] for k in saved.files}


@pytest.mark.skipif(not llama_lib.quant_columns(), reason="this build has no column kernels")
def test_a_few_columns_give_upstreams_logits(smollm2_path: Path, tmp_path: Path) -> None:
    """SmolLM2's layers are Q4_1 and its output Q8_0: every row of every batch, one token
    included, is the same with the kernels as without them, and a batch's first row is the
    token decoded alone. The sizes take each path: one row for one token; four rows at a time
    for 2-4 tokens; two rows at a time for 9 and 12 tokens, eight tokens a pass, then the rest;
    33 tokens past the column kernels' batch for Q8_0 (llamafile's kernel takes the output)."""
    columns = _logits(smollm2_path, tmp_path / "columns.npz", "1")
    one_at_a_time = _logits(smollm2_path, tmp_path / "one.npz", "0")
    assert columns.keys() == one_at_a_time.keys() == {"1", "2", "3", "4", "5", "9", "12", "33"}
    for n, rows in columns.items():
        assert np.array_equal(rows, one_at_a_time[n]), f"a batch of {n}"
        assert np.array_equal(rows[0], columns["1"][0]), f"row 0 of {n}"


def test_column_kernels_take_q4_1_and_q8_0_weights() -> None:
    """Most of the multiplied bytes must be a type the column kernels take, in the mapped file
    (not moved to an extra buffer), in a build that has them."""

    def tensor(name: str, type_name: str, n_bytes: int) -> TensorInfo:
        return TensorInfo(name, (64, 64), int(GGMLQuantizationType[type_name]), 0, n_bytes)

    q4_1 = [tensor("blk.0.ffn_up.weight", "Q4_1", 300), tensor("output.weight", "Q6_K", 100)]
    q4_k = [tensor("blk.0.ffn_up.weight", "Q4_K", 300), tensor("output.weight", "Q8_0", 100)]
    built = CpuFeatures(avx2=True, f16c=True, quant_columns=True)
    take = cpu_kernels.column_kernels_take
    assert take(q4_1, built, extra_buffers=True)
    assert not take(q4_k, built, extra_buffers=False)
    assert not take(q4_1, CpuFeatures(avx2=True, f16c=True), extra_buffers=True)
    # A tied embedding is the output matrix; a lookup table otherwise.
    tied = [tensor("blk.0.attn_q.weight", "Q4_K", 100), tensor("token_embd.weight", "Q8_0", 300)]
    assert take(tied, built, extra_buffers=False, tied_output=True)
    assert not take(tied, built, extra_buffers=False)
