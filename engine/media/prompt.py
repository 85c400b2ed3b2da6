"""A prompt with images or audio: text tokens and media chunks, as the decode loop reads it.

libmtmd splits a prompt into text and media chunks (engine.native.projector). Here that
becomes one token list the loop can treat like any prompt: a media chunk's rows are stood
for by *placeholder* ids, negative (no vocabulary has them), derived from the media's
content key, its order in the prompt and the row. Prefix reuse, slot choice and the RAM
prompt cache compare token lists, so the same picture at the same place of a conversation
matches its cached KV cells and is not encoded again; another picture never does (a
placeholder is 31 bits of a hash of the key). `MediaPrompt.span_at` tells the loop where
a chunk starts; its embeddings are encoded when the loop first needs them and decoded as
an embeddings batch by the same loop.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from engine.errors import EngineError
from engine.native.projector import Chunks, Media, MediaChunk, Projector, TextChunk

_SPACE = (1 << 31) - 2  # placeholders run from -1 to -(2**31 - 1): all int32


def placeholders(key: str, ordinal: int, n: int) -> list[int]:
    """The ids standing for the `n` rows of the `ordinal`-th media chunk with `key`."""
    seed = hashlib.blake2b(f"{key}/{ordinal}".encode(), digest_size=8).digest()
    base = int.from_bytes(seed, "little")
    # One hash per chunk, rows spread by a large odd step: distinct within a chunk.
    return [-1 - ((base + i * 0x9E3779B1) % _SPACE) for i in range(n)]


def is_placeholder(token: int) -> bool:
    return token < 0


@dataclass
class MediaSpan:
    """A media chunk at prompt index `start`."""

    start: int
    chunk: MediaChunk
    rows: npt.NDArray[np.float32] | None = field(default=None, repr=False)

    @property
    def end(self) -> int:
        return self.start + self.chunk.n_tokens


class MediaPrompt:
    """A tokenized prompt with its media (`tokens`: text ids and placeholders). Holds
    libmtmd's chunks until `close` (the request's end)."""

    def __init__(self, projector: Projector, chunks: Chunks) -> None:
        self.projector = projector
        self._chunks = chunks
        self.tokens: list[int] = []
        self.spans: list[MediaSpan] = []
        seen: dict[str, int] = {}
        for part in chunks.parts:
            if isinstance(part, TextChunk):
                # libmtmd writes -1 (LLAMA_TOKEN_NULL) for a marker token the projector's
                # layout names and this vocabulary lacks (`<global-img>` for a text model
                # that is not its own): it cannot be decoded, and it stands for nothing.
                self.tokens.extend(t for t in part.tokens if t >= 0)
                continue
            if part.n_pos != part.n_tokens:
                raise EngineError("this projector's media take fewer positions than rows")
            ordinal = seen.get(part.key, 0)
            seen[part.key] = ordinal + 1
            self.spans.append(MediaSpan(len(self.tokens), part))
            self.tokens.extend(placeholders(part.key, ordinal, part.n_tokens))
        self._starts = [s.start for s in self.spans]

    @property
    def media_tokens(self) -> int:
        return sum(s.chunk.n_tokens for s in self.spans)

    def span_at(self, index: int) -> MediaSpan | None:
        """The media chunk covering prompt index `index`, if any."""
        i = bisect.bisect_right(self._starts, index) - 1
        if i >= 0 and index < self.spans[i].end:
            return self.spans[i]
        return None

    def next_start(self, index: int) -> int | None:
        """Where the first media chunk at or after `index` starts."""
        i = bisect.bisect_left(self._starts, index)
        return self._starts[i] if i < len(self._starts) else None

    def boundary(self, n: int) -> int:
        """`n` cached tokens, cut back to a chunk's start if they end inside one (a
        chunk's rows are decoded together; a non-causal one must be)."""
        span = self.span_at(n)
        return span.start if span is not None and span.start < n else n

    def embeddings(self, span: MediaSpan) -> npt.NDArray[np.float32]:
        """The chunk's rows, encoded once (on the decode loop's thread)."""
        if span.rows is None:
            span.rows = self.projector.encode(span.chunk)
        return span.rows

    def close(self) -> None:
        self._chunks.close()
        for s in self.spans:
            s.rows = None


def media_prompt(
    projector: Projector, text: str, media: Sequence[Media], *, add_special: bool
) -> MediaPrompt:
    """`text` with one marker per item of `media` (engine.native.projector.marker)."""
    chunks = projector.tokenize(text, media, add_special=add_special)
    try:
        return MediaPrompt(projector, chunks)
    except BaseException:
        chunks.close()
        raise


__all__ = ["MediaPrompt", "MediaSpan", "is_placeholder", "media_prompt", "placeholders"]
