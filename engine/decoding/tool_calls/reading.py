"""Finding calls in an answer's text, shared by the families: JSON read at a position, calls
split out at their markers, the content that no continuation can take back, and the calls of
an answer the token limit cut.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, TypeAlias

import pydantic_core

from engine.decoding.tool_calls.calls import ToolCall, new_call_id

DECODER = json.JSONDecoder(strict=False)  # models put raw newlines inside JSON strings


def _arguments_text(value: Any) -> str | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)


def read_call(obj: Any, args_keys: tuple[str, ...] = ("arguments",)) -> ToolCall | None:
    """A call from a decoded `{"name": ..., "arguments": {...}}`, None for any other shape."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    key = next((k for k in args_keys if k in obj), None)
    arguments = _arguments_text(obj[key]) if key else None
    if arguments is None:
        return None
    call_id = obj.get("id")
    return ToolCall(
        obj["name"], arguments, call_id if isinstance(call_id, str) and call_id else new_call_id()
    )


def read_calls(items: Any, args_keys: tuple[str, ...] = ("arguments",)) -> list[ToolCall] | None:
    """All calls of a decoded list, or None when the list is empty or one item is not a call."""
    if not isinstance(items, list) or not items:
        return None
    calls = [read_call(item, args_keys) for item in items]
    return None if any(c is None for c in calls) else [c for c in calls if c is not None]


def decode_at(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value starting at `pos` (after whitespace) and where it ends."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    try:
        return DECODER.raw_decode(text, pos)
    except ValueError:
        return None


def join_content(pieces: list[str]) -> str:
    """Content around the calls: whitespace next to a removed call goes, pieces join by lines.
    One piece (no call found) is the answer unchanged."""
    if len(pieces) == 1:
        return pieces[0]
    trimmed = [pieces[0].rstrip(), *(p.strip() for p in pieces[1:-1]), pieces[-1].lstrip()]
    return "\n".join(p for p in trimmed if p)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could grow into `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


# A call read from `pos`: (the calls, where the call text ends), or None when it is no call.
CallReader: TypeAlias = Callable[[str, int], tuple[list[ToolCall], int] | None]

# Where the answer begins in an answer's text so far (after a think block left in it).
Start: TypeAlias = Callable[[str], int]


def split_at_markers(
    text: str, marker: str, read: CallReader, start: int
) -> tuple[str, list[ToolCall]]:
    pieces: list[str] = []
    calls: list[ToolCall] = []
    piece_start, pos = 0, start
    while (hit := text.find(marker, pos)) >= 0:
        found = read(text, hit + len(marker))
        if found is None:  # malformed: the marker stays in the content
            pos = hit + len(marker)
            continue
        pieces.append(text[piece_start:hit])
        calls.extend(found[0])
        piece_start = pos = found[1]
    pieces.append(text[piece_start:])
    return join_content(pieces), calls


def visible_before_marker(text: str, marker: str, start: int) -> str:
    """Content that no continuation can take back: the text before the first marker, less a
    partial marker and the whitespace that would go if a call followed."""
    hit = text.find(marker, start)
    end = hit if hit >= 0 else len(text) - _partial_suffix(text, marker)
    return text[:end].rstrip()


def _partial(text: str, *, cut_strings: bool) -> Any:
    """The JSON value `text` starts, as far as it got: open arrays and objects closed, a cut
    string kept as written so far (`cut_strings`) or left out; None if nothing parses."""
    try:
        return pydantic_core.from_json(
            text, allow_partial="trailing-strings" if cut_strings else True
        )
    except ValueError:
        return None


def read_cut(text: str, items: Callable[[Any], Any], args_keys: tuple[str, ...]) -> list[ToolCall]:
    """The calls in `text`, a JSON value the token limit cut (`items` finds its list of call
    objects): each one whose name was written whole, the last marked incomplete."""
    written, whole = (items(_partial(text, cut_strings=c)) for c in (True, False))
    if not isinstance(written, list) or not isinstance(whole, list):
        return []
    calls: list[ToolCall] = []
    for obj, firm in zip(written, whole, strict=False):  # firm: no cut strings, so a cut
        name = firm.get("name") if isinstance(firm, dict) else None  # name is absent there
        if not isinstance(obj, dict) or not isinstance(name, str) or not name:
            break
        key = next((k for k in args_keys if k in obj), None)
        args = obj[key] if key is not None and isinstance(obj[key], dict) else {}
        call_id = firm.get("id")
        calls.append(
            ToolCall(
                name,
                json.dumps(args, ensure_ascii=False),
                call_id if isinstance(call_id, str) and call_id else new_call_id(),
            )
        )
    if calls:
        calls[-1] = dataclasses.replace(calls[-1], complete=False)
    return calls


def as_list(value: Any) -> list[Any]:
    return [value]
