"""Log probabilities in the answers: the request fields that ask for them and the shapes that
carry them, shared by the OpenAI and Ollama dialects.

The loop reports each token's log probability and its step's most likely tokens
(engine.host.logprobs); here they become OpenAI's chat entries (`{token, logprob, bytes,
top_logprobs}`, Ollama's too) and the legacy completions' columns (`tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Annotated

from pydantic import Field, ValidationInfo

from engine.host.logprobs import MAX_TOP_LOGPROBS, TokenLogprob, TopLogprob, token_text
from engine.server.body_model import refuse_whole
from engine.server.protocol.base import Reply

TopLogprobsField = Annotated[
    int,
    Field(
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="how many of the most likely tokens to give with each token; more than "
        "0 needs 'logprobs': true",
    ),
]
LogprobsFlag = Annotated[
    bool,
    Field(
        description="give each token's log probability, from the model's logits after a "
        "format's grammar and before temperature, penalties and top-k/p"
    ),
]
LegacyLogprobs = Annotated[
    int,
    Field(
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="give each token's log probability and this many of the most likely "
        "tokens (OpenAI takes up to 5, llama-server and this server up to 20)",
    ),
]


def alternatives_need_logprobs(v: int | None, info: ValidationInfo) -> int | None:
    """A field check of `top_logprobs`: more than 0 asks for nothing without `logprobs`."""
    if v and info.data.get("logprobs") is not True:
        raise refuse_whole("'top_logprobs' needs 'logprobs': true")
    return v


def asked(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """What the loop is asked for: None, or how many alternatives per token."""
    return (top_logprobs or 0) if logprobs else None


class TopLogprobEntry(Reply):
    token: str
    logprob: float
    bytes: list[int]


class LogprobEntry(Reply):
    """One token of the answer: OpenAI's chat shape, Ollama's too."""

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprobEntry]


class ChatLogprobs(Reply):
    content: list[LogprobEntry]
    refusal: None  # no refusals are written apart


class TextLogprobs(Reply):
    """The legacy completions' columns, one item per token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: Annotated[list[int], Field(description="characters into the completion text")]


def _alternative(t: TopLogprob) -> TopLogprobEntry:
    return TopLogprobEntry(token=token_text(t.piece), logprob=t.logprob, bytes=list(t.piece))


def entries(lps: Sequence[TokenLogprob]) -> list[LogprobEntry]:
    return [
        LogprobEntry(
            token=token_text(t.piece),
            logprob=t.logprob,
            bytes=list(t.piece),
            top_logprobs=[_alternative(a) for a in t.top],
        )
        for t in lps
    ]


class TextColumns:
    """Completions' columns of a reply, chunk by chunk: `text_offset` counts the characters
    of the tokens before each one, as a client reading the text counts them (a token that
    ends inside a character starts where that character does)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._chars = 0

    def take(self, lps: Sequence[TokenLogprob]) -> TextLogprobs:
        offsets = []
        for t in lps:
            offsets.append(self._chars)
            self._chars += len(self._decoder.decode(t.piece))
        return TextLogprobs(
            tokens=[token_text(t.piece) for t in lps],
            token_logprobs=[t.logprob for t in lps],
            top_logprobs=[_top_dict(t.top) for t in lps],
            text_offset=offsets,
        )


def _top_dict(top: Sequence[TopLogprob]) -> dict[str, float]:
    """The legacy map, text to log probability: of two tokens that read alike, the more
    likely one."""
    out: dict[str, float] = {}
    for a in top:
        out.setdefault(token_text(a.piece), a.logprob)
    return out


__all__ = [
    "ChatLogprobs",
    "LegacyLogprobs",
    "LogprobEntry",
    "LogprobsFlag",
    "TextColumns",
    "TextLogprobs",
    "TopLogprobEntry",
    "TopLogprobsField",
    "alternatives_need_logprobs",
    "asked",
    "entries",
]
