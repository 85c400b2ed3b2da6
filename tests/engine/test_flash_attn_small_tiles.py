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
from tests.backend_batches import decode_at

DEPTHS = (40, 600)  # a short history, and one past upstream's split-KV threshold (512 cells)
SIZES = (2, 3, 5)  # verification batches

OnDecodeThread = Callable[[Callable[[LlamaBackend], Any]], Any]


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

    def call(work: Callable[[LlamaBackend], Any]) -> Any:
        def run() -> Any:
            be = m.backend
            assert isinstance(be, LlamaBackend)
            return work(be)

        return m.loop.call_soon(run)

    try:
        yield call
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
