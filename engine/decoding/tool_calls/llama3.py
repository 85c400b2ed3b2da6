"""Llama 3.1-3.3 JSON: the whole answer is `{"name": ..., "parameters": {...}}`, maybe after
`<|python_tag|>`; several calls are separated by `;`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.decoding.tool_calls.base import ToolFormat
from engine.decoding.tool_calls.calls import Json, ToolCall, ToolChoice
from engine.decoding.tool_calls.reading import (
    as_list,
    decode_at,
    join_content,
    read_call,
    read_cut,
    split_at_markers,
    visible_before_marker,
)
from engine.decoding.tool_calls.schema import (
    any_of,
    call_object,
    chosen_functions,
    lark_json,
    more_calls,
)


class Llama3JsonFormat(ToolFormat):
    name = "llama3_json"
    tag = "<|python_tag|>"
    markers = (tag,)
    _ARGS = ("parameters", "arguments")

    def template_messages(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
    ) -> list[Json]:
        """Also one call per assistant turn: Llama 3.x templates refuse several at once."""
        out: list[Json] = []
        for m in super().template_messages(messages, tools):
            calls = m.get("tool_calls") or []
            out.append({**m, "tool_calls": calls[:1]} if calls else m)
            out.extend({**m, "content": "", "tool_calls": [c]} for c in calls[1:])
        return out

    def call_schema(
        self, tools: Sequence[Mapping[str, Any]], choice: ToolChoice, parallel: bool
    ) -> Json | None:
        """One `{"name": ..., "parameters": ...}` object, the format the template asks for."""
        if choice in ("auto", "none"):
            return None
        return any_of([call_object(fn, "parameters") for fn in chosen_functions(tools, choice)])

    def _grammar(
        self, schema: Json, parallel: bool, special_tokens: Mapping[str, int] | None
    ) -> str:
        start = "start: call" + more_calls(' "; " call', parallel)
        return f"{start}\ncall: {lark_json(schema)}\n"

    def _read(self, text: str, pos: int) -> tuple[list[ToolCall], int] | None:
        """`;`-separated calls up to the end of the answer."""
        calls: list[ToolCall] = []
        while True:
            decoded = decode_at(text, pos)
            call = read_call(decoded[0], self._ARGS) if decoded is not None else None
            if decoded is None or call is None:
                return None
            calls.append(call)
            rest = text[decoded[1] :].lstrip()
            if not rest.lstrip(";").strip():
                return calls, len(text)
            if not rest.startswith(";"):
                return None
            pos = len(text) - len(rest) + 1

    def parse(self, text: str, start: int = 0) -> tuple[str, list[ToolCall]]:
        if text.find(self.tag, start) >= 0:
            return split_at_markers(text, self.tag, self._read, start)
        head = start
        if not text[head:].lstrip().startswith("{"):
            return text, []
        found = self._read(text, head)
        return (text, []) if found is None else (join_content([text[:head], ""]), found[0])

    def visible(self, text: str, start: int = 0) -> str:
        if text.find(self.tag, start) >= 0:
            return visible_before_marker(text, self.tag, start)
        head = start
        body = text[head:].lstrip()
        if not body or body.startswith("{"):  # the answer may yet be a call
            return text[:head].rstrip()
        return visible_before_marker(text, self.tag, start)

    def _cut_calls(self, text: str, start: int) -> list[ToolCall]:
        """`;`-separated calls: the whole ones read as `parse` reads them, then the cut one."""
        calls: list[ToolCall] = []
        pos = start
        while (decoded := decode_at(text, pos)) is not None:
            call = read_call(decoded[0], self._ARGS)
            if call is None:
                break
            calls.append(call)
            rest = text[decoded[1] :].lstrip()
            if not rest.startswith(";"):
                return calls
            pos = len(text) - len(rest) + 1
        return calls + read_cut(text[pos:].strip(), as_list, self._ARGS)
