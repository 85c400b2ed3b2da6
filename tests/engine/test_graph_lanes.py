"""Graph lanes (installers/llama_cpp/graph_lanes.patch): small batches keep graphs of their own.

llama.cpp keeps one built graph per context and rebuilds it whenever the batch size changes;
`make setup`'s build gives batches of 2 to 8 tokens lanes of their own, so a speculative step
(one token, the drafted batch, one token again) reuses every graph. The library reads
LLAMA_GRAPH_SMALL_LANE_MAX when a context is made: each test forces both sides with it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.host.runtime import Model
from engine.native import llama_lib
from engine.native.backend import LlamaBackend
from engine.settings import LoadParams
from tests.backend_batches import decode_at

# One token, then a drafted batch, again and again, as prompt lookup decodes.
SIZES = (1, 3, 1, 3, 1, 2, 1, 2, 1, 3, 1, 5, 1, 3)


def test_setup_built_the_graph_lanes() -> None:
    assert llama_lib.graph_lanes(), "make setup builds llama.cpp with graph_lanes.patch"


def _decode_sizes(
    path: Path, lanes: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, list[Any]]:
    """(graphs reused, every row's logits) over SIZES after a prompt, in a context made with
    lanes = (LLAMA_GRAPH_SMALL_LANE_MAX, LLAMA_GRAPH_SMALL_LANES)."""
    monkeypatch.setenv("LLAMA_GRAPH_SMALL_LANE_MAX", str(lanes[0]))
    monkeypatch.setenv("LLAMA_GRAPH_SMALL_LANES", str(lanes[1]))
    m = Model(path, LoadParams(n_ctx=512, n_threads=min(2, os.cpu_count() or 1)))
    prompt = m.tokenize("The lighthouse keeper found a bottle on the shore, and inside it")
    words = m.tokenize(" was a letter written in a careful, old-fashioned hand, folded twice.")

    def run() -> tuple[int, list[Any]]:
        be = m.backend
        assert isinstance(be, LlamaBackend)
        be.clear()
        decode_at(be, prompt, 0, False)
        reused_before = be.graphs_reused()
        rows: list[Any] = []
        pos = len(prompt)
        for n in SIZES:
            decode_at(be, [words[(pos + i) % len(words)] for i in range(n)], pos, True)
            rows += [be.logits(i).copy() for i in range(n)]
            pos += n
        return be.graphs_reused() - reused_before, rows

    try:
        return m.loop.call_soon(run)
    finally:
        m.close()


def _expected_reuses(lane_max: int, lane_count: int) -> int:
    """What the lanes promise: the main graph serves sizes 1 and above lane_max, each lane one
    size; a lane for a new size is the least recently used one once all are taken."""
    held: dict[str, int] = {"main": 0}  # which size each graph is built for (0: the prompt's)
    lanes: list[int] = []  # small sizes held by lanes, least recently used first
    reused = 0
    for n in SIZES:
        if 2 <= n <= lane_max and lane_count:
            if n in lanes:
                reused += 1
                lanes.remove(n)
            elif len(lanes) == lane_count:
                lanes.pop(0)
            lanes.append(n)
        else:
            reused += held["main"] == n
            held["main"] = n
    return reused


@pytest.mark.parametrize(
    "lanes",
    [(8, 4), (0, 4), (2, 4), (8, 1)],
    ids=["default", "off", "only-two-token-batches", "one-lane"],
)
def test_lanes_keep_small_batches_graphs_and_give_the_same_logits(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch, lanes: tuple[int, int]
) -> None:
    """Each setting reuses exactly the graphs its lanes keep (with lanes off, every change of
    batch size rebuilds), and every row's logits are the same bit for bit as with lanes off:
    the graphs are the ones llama.cpp builds."""
    reused, rows = _decode_sizes(smollm2_path, lanes, monkeypatch)
    assert reused == _expected_reuses(*lanes)
    _, rows_off = _decode_sizes(smollm2_path, (0, 4), monkeypatch)
    assert len(rows) == len(rows_off) == sum(SIZES)
    assert all(np.array_equal(a, b) for a, b in zip(rows, rows_off, strict=True))


def test_the_expected_reuses_tell_the_settings_apart() -> None:
    """The model above is not trivially satisfied: the default keeps every graph after its
    first build, lanes off keep none, and the partial settings lie between."""
    first_uses = len(set(SIZES))
    assert _expected_reuses(8, 4) == len(SIZES) - first_uses
    assert _expected_reuses(0, 4) == 0
    assert 0 < _expected_reuses(2, 4) < _expected_reuses(8, 4)
    assert 0 < _expected_reuses(8, 1) < _expected_reuses(8, 4)
