"""The llama.cpp backend's parts that need no model: a batch's rows as llama.cpp reads them,
the one decode-error text, a backend refused without a context. Its decodes are covered by
every test of the loop on a real model (test_scheduler, test_speculative, the embeddings)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from engine.errors import EngineError
from engine.native.backend import DecodeFailed, LlamaBackend, LlamaBatch, decode_error


def test_token_rows_are_written_where_llama_cpp_reads_them() -> None:
    b = LlamaBatch(4)
    try:
        b.put(0, 42, 7, 1, False)
        b.put(1, 43, 8, 1, True)
        b.n_tokens = 2
        raw = b.raw
        assert raw is not None
        row = [(raw.token[i], raw.pos[i], raw.n_seq_id[i], raw.seq_id[i][0]) for i in (0, 1)]
        assert row == [(42, 7, 1, 1), (43, 8, 1, 1)]
        assert [raw.logits[0], raw.logits[1]] == [0, 1]
        assert b.n_tokens == raw.n_tokens == 2
    finally:
        b.close()
    b.close()  # twice is harmless
    assert b.raw is None


def test_embedding_rows_fill_their_own_place() -> None:
    b = LlamaBatch(3, n_embd=4)
    try:
        b.put_embedding(1, np.arange(4, dtype=np.float32), 5, 2, True)
        raw = b.raw
        assert raw is not None
        assert [raw.embd[4 + i] for i in range(4)] == [0.0, 1.0, 2.0, 3.0]
        assert (raw.pos[1], raw.seq_id[1][0], raw.logits[1]) == (5, 2, 1)
        with pytest.raises(EngineError, match="an embedding row has 3 floats, the batch takes 4"):
            b.put_embedding(0, np.zeros(3, dtype=np.float32), 0, 0, False)
    finally:
        b.close()


def test_a_refused_decode_has_one_message() -> None:
    assert str(DecodeFailed(1)) == decode_error(1)
    assert decode_error(1).startswith("the context is full")
    assert decode_error(2) == "decoding was aborted"
    assert decode_error(-3) == "llama.cpp failed to decode (error -3)"
    assert DecodeFailed(-3).rc == -3


def test_a_backend_needs_a_context() -> None:
    with pytest.raises(EngineError, match="the model is not loaded"):
        LlamaBackend(ctypes.c_void_p(None), ctypes.c_void_p(None), 10)
