"""One token batch decoded straight on a loaded model's backend, for tests that look at what
llama.cpp computes batch by batch (call it on the model's decode thread: `decode_thread_of`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine.host.runtime import Model
from engine.native.backend import ContextBackend, LlamaBackend

OnDecodeThread = Callable[[Callable[[LlamaBackend], Any]], Any]


def decode_thread_of(m: Model) -> OnDecodeThread:
    """Runs work on `m`'s decode thread with its llama.cpp backend."""

    def call(work: Callable[[LlamaBackend], Any]) -> Any:
        def run() -> Any:
            be = m.backend
            assert isinstance(be, LlamaBackend)
            return work(be)

        return m.loop.call_soon(run)

    return call


def decode_at(
    be: ContextBackend,
    tokens: Sequence[int],
    pos: int,
    every_row: bool,
    *,
    fixed_threads: bool = True,
    seq: int = 0,
) -> None:
    """Decode `tokens` as one batch of sequence `seq` at positions pos, pos + 1, ...; with
    `every_row` each row's logits are kept (`be.logits(i)`), else none."""
    b = be.batch(len(tokens))
    try:
        for i, t in enumerate(tokens):
            b.put(i, t, pos + i, seq, every_row)
        b.n_tokens = len(tokens)
        be.decode(b, fixed_threads=fixed_threads)
    finally:
        b.close()
