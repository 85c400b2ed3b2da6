"""Mistral (Mistral Nemo and its JSON-list kin): `[TOOL_CALLS][{"name": ..., "arguments": {...},
"id": "..."}]`, ids of 9 alphanumerics.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from engine.decoding.tool_calls.base import ToolFormat
from engine.decoding.tool_calls.calls import Json, ToolCall, ToolChoice
from engine.decoding.tool_calls.reading import (
    decode_at,
    read_calls,
    read_cut,
    split_at_markers,
    visible_before_marker,
)
from engine.decoding.tool_calls.schema import (
    any_of,
    call_object,
    chosen_functions,
    lark_json,
    lark_literal,
    max_calls,
)

MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")


class MistralFormat(ToolFormat):
    name = "mistral"
    marker = "[TOOL_CALLS]"
    markers = (marker,)

    def template_messages(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
    ) -> list[Json]:
        """Also gives every call and result the 9-alphanumeric id Mistral's template demands,
        derived from the client's id so the same history renders the same prompt."""
        out = super().template_messages(messages, tools)
        pending: list[str] = []  # ids of the last calls, for results that name none
        for i, m in enumerate(out):
            if m.get("tool_calls"):
                for j, call in enumerate(m["tool_calls"]):
                    call["id"] = _mistral_id(call.get("id") or f"{i}.{j}")
                pending = [c["id"] for c in m["tool_calls"]]
            elif m.get("role") == "tool":
                given = m.get("tool_call_id")
                if given:
                    call_id = _mistral_id(str(given))
                else:
                    call_id = pending[0] if pending else _mistral_id(str(i))
                m["tool_call_id"] = call_id
                if call_id in pending:
                    pending.remove(call_id)
        return out

    def call_schema(
        self, tools: Sequence[Mapping[str, Any]], choice: ToolChoice, parallel: bool
    ) -> Json | None:
        """The JSON list after `[TOOL_CALLS]`."""
        if choice in ("auto", "none"):
            return None
        call_id: Json = {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}
        items = [call_object(fn, "arguments", id=call_id) for fn in chosen_functions(tools, choice)]
        return {
            "type": "array",
            "items": any_of(items),
            "minItems": 1,
            "maxItems": max_calls(parallel),
        }

    def _grammar(
        self, schema: Json, parallel: bool, special_tokens: Mapping[str, int] | None
    ) -> str:
        marker = lark_literal(self.marker, special_tokens)
        return f"start: {marker} calls\ncalls: {lark_json(schema)}\n"

    def _read(self, text: str, pos: int) -> tuple[list[ToolCall], int] | None:
        decoded = decode_at(text, pos)
        if decoded is None:
            return None
        calls = read_calls(decoded[0])
        return None if calls is None else (calls, decoded[1])

    def parse(self, text: str, start: int = 0) -> tuple[str, list[ToolCall]]:
        return split_at_markers(text, self.marker, self._read, start)

    def visible(self, text: str, start: int = 0) -> str:
        return visible_before_marker(text, self.marker, start)

    _closing = "]"

    def _cut_calls(self, text: str, start: int) -> list[ToolCall]:
        at = text.find(self.marker, start)
        if at < 0:
            return []
        return read_cut(text[at + len(self.marker) :].strip(), lambda v: v, ("arguments",))


def _mistral_id(call_id: str) -> str:
    if MISTRAL_ID.fullmatch(call_id):
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]
