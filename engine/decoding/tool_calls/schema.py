"""The tools offered and the schema and Lark grammar of a forced call, shared by the families.

A forced call's grammar is bounded, so a model that repeats itself must still stop: at most
one call without parallel calls, else at most `MAX_PARALLEL_CALLS`; a string argument whose
schema sets no length takes at most `MAX_ARGUMENT_CHARS` characters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from engine.decoding.tool_calls.calls import (
    EMPTY_PARAMETERS,
    MAX_ARGUMENT_CHARS,
    MAX_PARALLEL_CALLS,
    Json,
    ToolCallError,
    ToolChoice,
)


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = tool.get("function", tool)
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ToolCallError("every tool needs a function with a name")
    return fn


def _parameters(fn: Mapping[str, Any]) -> Json:
    params = fn.get("parameters")
    # llama-server reads a missing or empty schema as "an object with no properties".
    return dict(params) if isinstance(params, Mapping) and params else dict(EMPTY_PARAMETERS)


def chosen_functions(
    tools: Sequence[Mapping[str, Any]], choice: ToolChoice
) -> list[Mapping[str, Any]]:
    functions = [_function(t) for t in tools]
    if choice in ("auto", "required", "none"):
        if not functions:
            raise ToolCallError("tool_choice needs at least one tool")
        return functions
    named = [fn for fn in functions if fn["name"] == choice]
    if not named:
        raise ToolCallError(f"tool_choice names {choice!r}, which is not among the tools")
    return named[:1]


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")

_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")

_SCHEMA_ONE = ("items", "additionalProperties", "not")

_LENGTH_SET = ("maxLength", "enum", "const", "pattern", "format")


def _bounded(schema: Any) -> Any:
    """A copy of an arguments schema whose strings of unbounded length take at most
    MAX_ARGUMENT_CHARS characters (strings with a length, pattern, format or set of values
    keep theirs)."""
    if not isinstance(schema, Mapping):
        return schema
    out: Json = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: _bounded(v) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_bounded(v) for v in out[key]]
    for key in _SCHEMA_ONE:
        if key in out:
            value = out[key]
            out[key] = [_bounded(v) for v in value] if isinstance(value, list) else _bounded(value)
    kind = out.get("type")
    is_string = kind == "string" or (isinstance(kind, list) and "string" in kind)
    if is_string and not any(k in out for k in _LENGTH_SET):
        out["maxLength"] = MAX_ARGUMENT_CHARS
    return out


def max_calls(parallel: bool) -> int:
    return MAX_PARALLEL_CALLS if parallel else 1


def more_calls(item: str, parallel: bool) -> str:
    """Lark for the calls after the first: up to MAX_PARALLEL_CALLS in all, or none."""
    return f" ({item.strip()}){{0,{MAX_PARALLEL_CALLS - 1}}}" if parallel else ""


def call_object(fn: Mapping[str, Any], args_key: str, **extra: Json) -> Json:
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "const": fn["name"]},
            args_key: _bounded(_parameters(fn)),
            **extra,
        },
        "required": ["name", args_key, *extra],
        "additionalProperties": False,
    }


def any_of(schemas: list[Json]) -> Json:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def lark_literal(text: str, special_tokens: Mapping[str, int] | None) -> str:
    # A special token matches only as that token: llguidance names it by id.
    if special_tokens and text in special_tokens:
        return f"<[{int(special_tokens[text])}]>"
    return json.dumps(text)


def lark_json(schema: Json) -> str:
    # No free whitespace inside a call, as for JSON answers (engine.decoding.constraints): a
    # small model given the choice writes newlines into the arguments until max_tokens. The
    # separators are the ones the tool formats' own examples use (`"a": 1, "b": 2`).
    if isinstance(schema, dict):
        schema = {
            **schema,
            "x-guidance": {
                "whitespace_flexible": False,
                "key_separator": ": ",
                "item_separator": ", ",
            },
        }
    return "%json " + json.dumps(schema, ensure_ascii=False)
