"""A few columns per Q4_1 or Q8_0 weight row (installers/llama_cpp/quant_columns.patch).

`make setup`'s build reads each Q4_1 or Q8_0 weight row once for up to four tokens of a batch
(a speculative verification, a server's few requests), forming each token's sums as upstream's
kernels do. So nothing a model computes changes: the test decodes the same batches in two
processes, one with the kernels and one without (LLAMA_QUANT_COLS=0; the library reads it once
per process), and wants the same logits bit for bit.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.memory import cpu_kernels
from engine.native import llama_lib

REPO = Path(__file__).resolve().parents[2]

# Decodes batches of 1, 2, 3, 5 and 9 tokens after 40 cached ones (every row's logits kept)
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
    for n in (1, 2, 3, 5, 9):
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
    """SmolLM2's layers are Q4_1 and its output Q8_0: every row of every batch (9 tokens go
    four, four and one at a time), one token included, is the same with the kernels as without
    them, and a batch's first row is the token decoded alone."""
    columns = _logits(smollm2_path, tmp_path / "columns.npz", "1")
    one_at_a_time = _logits(smollm2_path, tmp_path / "one.npz", "0")
    assert columns.keys() == one_at_a_time.keys() == {"1", "2", "3", "5", "9"}
    for n, rows in columns.items():
        assert np.array_equal(rows, one_at_a_time[n]), f"a batch of {n}"
        assert np.array_equal(rows[0], columns["1"][0]), f"row 0 of {n}"
