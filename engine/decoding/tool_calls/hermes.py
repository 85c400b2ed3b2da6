"""Hermes (Qwen2.5, Qwen3, QwQ, Hermes 2/3): `<tool_call>\\n{"name": ..., "arguments": {...}}
\\n</tool_call>` blocks, any number, anywhere in the answer.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.decoding.tool_calls.base import ToolFormat
from engine.decoding.tool_calls.calls import Json, ToolCall
from engine.decoding.tool_calls.reading import (
    DECODER,
    as_list,
    read_call,
    read_cut,
    split_at_markers,
    visible_before_marker,
)
from engine.decoding.tool_calls.schema import lark_json, lark_literal, more_calls


class HermesFormat(ToolFormat):
    name = "hermes"
    opener, closer = "<tool_call>", "</tool_call>"
    markers = (opener, closer)

    def _grammar(
        self, schema: Json, parallel: bool, special_tokens: Mapping[str, int] | None
    ) -> str:
        start = "start: block" + more_calls(' "\\n" block', parallel)
        block = (
            f'block: {lark_literal(self.opener, special_tokens)} "\\n" call "\\n" '
            f"{lark_literal(self.closer, special_tokens)}"
        )
        return f"{start}\n{block}\ncall: {lark_json(schema)}\n"

    def _read(self, text: str, pos: int) -> tuple[list[ToolCall], int] | None:
        closed = text.find(self.closer, pos)
        inner = text[pos:] if closed < 0 else text[pos:closed]
        try:  # a complete call whose close marker never came still counts
            call = read_call(DECODER.decode(inner.strip()))
        except ValueError:
            return None
        if call is None:
            return None
        return [call], len(text) if closed < 0 else closed + len(self.closer)

    def parse(self, text: str, start: int = 0) -> tuple[str, list[ToolCall]]:
        return split_at_markers(text, self.opener, self._read, start)

    def visible(self, text: str, start: int = 0) -> str:
        return visible_before_marker(text, self.opener, start)

    _closing = "\n" + closer

    def _cut_calls(self, text: str, start: int) -> list[ToolCall]:
        last = text.rfind(self.opener)
        if last < 0:
            return []
        done = self.parse(text[:last], min(start, last))[1]
        cut = read_cut(text[last + len(self.opener) :].strip(), as_list, ("arguments",))
        return done + cut
