"""Small batches in shared K/V tiles (installers/llama_cpp/flash_attn_small_batch.patch).

`make setup`'s build sends CPU flash attention's small batches (a decoded token, a speculative
verification) through the tiled kernel, in tiles of the rows that read the same K/V head. A
row's result then depends only on its own data: each token of a batch gets exactly the logits
that decoding it alone gives, at any depth, including past 512 cells where upstream takes a
lone token through a split-KV kernel. The library reads LLAMA_FA_SMALL_TILES at every call, so
each test forces both sides in one context.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.host.runtime import Model
from engine.native import llama_lib
from engine.native.backend import LlamaBackend
from engine.settings import LoadParams
from tests.backend_batches import OnDecodeThread, decode_at, decode_thread_of

DEPTHS = (40, 600)  # a short history, and one past upstream's split-KV threshold (512 cells)
SIZES = (2, 3, 5)  # verification batches


def test_setup_built_the_small_tiles() -> None:
    assert llama_lib.flash_attn_small_tiles(), (
        "make setup builds llama.cpp with flash_attn_small_batch.patch"
    )


@pytest.fixture(scope="module")
def on_decode_thread(smollm2_path: Path) -> Iterator[OnDecodeThread]:
    m = Model(
        smollm2_path,
        LoadParams(n_ctx=1024, n_threads=min(2, os.cpu_count() or 1), flash_attn="on"),
    )
    try:
        yield decode_thread_of(m)
    finally:
        m.close()


def _rows(be: LlamaBackend, depth: int) -> dict[int, np.ndarray]:
    """By batch size (1 too), the logits of every row of a batch decoded after `depth`
    cached tokens (the batch's cells removed again after each)."""
    filler = [100 + i % 500 for i in range(depth)]
    be.clear()
    for start in range(0, depth, 256):  # (the context's batch is 512 tokens)
        decode_at(be, filler[start : start + 256], start, False)
    out: dict[int, np.ndarray] = {}
    for n in (1, *SIZES):
        decode_at(be, [200 + j for j in range(n)], depth, True)
        out[n] = np.stack([be.logits(j).copy() for j in range(n)])
        be.seq_rm(0, depth, -1)
    be.clear()
    return out


def _with_tiles(monkeypatch: pytest.MonkeyPatch, setting: str, work: Callable[[], Any]) -> Any:
    monkeypatch.setenv("LLAMA_FA_SMALL_TILES", setting)
    try:
        return work()
    finally:
        monkeypatch.delenv("LLAMA_FA_SMALL_TILES")


@pytest.mark.parametrize("depth", DEPTHS)
def test_each_row_of_a_batch_is_the_token_decoded_alone(
    on_decode_thread: OnDecodeThread, depth: int
) -> None:
    """A batch's first row is the same token at the same position as the lone decode, and
    each later row the same as in every larger batch: bit for bit."""
    rows = on_decode_thread(lambda be: _rows(be, depth))
    for n in SIZES:
        assert np.array_equal(rows[n][0], rows[1][0]), f"row 0 of {n} tokens"
        smaller = rows[max(k for k in rows if k < n)]
        for j in range(1, len(smaller)):
            assert np.array_equal(rows[n][j], smaller[j]), f"row {j} of {n} tokens"


@pytest.mark.parametrize("depth", DEPTHS)
def test_the_tiles_compute_the_attention_the_row_kernels_do(
    on_decode_thread: OnDecodeThread,
    monkeypatch: pytest.MonkeyPatch,
    depth: int,
) -> None:
    """Against upstream's one-row kernels (LLAMA_FA_SMALL_TILES=0), which accumulate V in f16:
    logits that differ only by that rounding (the filler prompt leaves near ties, so the top
    token may differ)."""
    tiled = _with_tiles(monkeypatch, "1", lambda: on_decode_thread(lambda be: _rows(be, depth)))
    rowwise = _with_tiles(monkeypatch, "0", lambda: on_decode_thread(lambda be: _rows(be, depth)))
    for n, a in tiled.items():
        b = rowwise[n]
        for j in range(n):
            assert np.corrcoef(a[j], b[j])[0, 1] > 0.995  # 0.999 and more here
            assert float(np.sqrt(np.mean((a[j] - b[j]) ** 2))) < 0.6  # 0.1-0.3 here


def test_the_switch_reaches_the_kernels(
    on_decode_thread: OnDecodeThread,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The comparison above is not of one kernel with itself: the two settings round
    differently."""
    tiled = _with_tiles(monkeypatch, "1", lambda: on_decode_thread(lambda be: _rows(be, 40)))
    rowwise = _with_tiles(monkeypatch, "0", lambda: on_decode_thread(lambda be: _rows(be, 40)))
    assert not np.array_equal(tiled[2], rowwise[2])


def _two_sequences(be: LlamaBackend) -> dict[str, np.ndarray]:
    """Two slots' streams: sequence 0 read 320 tokens and then lost positions 20-299 (its next
    cell lands in the hole, so its row sees 41 of the ~320 cells up to its last visible one:
    the row kernel), sequence 1 holds 640 whole (the tiles). Each one's next token decoded
    alone, and both in one batch (a server's step). The prompts are read in batches of 64+
    tokens, which both settings of the switch compute alike."""
    be.clear()
    for seq, depth in ((0, 320), (1, 640)):
        filler = [100 + (i * (seq + 3)) % 500 for i in range(depth)]
        for start in range(0, depth, 256):
            decode_at(be, filler[start : start + 256], start, False, seq=seq)
    assert be.seq_rm(0, 20, 300)
    out: dict[str, np.ndarray] = {}
    steps = {"0": [(0, 320)], "1": [(1, 640)], "both": [(0, 320), (1, 640)]}
    for name, rows in steps.items():
        b = be.batch(len(rows))
        try:
            for i, (seq, pos) in enumerate(rows):
                b.put(i, 200 + seq, pos, seq, True)
            b.n_tokens = len(rows)
            be.decode(b, fixed_threads=True)
        finally:
            b.close()
        out[name] = np.stack([be.logits(i).copy() for i in range(len(rows))])
        for seq, pos in rows:
            be.seq_rm(seq, pos, -1)
    be.clear()
    return out


def test_a_slots_token_is_the_same_beside_another_slots(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row that sees few of its cells takes the row kernel, beside another slot's rows in
    the tiles in the same operation: each row is what its token decoded alone gives, bit for
    bit. That the first row took the row kernel shows against upstream's kernels (which take
    both rows of a two-stream batch one by one): its logits are theirs, the second row's
    are not."""
    m = Model(
        smollm2_path,
        LoadParams(n_ctx=2048, n_seq_max=2, n_threads=min(2, os.cpu_count() or 1), flash_attn="on"),
    )
    call = decode_thread_of(m)
    try:
        got = _with_tiles(monkeypatch, "1", lambda: call(_two_sequences))
        upstream = _with_tiles(monkeypatch, "0", lambda: call(_two_sequences))
    finally:
        m.close()
    assert np.all(np.isfinite(got["both"]))
    assert np.array_equal(got["both"][0], got["0"][0])
    assert np.array_equal(got["both"][1], got["1"][0])
    assert np.array_equal(got["both"][0], upstream["both"][0])  # the row kernel
    assert not np.array_equal(got["both"][1], upstream["both"][1])  # the tiles
