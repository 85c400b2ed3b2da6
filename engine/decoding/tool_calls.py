"""Tool calls: how each model family is shown tools and how its answers carry calls.

A model calls a tool by writing text in the format its chat template taught it:
- hermes (Qwen2.5, Qwen3, QwQ, Hermes 2/3): `<tool_call>\\n{"name": ..., "arguments": {...}}
  \\n</tool_call>` blocks, any number, anywhere in the answer;
- llama3_json (Llama 3.1-3.3): the whole answer is `{"name": ..., "parameters": {...}}`,
  maybe after `<|python_tag|>`; several calls are separated by `;`;
- mistral (Mistral Nemo and its JSON-list kin): `[TOOL_CALLS][{"name": ..., "arguments": {...},
  "id": "..."}]`, ids of 9 alphanumerics;
- generic, for every other template (llama-server's generic handler): the tools are described
  in the system message and every answer is JSON, `{"tool_calls": [...]}` or
  `{"response": "..."}`, which a grammar enforces.

`ToolFormat` turns OpenAI-shaped history into what the family's template expects, gives the
constraint that forces a call (a llguidance Lark grammar) and splits answers into content and
calls, whole (`parse`) or while they stream (`ToolCallStream`). A call that does not parse
stays in the content: the user sees what the model wrote rather than an error.

A reasoning model may draft a call in its think block: that is never a call. The reply reader
(engine.decoding.reply_reader) finds the block; where it leaves the block in the text, it tells
the format where the answer starts (`start`), and nothing before it is read for calls.

A forced call's grammar is bounded, so a model that repeats itself must still stop: at most
one call without parallel calls, else at most `MAX_PARALLEL_CALLS`; a string argument whose
schema sets no length takes at most `MAX_ARGUMENT_CHARS` characters. A forced answer that the
token limit cut is still calls, never text (`cut_calls`): the last one marked incomplete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import pydantic_core

from engine.errors import EngineError

ToolChoice: TypeAlias = Literal["auto", "none", "required"] | str
Json: TypeAlias = dict[str, Any]

EMPTY_PARAMETERS: Json = {"type": "object", "properties": {}}
MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
_DECODER = json.JSONDecoder(strict=False)  # models put raw newlines inside JSON strings
# A forced call's bounds. Parallel calls: enough for a fan-out over a few items (the weather in
# several cities), few enough that a model repeating one call ends within a usual max_tokens.
MAX_PARALLEL_CALLS = 8
# A string argument without a maxLength of its own: room for a paragraph or a short file, not
# for a model looping inside the string until the token limit.
MAX_ARGUMENT_CHARS = 2000


class ToolCallError(EngineError):
    """Tools or a tool choice that cannot be honoured; `str()` is one line."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object (as OpenAI sends `function.arguments`)
    id: str  # "call_" + random hex if the model gave none
    # False: the token limit cut the call; `arguments` holds the values written so far (the
    # last one possibly cut), closed into an object.
    complete: bool = True


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# --- tools and tool choice -------------------------------------------------------------------


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = tool.get("function", tool)
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ToolCallError("every tool needs a function with a name")
    return fn


def _parameters(fn: Mapping[str, Any]) -> Json:
    params = fn.get("parameters")
    # llama-server reads a missing or empty schema as "an object with no properties".
    return dict(params) if isinstance(params, Mapping) and params else dict(EMPTY_PARAMETERS)


def _chosen(tools: Sequence[Mapping[str, Any]], choice: ToolChoice) -> list[Mapping[str, Any]]:
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


def _max_calls(parallel: bool) -> int:
    return MAX_PARALLEL_CALLS if parallel else 1


def _more(item: str, parallel: bool) -> str:
    """Lark for the calls after the first: up to MAX_PARALLEL_CALLS in all, or none."""
    return f" ({item.strip()}){{0,{MAX_PARALLEL_CALLS - 1}}}" if parallel else ""


def _call_object(fn: Mapping[str, Any], args_key: str, **extra: Json) -> Json:
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


def _any_of(schemas: list[Json]) -> Json:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _lark_literal(text: str, special_tokens: Mapping[str, int] | None) -> str:
    # A special token matches only as that token: llguidance names it by id.
    if special_tokens and text in special_tokens:
        return f"<[{int(special_tokens[text])}]>"
    return json.dumps(text)


def _lark_json(schema: Json) -> str:
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


# --- history for the template ----------------------------------------------------------------


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


def _history_message(message: Mapping[str, Any]) -> Json:
    out: Json = {"role": message.get("role"), "content": _text(message.get("content"))}
    for key in _PASSED_KEYS:
        if message.get(key) is not None:
            out[key] = message[key]
    # Templates tell a call turn by the key being there (`'tool_calls' in message`).
    if message.get("tool_calls"):
        out["tool_calls"] = [_history_call(c) for c in message["tool_calls"]]
    return out


# --- answers: finding calls ------------------------------------------------------------------


def _arguments_text(value: Any) -> str | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)


def _call(obj: Any, args_keys: tuple[str, ...] = ("arguments",)) -> ToolCall | None:
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


def _calls(items: Any, args_keys: tuple[str, ...] = ("arguments",)) -> list[ToolCall] | None:
    """All calls of a decoded list, or None when the list is empty or one item is not a call."""
    if not isinstance(items, list) or not items:
        return None
    calls = [_call(item, args_keys) for item in items]
    return None if any(c is None for c in calls) else [c for c in calls if c is not None]


def _decode_at(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value starting at `pos` (after whitespace) and where it ends."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    try:
        return _DECODER.raw_decode(text, pos)
    except ValueError:
        return None


def _join(pieces: list[str]) -> str:
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


def _split_at_markers(
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
    return _join(pieces), calls


def _visible_before_marker(text: str, marker: str, start: int) -> str:
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


def _cut(text: str, items: Callable[[Any], Any], args_keys: tuple[str, ...]) -> list[ToolCall]:
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


def _as_list(value: Any) -> list[Any]:
    return [value]


# --- the families ----------------------------------------------------------------------------


class ToolFormat(ABC):
    """One family's tool-call format. The base is what native formats share."""

    name: str = ""
    native: bool = True  # the model's template renders `tools` itself
    markers: tuple[str, ...] = ()  # text that opens or closes a call: often special tokens

    def template_messages(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
    ) -> list[Json]:
        """Messages ready for the chat template: OpenAI-shaped history (assistant messages
        with `tool_calls` whose `function.arguments` is a JSON string; `tool` messages with
        `tool_call_id`/content) converted to what this family's templates expect (arguments
        parsed into a dict, as llama-server does)."""
        return [_history_message(m) for m in messages]

    def template_vars(self, tools: Sequence[Mapping[str, Any]]) -> Json:
        """Extra render() variables. No `tools` at all when there are none: Llama 3.x reads
        an empty list as "tools are on" and asks the model for a call."""
        return {"tools": [dict(t) for t in tools]} if tools else {}

    def call_schema(
        self, tools: Sequence[Mapping[str, Any]], choice: ToolChoice, parallel: bool
    ) -> Json | None:
        """JSON schema of the JSON inside one call's markers when a call is forced (choice
        'required' or a function name); None otherwise. Arguments follow each function's
        `parameters`, names are consts."""
        if choice in ("auto", "none"):
            return None
        return _any_of([_call_object(fn, "arguments") for fn in _chosen(tools, choice)])

    def grammar(
        self,
        tools: Sequence[Mapping[str, Any]],
        choice: ToolChoice,
        parallel: bool,
        *,
        special_tokens: Mapping[str, int] | None = None,
    ) -> str | None:
        """The decoding constraint as llguidance Lark text, None when nothing is forced.

        `special_tokens` maps the family's `markers` that are single special tokens in the
        loaded vocabulary to their ids: a grammar literal only matches plain text, so a
        model that writes `<tool_call>` as one token needs it named by id.

        The grammar holds from the answer's first token: a reasoning model gets no think
        block under it, so start it after the block closes or render with thinking off.
        """
        schema = self.call_schema(tools, choice, parallel)
        if schema is None:
            return None
        return self._grammar(schema, parallel, special_tokens)

    @abstractmethod
    def _grammar(
        self, schema: Json, parallel: bool, special_tokens: Mapping[str, int] | None
    ) -> str: ...

    @abstractmethod
    def parse(self, text: str, start: int = 0) -> tuple[str, list[ToolCall]]:
        """Split a complete answer into (content, calls). A malformed call (bad JSON, unknown
        shape) is never an exception: it stays in content and yields no call. `start`: where
        the answer begins after a think block left in the text (kept as content, never read
        for calls)."""

    @abstractmethod
    def visible(self, text: str, start: int = 0) -> str:
        """Of an unfinished answer, the content that `parse` of any continuation starts with."""

    def cut_calls(self, text: str, start: int = 0) -> list[ToolCall]:
        """The calls of an answer decoded under the forced-call grammar and cut short (the
        token limit, a stop string): the ones it finished, then the one it was writing,
        marked incomplete, if its name is whole. Under that grammar nothing is content."""
        content, calls = self.parse(text + self._closing, start)
        if calls and not content.strip():  # it ended right after a whole call
            return calls
        return self._cut_calls(text, start)

    _closing = ""  # what ends a forced answer after its last call

    @abstractmethod
    def _cut_calls(self, text: str, start: int) -> list[ToolCall]: ...

    def stream(self, start: Start | None = None) -> ToolCallStream:
        """`start`: where the answer begins in the text so far (after a think block left in
        it); 0 when not given."""
        return ToolCallStream(self, start=start)


class HermesFormat(ToolFormat):
    name = "hermes"
    opener, closer = "<tool_call>", "</tool_call>"
    markers = (opener, closer)

    def _grammar(
        self, schema: Json, parallel: bool, special_tokens: Mapping[str, int] | None
    ) -> str:
        start = "start: block" + _more(' "\\n" block', parallel)
        block = (
            f'block: {_lark_literal(self.opener, special_tokens)} "\\n" call "\\n" '
            f"{_lark_literal(self.closer, special_tokens)}"
        )
        return f"{start}\n{block}\ncall: {_lark_json(schema)}\n"

    def _read(self, text: str, pos: int) -> tuple[list[ToolCall], int] | None:
        closed = text.find(self.closer, pos)
        inner = text[pos:] if closed < 0 else text[pos:closed]
        try:  # a complete call whose close marker never came still counts
            call = _call(_DECODER.decode(inner.strip()))
        except ValueError:
            return None
        if call is None:
            return None
        return [call], len(text) if closed < 0 else closed + len(self.closer)

    def parse(self, text: str, start: int = 0) -> tuple[str, list[ToolCall]]:
        return _split_at_markers(text, self.opener, self._read, start)

    def visible(self, text: str, start: int = 0) -> str:
        return _visible_before_marker(text, self.opener, start)

    _closing = "\n" + closer

    def _cut_calls(self, text: str, start: int) -> list[ToolCall]:
        last = text.rfind(self.opener)
        if last < 0:
            return []
        done = self.parse(text[:last], min(start, last))[1]
        cut = _cut(text[last + len(self.opener) :].strip(), _as_list, ("arguments",))
        return done + cut


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
        items = [_call_object(fn, "arguments", id=call_id) for fn in _chosen(tools, choice)]
        return {
            "type": "array",
            "items": _any_of(items),
            "minItems": 1,
            "maxItems": _max_calls(parallel),
        }

    def _grammar(
        self, schema: Json, parallel: bool, special_tokens: Mapping[str, int] | None
    ) -> str:
        marker = _lark_literal(self.marker, special_tokens)
        return f"start: {marker} calls\ncalls: {_lark_json(schema)}\n"

    def _read(self, text: str, pos: int) -> tuple[list[ToolCall], int] | None:
        decoded = _decode_at(text, pos)
        if decoded is None:
            return None
        calls = _calls(decoded[0])
        return None if calls is None else (calls, decoded[1])

    def parse(self, text: str, start: int = 0) -> tuple[str, list[ToolCall]]:
        return _split_at_markers(text, self.marker, self._read, start)

    def visible(self, text: str, start: int = 0) -> str:
        return _visible_before_marker(text, self.marker, start)

    _closing = "]"

    def _cut_calls(self, text: str, start: int) -> list[ToolCall]:
        at = text.find(self.marker, start)
        if at < 0:
            return []
        return _cut(text[at + len(self.marker) :].strip(), lambda v: v, ("arguments",))


def _mistral_id(call_id: str) -> str:
    if MISTRAL_ID.fullmatch(call_id):
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


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
        return _any_of([_call_object(fn, "parameters") for fn in _chosen(tools, choice)])

    def _grammar(
        self, schema: Json, parallel: bool, special_tokens: Mapping[str, int] | None
    ) -> str:
        start = "start: call" + _more(' "; " call', parallel)
        return f"{start}\ncall: {_lark_json(schema)}\n"

    def _read(self, text: str, pos: int) -> tuple[list[ToolCall], int] | None:
        """`;`-separated calls up to the end of the answer."""
        calls: list[ToolCall] = []
        while True:
            decoded = _decode_at(text, pos)
            call = _call(decoded[0], self._ARGS) if decoded is not None else None
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
            return _split_at_markers(text, self.tag, self._read, start)
        head = start
        if not text[head:].lstrip().startswith("{"):
            return text, []
        found = self._read(text, head)
        return (text, []) if found is None else (_join([text[:head], ""]), found[0])

    def visible(self, text: str, start: int = 0) -> str:
        if text.find(self.tag, start) >= 0:
            return _visible_before_marker(text, self.tag, start)
        head = start
        body = text[head:].lstrip()
        if not body or body.startswith("{"):  # the answer may yet be a call
            return text[:head].rstrip()
        return _visible_before_marker(text, self.tag, start)

    def _cut_calls(self, text: str, start: int) -> list[ToolCall]:
        """`;`-separated calls: the whole ones read as `parse` reads them, then the cut one."""
        calls: list[ToolCall] = []
        pos = start
        while (decoded := _decode_at(text, pos)) is not None:
            call = _call(decoded[0], self._ARGS)
            if call is None:
                break
            calls.append(call)
            rest = text[decoded[1] :].lstrip()
            if not rest.startswith(";"):
                return calls
            pos = len(text) - len(rest) + 1
        return calls + _cut(text[pos:].strip(), _as_list, self._ARGS)


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
            self.text += _DECODER.decode(f'"{raw}"') if self.valid and raw else ""
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
        items = [_call_object(fn, "arguments") for fn in _chosen(tools, choice)]
        array: Json = {
            "type": "array",
            "items": _any_of(items),
            "minItems": 1,
            "maxItems": _max_calls(parallel),
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
        return f"start: {_lark_json(schema)}\n"

    def parse(self, text: str, start: int = 0) -> tuple[str, list[ToolCall]]:
        head = start
        body = text[head:].strip()
        try:
            obj = _DECODER.decode(body)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            calls = _calls(obj.get("tool_calls")) or _calls([obj.get("tool_call")]) or []
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
        return _cut(
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


class ToolCallStream:
    """Incremental: push(text) returns the content that can be shown now (text before any
    possible start of a call; hold back a partial marker prefix); finish() returns
    (remaining_content, calls) at the end of the answer."""

    def __init__(
        self,
        fmt: ToolFormat,
        visible: Callable[[str, int], str] | None = None,
        start: Start | None = None,
    ) -> None:
        self._format = fmt
        self._visible = visible or fmt.visible  # a format may keep state across pushes
        self._start = start or _no_block
        self._text = ""
        self._shown = ""

    def push(self, text: str) -> str:
        self._text += text
        visible = self._visible(self._text, self._start(self._text))
        if len(visible) <= len(self._shown) or not visible.startswith(self._shown):
            return ""
        new, self._shown = visible[len(self._shown) :], visible
        return new

    def finish(self, *, forced: bool = False) -> tuple[str, list[ToolCall]]:
        """`forced`: the answer was decoded under the forced-call grammar, so it is calls
        only, even when it was cut short."""
        start = self._start(self._text)
        content, calls = self._format.parse(self._text, start)
        if forced and (content.strip() or not calls):
            content, calls = "", self._format.cut_calls(self._text, start)
        # `visible` promises a prefix of the content; should it fail, nothing is sent twice.
        return content[_common_prefix(content, self._shown) :], calls


def _no_block(text: str) -> int:
    return 0


def _common_prefix(a: str, b: str) -> int:
    if a.startswith(b):
        return len(b)
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


# --- choosing the family ---------------------------------------------------------------------

_USES_TOOLS = re.compile(r"\btools\b")
_HERMES_CALL = re.compile(r'\{\\?"name\\?":')
# <tool_call> wrapping XML rather than JSON: Qwen3-Coder, GLM, MiniMax...
_XML_CALLS = ("<function=", "<arg_key>", "<invoke ")
_LLAMA3_HEADER = "<|start_header_id|>"


def tool_format_for(template_source: str | None) -> ToolFormat:
    """Pick the family from the template text (e.g. '<tool_call>' → hermes; Llama 3.x headers +
    tools/'<|python_tag|>' or '"parameters"' → llama3_json; '[TOOL_CALLS]' → mistral; a
    template that never references `tools` (or None) → generic)."""
    src = template_source or ""
    if not _USES_TOOLS.search(src) or any(m in src for m in _XML_CALLS):
        return GenericFormat(system_role=not _refuses_system(src))
    if "[TOOL_CALLS]" in src and "[ARGS]" not in src:  # [ARGS]: Mistral's later name[ARGS]{}
        return MistralFormat()
    if "<tool_call>" in src and "<tool_calls>" not in src and _HERMES_CALL.search(src):
        return HermesFormat()
    if _LLAMA3_HEADER in src and ("<|python_tag|>" in src or '"parameters"' in src):
        return Llama3JsonFormat()
    return GenericFormat(system_role=not _refuses_system(src))


def _refuses_system(src: str) -> bool:
    # Gemma's wording; such templates raise on a system turn, so the tools go to the user.
    return "system role not supported" in src.lower()


__all__ = [
    "MAX_ARGUMENT_CHARS",
    "MAX_PARALLEL_CALLS",
    "GenericFormat",
    "HermesFormat",
    "Llama3JsonFormat",
    "MistralFormat",
    "ToolCall",
    "ToolCallError",
    "ToolCallStream",
    "ToolChoice",
    "ToolFormat",
    "generic_tools_prompt",
    "new_call_id",
    "tool_format_for",
]
