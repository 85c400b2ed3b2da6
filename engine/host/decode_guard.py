"""Checks made before every batch the engine builds is decoded.

llama.cpp trusts its caller about a batch: more tokens than the batch it was created for
overruns the buffer the batch was allocated with (the scheduler writes into one), positions
past the context and sequence ids past `n_seq_max` reach asserts or an error code that names
no cause. Each check here raises an EngineError with one line that says which limit and by
how much, before llama.cpp sees the batch. They are integer comparisons, cheap enough for
the per-step paths. A decode llama.cpp itself refuses has one message too:
`engine.native.backend.DecodeFailed`.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import EngineError


class DecodeRefused(EngineError):
    """A batch the engine was about to decode breaks a limit of the context."""


def check_batch(n_tokens: int, n_batch: int) -> None:
    if n_tokens > n_batch:
        raise DecodeRefused(
            f"a batch of {n_tokens} tokens is larger than the context's batch size of {n_batch}"
        )


def check_room(pos: int, n_tokens: int, n_ctx: int) -> None:
    """`n_tokens` going in at position `pos` must fit in a sequence of `n_ctx` cells."""
    if pos + n_tokens > n_ctx:
        raise DecodeRefused(
            f"the context is full: {n_tokens} tokens at position {pos} need "
            f"{pos + n_tokens} positions, the context holds {n_ctx}; start a "
            "new chat or load the model with a larger context"
        )


def check_seq(seq: int, n_seq_max: int) -> None:
    if not 0 <= seq < n_seq_max:
        raise DecodeRefused(
            f"sequence id {seq} is out of range: the context has {n_seq_max} "
            f"sequence{'s' if n_seq_max != 1 else ''} (ids 0 to "
            f"{n_seq_max - 1})"
        )


def check_tokens(tokens: Sequence[int], n_vocab: int) -> None:
    """Token ids from outside (a server request's prompt) must be in the vocabulary."""
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise DecodeRefused(f"token id {bad} is outside the vocabulary (0 to {n_vocab - 1})")
