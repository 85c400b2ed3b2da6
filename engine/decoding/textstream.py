"""Token bytes in, whole text out: UTF-8 reassembly and stop strings for streaming.

A token can end in the middle of a multi-byte character, and a stop string can arrive split
over several tokens. `TextStream` holds back exactly what is not yet safe to show: incomplete
UTF-8 sequences and a tail that could still grow into a stop string.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._pending = ""
        self.stopped = False  # a stop string was reached; nothing more will be returned

    def push(self, raw: bytes) -> str:
        """Feed one token's bytes; returns the text that is now safe to show (maybe '')."""
        piece = self._decoder.decode(raw)
        if not self._stops or not piece or self.stopped:
            return "" if self.stopped else piece
        pending = self._pending + piece
        hit = _find_stop(pending, self._stops)
        if hit >= 0:
            self.stopped = True
            self._pending = ""
            return pending[:hit]
        keep = _held_suffix(pending, self._stops, self._hold)
        self._pending = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]

    def flush(self) -> str:
        """At the end of generation: whatever was held back, unless a stop string ended it."""
        tail = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return "" if self.stopped else tail


def _find_stop(text: str, stops: list[str]) -> int:
    best = -1
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best < 0 or i < best):
            best = i
    return best


def _held_suffix(text: str, stops: list[str], hold: int) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    for k in range(min(hold, len(text)), 0, -1):
        suffix = text[-k:]
        if any(s.startswith(suffix) for s in stops):
            return k
    return 0
