"""The generic format, for every other template (llama-server's generic handler): the tools are
described in the system message and every answer is JSON, `{"tool_calls": [...]}` or
`{"response": "..."}`, which a grammar enforces.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from engine.decoding.tool_calls.base import ToolCallStream, ToolFormat
from engine.decoding.tool_calls.calls import Json, ToolCall, ToolChoice
from engine.decoding.tool_calls.reading import DECODER, Start, read_calls, read_cut
from engine.decoding.tool_calls.schema import (
    any_of,
    call_object,
    chosen_functions,
    lark_json,
    max_calls,
)

# {"response": "... at the start of a generic answer, and a string's text so far.
_RESPONSE_START = re.compile(r'\{\s*"response"\s*:\s*"')

_STRING_BODY = re.compile(r'(?:[^"\\]|\\.)*')

# An escape that more text could still change: `\u00`, or a high surrogate awaiting its pair
# (after an even run of backslashes, which are escaped backslashes).
_OPEN_ESCAPE = re.compile(
    r"(?:^|[^\\])(?:\\\\)*(\\u[0-9a-fA-F]{0,3}|\\u[dD][89abAB][0-9a-fA-F]{2})$"
)


class _StringReader:
    """Decodes a JSON string body that may be cut anywhere, from where it left off: a long
    streamed response costs each token only its own characters."""

    def __init__(self) -> None:
        self.raw_end = -1  # where the undecoded rest of the string starts in the answer
        self.text = ""
        self.valid = True

    def read(self, answer: str, start: int) -> str | None:
        """The text so far of the string whose body starts at `start`; None if invalid."""
        if self.raw_end < 0:
            self.raw_end = start
        body = _STRING_BODY.match(answer, self.raw_end)
        end = body.end() if body else self.raw_end
        raw = answer[self.raw_end : end]
        if not answer.startswith('"', end):  # the string goes on
            while open_escape := _OPEN_ESCAPE.search(raw):  # `\ud83c\u`: both must wait
                raw = raw[: open_escape.start(1)]
        try:
            self.text += DECODER.decode(f'"{raw}"') if self.valid and raw else ""
        except ValueError:
            self.valid = False
        self.raw_end += len(raw)
        return self.text if self.valid else None


class GenericFormat(ToolFormat):
    """llama-server's generic handler: tools in the system message, answers as JSON."""

    name = "generic"
    native = False

    def __init__(self, *, system_role: bool = True) -> None:
        self.system_role = system_role  # False: the template refuses system messages

    def template_messages(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
    ) -> list[Json]:
        """Tools described in a system message (merged with an existing first one), calls
        and results turned into the JSON text the model is asked to write and to read."""
        out: list[Json] = []
        names: dict[str, str] = {}  # call id -> function name, for results that omit it
        after_result = False
        for m in super().template_messages(messages, tools):
            if m.get("role") == "tool":
                # Results in a row share one user turn, so turns still alternate.
                text = _generic_result(m, names)
                if after_result:
                    out[-1]["content"] += "\n" + text
                else:
                    out.append({"role": "user", "content": text})
                after_result = True
                continue
            out.append(_generic_call_turn(m, names) if m.get("tool_calls") else m)
            after_result = False
        return self._with_tools_prompt(out, tools) if tools else out

    def _with_tools_prompt(
        self, messages: list[Json], tools: Sequence[Mapping[str, Any]]
    ) -> list[Json]:
        prompt = generic_tools_prompt(tools)
        if messages and messages[0].get("role") == "system":
            prompt = f"{messages.pop(0)['content']}\n\n{prompt}"
        if not self.system_role and messages and messages[0].get("role") == "user":
            messages[0] = {**messages[0], "content": f"{prompt}\n\n{messages[0]['content']}"}
        else:
            messages.insert(0, {"role": "system", "content": prompt})
        return messages

    def template_vars(self, tools: Sequence[Mapping[str, Any]]) -> Json:
        return {}

    def call_schema(
        self, tools: Sequence[Mapping[str, Any]], choice: ToolChoice, parallel: bool
    ) -> Json | None:
        """The whole answer: calls, or with 'auto' also `{"response": "..."}`."""
        if choice == "none":
            return None
        items = [call_object(fn, "arguments") for fn in chosen_functions(tools, choice)]
        array: Json = {
            "type": "array",
            "items": any_of(items),
            "minItems": 1,
            "maxItems": max_calls(parallel),
        }
        calls = {
            "type": "object",
            "properties": {"tool_calls": array},
            "required": ["tool_calls"],
            "additionalProperties": False,
        }
        if choice != "auto":
            return calls
        response = {
            "type": "object",
            "properties": {"response": {"type": "string"}},
            "required": ["response"],
            "additionalProperties": False,
        }
        return {"anyOf": [calls, response]}

    def _grammar(
        self, schema: Json, parallel: bool, special_tokens: Mapping[str, int] | None
    ) -> str:
        return f"start: {lark_json(schema)}\n"

    def parse(self, text: str, start: int = 0) -> tuple[str, list[ToolCall]]:
        head = start
        body = text[head:].strip()
        try:
            obj = DECODER.decode(body)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            calls = read_calls(obj.get("tool_calls")) or read_calls([obj.get("tool_call")]) or []
            said = obj.get("response", obj.get("content"))
            if calls or said is not None:
                reply = said if isinstance(said, str) or said is None else json.dumps(said)
                return text[:head] + (reply or ""), calls
        if (opened := _RESPONSE_START.match(body)) is not None:  # cut short mid-response
            reply = _StringReader().read(body, opened.end())
            if reply is not None:
                return text[:head] + reply, []
        return text, []

    def visible(self, text: str, start: int = 0) -> str:
        return self._visible(text, start, _StringReader())

    def _visible(self, text: str, start: int, reader: _StringReader) -> str:
        head = start
        skipped = len(text) - head - len(text[head:].lstrip())
        body_start = head + skipped
        if body_start < len(text) and text[body_start] != "{":
            return text  # not JSON: plain text, all of it content
        opened = _RESPONSE_START.match(text, body_start)
        reply = reader.read(text, opened.end()) if opened else None
        return text[:head] + (reply or "")

    _closing = "]}"

    def _cut_calls(self, text: str, start: int) -> list[ToolCall]:
        body = text[start:].strip()
        return read_cut(
            body, lambda v: v.get("tool_calls") if isinstance(v, dict) else None, ("arguments",)
        )

    def stream(self, start: Start | None = None) -> ToolCallStream:
        reader = _StringReader()  # one per answer: it remembers how far it decoded
        return ToolCallStream(self, lambda text, at: self._visible(text, at, reader), start)


def generic_tools_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system text that tells a model without native tool support about the tools."""
    listing = json.dumps([dict(t) for t in tools], indent=2, ensure_ascii=False)
    return (
        f"You can call any of the following tools to satisfy the user's requests: {listing}\n\n"
        "Respond in JSON format, either with `tool_calls` (a request to call tools) or with "
        "`response` (your reply to the user), for example "
        '{"tool_calls": [{"name": "<tool name>", "arguments": {...}}]} or '
        '{"response": "<your reply>"}.'
    )


def _generic_call_turn(message: Json, names: dict[str, str]) -> Json:
    calls = []
    for call in message["tool_calls"]:
        fn = call["function"]
        entry: Json = {"name": fn["name"], "arguments": fn["arguments"]}
        if call.get("id"):
            entry["id"] = call["id"]
            names[call["id"]] = fn["name"]
        calls.append(entry)
    said: Json = {"tool_calls": calls}
    if message.get("content"):
        said["content"] = message["content"]
    turn = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**turn, "content": json.dumps(said, indent=2, ensure_ascii=False)}


def _generic_result(message: Json, names: dict[str, str]) -> str:
    """A tool result as the JSON text of a user turn."""
    result: Json = {}
    call_id = message.get("tool_call_id")
    name = message.get("name") or names.get(str(call_id))
    if name:
        result["tool"] = name
    result["content"] = message["content"]
    if call_id:
        result["tool_call_id"] = call_id
    return json.dumps({"tool_response": result}, indent=2, ensure_ascii=False)
