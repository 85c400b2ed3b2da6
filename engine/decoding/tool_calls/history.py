"""OpenAI-shaped history (calls with JSON-text arguments, `tool` results) as the chat
templates expect it: arguments parsed into objects, as llama-server does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.decoding.tool_calls.calls import Json


def _text(content: Any) -> str:
    """A message's text: None is "", typed parts are joined as llama-server joins them."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return str(content)


def _arguments_value(arguments: Any) -> Any:
    """Arguments as an object for templates that `tojson` them (llama-server does the same);
    text that is not JSON stays text."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _history_call(call: Mapping[str, Any]) -> Json:
    fn = call.get("function") or {}
    out: Json = {
        "type": "function",
        "function": {
            "name": str(fn.get("name", "")),
            "arguments": _arguments_value(fn.get("arguments", {})),
        },
    }
    if call.get("id"):
        out["id"] = str(call["id"])
    return out


_PASSED_KEYS = ("name", "tool_call_id", "reasoning_content")


def history_message(message: Mapping[str, Any]) -> Json:
    out: Json = {"role": message.get("role"), "content": _text(message.get("content"))}
    for key in _PASSED_KEYS:
        if message.get(key) is not None:
            out[key] = message[key]
    # Templates tell a call turn by the key being there (`'tool_calls' in message`).
    if message.get("tool_calls"):
        out["tool_calls"] = [_history_call(c) for c in message["tool_calls"]]
    return out
