"""Log probabilities of a reply's tokens, from the logits the sampler saw.

A request that asks for them (`Request.logprobs`: how many alternatives per token, 0 to
`MAX_TOP_LOGPROBS`) gets, for each token it is handed, the log-softmax of that step's logits
row over the whole vocabulary at the chosen token, and the most likely tokens of the same row.
The row is the model's own output after the request's grammar mask (a token the grammar
forbids has no probability) and before the sampler chain: repetition penalties, temperature,
top-k, top-p and min-p change what is drawn, not what is reported. That is OpenAI's meaning
and llama-server's default (`post_sampling_probs` false).

The decode loop computes them on its own thread, only for requests that ask (numpy over the
row: docs/server.md has its cost per token).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# OpenAI's limit for top_logprobs (Ollama's too).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One of the most likely tokens of a step."""

    token: int
    piece: bytes  # as the vocabulary writes it: control tokens by their name
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The token handed out at one step, its log probability and the step's most likely
    tokens, most likely first."""

    token: int
    piece: bytes  # as it is in the reply's text
    logprob: float
    top: tuple[TopLogprob, ...]


def log_softmax(row: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The row's log probabilities (a new array; -inf stays -inf). The exponentials are
    float32 (numpy's vector code: a float64 pass took twice as long), summed in float64 so a
    large vocabulary's many small terms are not lost."""
    m = np.max(row)
    if not np.isfinite(m):
        raise ValueError("a logits row with no finite value")
    shifted = row - m
    lse = np.log(np.exp(shifted).sum(dtype=np.float64))
    shifted -= np.float32(lse)
    return shifted


def top_tokens(lp: npt.NDArray[np.float32], n: int) -> list[int]:
    """The `n` most likely token ids of `lp`, most likely first (ties: the lower id first, as
    a greedy sampler picks), without tokens that cannot be drawn (-inf)."""
    if n <= 0:
        return []
    n = min(n, lp.size)
    nth = np.partition(lp, lp.size - n)[lp.size - n]  # the n-th largest value
    ids = np.flatnonzero(lp >= nth)  # n of them, or more where values tie at the n-th
    ids = ids[np.lexsort((ids, -lp[ids]))][:n]
    return [int(t) for t in ids if np.isfinite(lp[t])]


def token_logprob(
    lp: npt.NDArray[np.float32],
    token: int,
    text: bytes,
    n_top: int,
    piece: Callable[[int], bytes],
) -> TokenLogprob:
    """The entry of `token`, whose bytes in the reply are `text`, drawn from the step whose
    log probabilities are `lp`; `piece` writes an alternative's bytes (a control token by
    its name, so that the end of a turn shows as one)."""
    top = tuple(TopLogprob(t, piece(t), float(lp[t])) for t in top_tokens(lp, n_top))
    return TokenLogprob(token, text, float(lp[token]), top)


def token_text(piece: bytes) -> str:
    """A token's text for an answer: its bytes as UTF-8, and the bytes of a character it
    holds only part of written as escapes ("\\xe2\\x80"): the `bytes` field has them exactly."""
    return piece.decode("utf-8", errors="backslashreplace")


__all__ = [
    "MAX_TOP_LOGPROBS",
    "TokenLogprob",
    "TopLogprob",
    "log_softmax",
    "token_logprob",
    "token_text",
    "top_tokens",
]
