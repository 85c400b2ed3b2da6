"""Which tokens' log probabilities go with which part of a reply, as its reader splits it.

The loop hands each piece of text with the tokens it completes (`Piece.logprobs`); the
`ReplyReader` turns pieces into parts (thinking, content) and holds back text that may be a
marker or a tool call. A token goes with the first part that shows text after it, if that
part is of a kind the dialect reports (OpenAI chat: the content; Ollama: the thinking too);
tokens whose text the reader keeps (a call, a marker) or hands to a part not reported are
left out. A whole answer reports the same tokens as its stream.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.decoding.reasoning import PieceKind
from engine.decoding.reply_reader import Part
from engine.host.logprobs import TokenLogprob


class PartLogprobs:
    """Follows one reply's parts. `kinds`: the parts whose tokens are reported."""

    def __init__(self, kinds: frozenset[PieceKind]) -> None:
        self._kinds = kinds
        self._held: list[TokenLogprob] = []
        self.taken: list[TokenLogprob] = []  # every token reported so far, in order

    def push(
        self, parts: Sequence[Part], lps: Sequence[TokenLogprob]
    ) -> list[tuple[TokenLogprob, ...]]:
        """The tokens of each of `parts` (what the reader gave for the piece that completed
        the tokens `lps`; at the end, its tail with no tokens)."""
        self._held.extend(lps)
        out: list[tuple[TokenLogprob, ...]] = [() for _ in parts]
        if not parts:
            return out
        at = next((i for i, (kind, _) in enumerate(parts) if kind in self._kinds), None)
        if at is not None:
            out[at] = tuple(self._held)
            self.taken.extend(self._held)
        self._held.clear()
        return out


CONTENT: frozenset[PieceKind] = frozenset({"content"})
SHOWN: frozenset[PieceKind] = frozenset({"content", "reasoning"})

__all__ = ["CONTENT", "SHOWN", "PartLogprobs"]
