"""The HTTP API's request and response shapes as pydantic models.

Every route reads its body with `parse_body`, which checks it against the route's model and
turns the first problem into a one-line 400 naming the field (`'temperature' must be between
0 and 2`), and works from the typed object. Chat messages and tools come out OpenAI-shaped
(`chat_messages`, `chat_tools`) whatever the dialect, as `chat_reply.plan_chat` and the tool
formats take them. `openapi.py` documents the API from the same models.

A key a body model does not declare is a 400 naming it (`body_model.Body`), but for the few
that official clients send and that change nothing (`body_model.IGNORED`, the one list). Models
are strict, as the routes always were: JSON's true is not a number, 1.0 is not a whole number,
"1" is not 1.

The document must promise no refusal the server does not make: the fuzz test sends bodies the
schema calls invalid and expects a 4xx. Rules across fields (a tool_choice needs its tools) are
told in descriptions, not keywords.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError, core_schema

from engine.decoding.tool_calls import ToolChoice
from engine.host.host import UNSET, Unset
from engine.server.body_model import UNKNOWN, Body, NotHonoured
from engine.server.errors import ApiError

T = TypeVar("T", bound=BaseModel)

MAX_STOP = 16
MAX_TOOLS = 128
MAX_EMBED_INPUTS = 64
MAX_RERANK_DOCUMENTS = 1000  # Cohere's limit; each is one pair to score
_TOOL_NAME = r"^[A-Za-z0-9_.-]{1,64}$"
# Patterns refused in words rather than as a regular expression.
_PATTERN_TEXT = {_TOOL_NAME: "must be 1-64 letters, digits, '_', '.' or '-'"}


def _refuse(message: str) -> PydanticCustomError:
    """An error whose message follows the field's quoted path: "'stop' <message>"."""
    return PydanticCustomError("candlewick", message)


def _refuse_whole(message: str) -> PydanticCustomError:
    """An error whose message is complete as it is (it names its field itself)."""
    return PydanticCustomError("candlewick_whole", message)


class Refused(NotHonoured):
    """A field of the OpenAI and Ollama APIs that the server does not honour."""


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _fmt(x: Any) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


@dataclass(frozen=True)
class Between:
    """A number in [lo, hi], refused as "must be between lo and hi" (what the hand checks say,
    and pydantic's one-bound errors cannot). What is not a finite number is left to the float
    type's own error."""

    lo: float
    hi: float

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {**handler(schema), "minimum": self.lo, "maximum": self.hi}

    def _check(self, v: Any) -> Any:
        if _is_number(v) and math.isfinite(v) and not self.lo <= v <= self.hi:
            raise _refuse(f"must be between {self.lo} and {self.hi}")
        return v


_FINITE = Field(allow_inf_nan=False)
Temperature = Annotated[float, _FINITE, Between(0, 2)]
TopP = Annotated[float, Field(gt=0, allow_inf_nan=False), Between(0, 1)]
UnitInterval = Annotated[float, _FINITE, Between(0, 1)]
RepeatPenalty = Annotated[float, _FINITE, Between(0.01, 10)]
Penalty = Annotated[float, _FINITE, Between(-2, 2)]
OllamaTemperature = Annotated[float, _FINITE, Between(0, 100)]
OllamaTopP = Annotated[float, _FINITE, Between(1e-6, 1)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]
NonEmpty = Annotated[str, Field(min_length=1)]


def _stop(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        if len(v) > MAX_STOP:
            raise _refuse(f"takes at most {MAX_STOP} strings")
        return tuple(x for x in v if x)
    raise _refuse("must be a string or a list of strings")


# Stop strings, as a tuple without empty ones.
Stop = Annotated[
    tuple[str, ...],
    BeforeValidator(
        _stop, json_schema_input_type=str | Annotated[list[str], Field(max_length=MAX_STOP)] | None
    ),
]


def _embed_input(v: Any) -> list[str]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise _refuse("must be a non-empty string or list of non-empty strings")
    if len(v) > MAX_EMBED_INPUTS:
        raise _refuse(f"takes at most {MAX_EMBED_INPUTS} strings")
    return v


EmbedInput = Annotated[
    list[str],
    BeforeValidator(
        _embed_input,
        json_schema_input_type=NonEmpty
        | Annotated[list[NonEmpty], Field(min_length=1, max_length=MAX_EMBED_INPUTS)],
    ),
]


class _Model(Body):
    """A request body or a part of one: a key it does not declare is refused (body_model)."""


class _Reply(BaseModel):
    """An answer's shape, for the document: clients take keys they do not know."""

    model_config = ConfigDict(extra="ignore", strict=True, protected_namespaces=())


# -- pieces shared by the OpenAI and Ollama shapes ------------------------------------------


class TextPart(_Model):
    type: Literal["text"]
    text: str


def _content(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list):
        if not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in v
        ):
            raise _refuse('takes only text parts ({"type": "text", "text": ...})')
        return v
    raise _refuse("must be a string or a list of parts")


Content = Annotated[str | list[TextPart] | None, BeforeValidator(_content)]


def _no_images(v: Any) -> Any:
    if v:
        raise _refuse("cannot be read: this model reads text only")
    return v


def _arguments(what: str) -> BeforeValidator:
    """A call's arguments: JSON text or an object (a refusal names the dialect's own form)."""

    def check(v: Any) -> Any:
        if isinstance(v, str | dict):
            return v
        raise _refuse(f"must be {what}")

    return BeforeValidator(check)


class FunctionDefinition(_Model):
    name: Annotated[str, Field(pattern=_TOOL_NAME, description="1-64 letters, digits, _ . -")]
    description: str | None = None
    # null is refused, as the routes do; absent means a function without arguments.
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="a JSON schema object",
    )
    strict: bool | None = None


class Tool(_Model):
    type: Literal["function"] = "function"
    function: FunctionDefinition

    def as_chat(self) -> dict[str, Any]:
        """OpenAI-shaped, as the tool formats take it (`strict` is not read)."""
        fn: dict[str, Any] = {"name": self.function.name, "parameters": self.function.parameters}
        if self.function.description:
            fn["description"] = self.function.description
        return {"type": "function", "function": fn}


def _tools(v: Any) -> Any:
    if v is None:
        return v
    if not isinstance(v, list):
        raise _refuse("must be a list of tools")
    if len(v) > MAX_TOOLS:
        raise _refuse(f"takes at most {MAX_TOOLS} tools")
    seen: set[str] = set()
    for t in v:
        fn = t.get("function") if isinstance(t, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str):
            if name in seen:
                raise _refuse_whole(f"tools: the function name '{name}' appears twice")
            seen.add(name)
    return v


Tools = Annotated[
    Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None,
    BeforeValidator(_tools),
    Field(description="function tools of distinct names"),
]


def _chat_tools(tools: Sequence[Tool] | None) -> list[dict[str, Any]]:
    return [t.as_chat() for t in tools or ()]


def _fields_by_role(schema: dict[str, Any], cls: type[Any]) -> None:
    """The document says what the model reads: a field of one role is typed only in the
    messages of that role (in the others it is ignored, whatever it holds). Each stays named
    untyped at the top, where the refusal of unknown keys looks."""
    props = schema["properties"]
    by_role: dict[str, dict[str, Any]] = {}
    for role, name in cls.ROLE_FIELDS:
        by_role.setdefault(role, {})[name] = props.pop(name)
        props[name] = {"description": f"read in {role} messages only"}
    if not by_role:
        return
    others = [r for r in props["role"]["enum"] if r not in by_role]
    schema["anyOf"] = [
        {"properties": {"role": {"enum": others}}},
        *({"properties": {"role": {"const": r}, **fields}} for r, fields in by_role.items()),
    ]


Role = Literal["system", "developer", "user", "assistant", "tool"]


class _Message(_Model):
    model_config = ConfigDict(json_schema_extra=_fields_by_role)
    role: Role
    content: Content = None
    # Only an empty list passes: images are refused by name rather than ignored.
    images: Annotated[
        Annotated[list[str], Field(max_length=0)] | None,
        BeforeValidator(_no_images),
        Field(description="refused: this model reads text only"),
    ] = None

    # (role, field): the routes read these fields only in messages of that role; elsewhere
    # they are dropped, whatever they hold (a client may send its whole message objects).
    ROLE_FIELDS: ClassVar[tuple[tuple[Role, str], ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _drop_other_roles_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        role = data.get("role")
        drop = {f for r, f in cls.ROLE_FIELDS if r != role} - {
            f for r, f in cls.ROLE_FIELDS if r == role
        }
        return {k: v for k, v in data.items() if k not in drop}

    @property
    def text(self) -> str:
        """The content as one string (text parts joined), as the chat template takes it."""
        c = self.content
        return c if isinstance(c, str) else "".join(p.text for p in c or ())

    def as_chat(self, i: int) -> dict[str, Any]:
        """Message `i` OpenAI-shaped, whatever the dialect, as plan_chat and the tool formats
        read it: `developer` is `system` and the content one string."""
        return {"role": "system" if self.role == "developer" else self.role, "content": self.text}


def _history(
    msg: dict[str, Any],
    i: int,
    calls: Sequence[ToolCall | OllamaToolCall] | None,
    thought: str | None,
    call_id: str | None,
    name: str | None,
) -> dict[str, Any]:
    """`msg` with an assistant's calls (arguments as JSON text, numbered where they come
    without an id) and thinking, and a tool result's call id and function name."""
    if calls:
        msg["tool_calls"] = [
            {
                "id": c.id or f"call_{i}_{j}",
                "type": "function",
                "function": {
                    "name": c.function.name,
                    "arguments": c.function.arguments
                    if isinstance(c.function.arguments, str)
                    else json.dumps(c.function.arguments, ensure_ascii=False),
                },
            }
            for j, c in enumerate(calls)
        ]
    if thought:
        msg["reasoning_content"] = thought
    if call_id is not None:
        msg["tool_call_id"] = call_id
    if name is not None:
        msg["name"] = name
    return msg


def _messages(v: Any) -> Any:
    if not isinstance(v, list) or not v:
        raise _refuse("must be a non-empty list")
    return v


# -- OpenAI ---------------------------------------------------------------------------------


class FunctionCall(_Model):
    name: str
    # OpenAI sends the arguments as JSON text; an object is taken too.
    arguments: Annotated[str | dict[str, Any], _arguments("a JSON string or an object")] = "{}"


class ToolCall(_Model):
    id: str | None = None  # the routes number calls that come without one
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Message):
    ROLE_FIELDS = (
        ("assistant", "tool_calls"),
        ("assistant", "reasoning_content"),
        ("tool", "tool_call_id"),
        ("tool", "name"),
    )
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    tool_call_id: str | None = None
    name: str | None = None
    refusal: Annotated[Any, Refused("send a refusal as the content")] = None
    audio: Annotated[Any, Refused("this model reads text only")] = None
    function_call: Annotated[Any, Refused("the deprecated function call; send tool_calls")] = None

    def as_chat(self, i: int) -> dict[str, Any]:
        return _history(
            super().as_chat(i),
            i,
            self.tool_calls,
            self.reasoning_content,
            self.tool_call_id,
            self.name,
        )


class StreamOptions(_Model):
    include_usage: bool | None = None


class NamedFunction(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"]
    function: NamedFunction


def _schema_value(v: Any) -> Any:
    # Checked before the union, whose errors would name its branches in their path.
    if isinstance(v, dict | bool):
        return v
    raise _refuse("must be a JSON schema (an object)")


class JsonSchemaFormat(_Model):
    name: str | None = None
    description: str | None = None
    schema_: Annotated[dict[str, Any] | bool, BeforeValidator(_schema_value)] = Field(
        alias="schema"
    )
    strict: bool | None = None


def _json_schema_with_its_type(schema: dict[str, Any]) -> None:
    """The document says what the model checks: `json_schema` counts with its type only."""
    prop = schema["properties"].pop("json_schema")
    schema["properties"]["json_schema"] = {"description": "read with type json_schema only"}
    ref = next(x for x in prop["anyOf"] if "$ref" in x)
    schema["if"] = {"properties": {"type": {"const": "json_schema"}}}
    schema["then"] = {
        "required": ["json_schema"],
        "properties": {"json_schema": {**ref, "description": prop["description"]}},
    }


class ResponseFormat(_Model):
    # One model rather than a union tagged by `type`: a tagged union's errors name the tag
    # in their path, which would read "response_format.json_schema.json_schema".
    model_config = ConfigDict(json_schema_extra=_json_schema_with_its_type)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = Field(None, description="with type json_schema")

    @model_validator(mode="before")
    @classmethod
    def _schema_only_with_its_type(cls, data: Any) -> Any:
        # The routes read `json_schema` only with type json_schema, as OpenAI defines it.
        if isinstance(data, dict) and data.get("type") != "json_schema":
            return {k: v for k, v in data.items() if k != "json_schema"}
        return data

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise _refuse_whole("'response_format.json_schema' must be an object with a 'schema'")
        return self


def _n(v: Any) -> Any:
    if v is None:
        return 1
    if not isinstance(v, int) or isinstance(v, bool):
        raise _refuse("must be a whole number")
    if v != 1:
        raise _refuse_whole("only n=1 is supported")
    return v


class _Messages(_Model):
    messages: Annotated[list[ChatMessage], BeforeValidator(_messages), Field(min_length=1)]

    def chat_messages(self) -> list[dict[str, Any]]:
        return [m.as_chat(i) for i, m in enumerate(self.messages)]


def _unsupported_true(v: Any) -> Any:
    if v is not None and not isinstance(v, bool):
        raise _refuse("must be true or false")
    if v:
        raise _refuse("is not supported")
    return None


def _no_alternatives(v: Any) -> Any:
    if v is None or (type(v) is int and v == 0):  # zero alternatives ask for nothing
        return None
    raise _refuse("is not supported")


def _no_bias(v: Any) -> Any:
    if v is None or (isinstance(v, dict) and not v):  # an empty bias asks for nothing
        return None
    raise _refuse("is not supported")


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|m|s|ms|us|\u00b5s|ns)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "\u00b5s": 1e-6, "ns": 1e-9}


def duration_seconds(v: object) -> float:
    """Seconds from a number or a Go duration ("5m", "1h30m", "0", "-1"), as Ollama reads
    keep_alive; ValueError says what is wrong."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError('must be a number of seconds or a duration such as "5m"')
    if isinstance(v, int | float):
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return float(v)
    text = v.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body and re.fullmatch(rf"(?:{_DURATION.pattern})+", body):
        return sign * sum(float(n) * _UNIT_S[u] for n, u in _DURATION.findall(body))
    try:
        number = float(body)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(
            'must be a number of seconds or a duration such as "5m", "1h", "0" or "-1"'
        )
    return sign * number


def _keep_alive(v: Any) -> Any:
    """Ollama's keep_alive; negative means keep the model loaded."""
    if v is None:
        return None
    try:
        return duration_seconds(v)
    except ValueError as e:
        raise _refuse(str(e)) from None


KeepAlive = Annotated[
    float | None,
    BeforeValidator(_keep_alive, json_schema_input_type=float | str | None),
    Field(
        description="how long the model stays loaded after this request: seconds or a duration "
        '("5m"); 0 unloads it when idle, a negative value keeps it'
    ),
]
Ttl = Annotated[
    int,
    Field(
        ge=0,
        description="seconds the model stays loaded once idle, as LM "
        "Studio's ttl; 0 unloads it when idle",
    ),
]


def keep_seconds(v: float | None) -> float | Unset | None:
    """A request's keep-alive for the host: absent -> unchanged, negative -> keep."""
    if v is None:
        return UNSET
    return None if v < 0 else v


class _OpenAISampling(_Model):
    """What /v1/chat/completions and /v1/completions share, in the routes' order of checks."""

    n: Annotated[Literal[1], BeforeValidator(_n, json_schema_input_type=Literal[1] | None)] = 1
    model: str | None = None
    ttl: Ttl | None = None
    max_tokens: Annotated[int, Field(ge=1, description="capped at the server's limit")] | None = (
        None
    )
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: UnitInterval | None = None
    repeat_penalty: RepeatPenalty | None = None
    seed: Seed | None = None
    stop: Stop = ()
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    # Sent by clients, not served: refused when they ask for something.
    logprobs: Annotated[Literal[False] | None, BeforeValidator(_unsupported_true)] = None
    top_logprobs: Annotated[
        None, BeforeValidator(_no_alternatives, json_schema_input_type=Literal[0] | None)
    ] = None
    logit_bias: Annotated[
        None,
        BeforeValidator(
            _no_bias, json_schema_input_type=Annotated[dict[str, float], Field(max_length=0)] | None
        ),
    ] = None


def _tool_choice(v: Any) -> Any:
    if v is None or v in ("auto", "none", "required"):
        return v
    if (
        isinstance(v, dict)
        and v.get("type") == "function"
        and isinstance(v.get("function"), dict)
        and isinstance(v["function"].get("name"), str)
    ):
        return v
    raise _refuse(
        "must be 'auto', 'none', 'required' or "
        '{"type": "function", "function": {"name": ...}}'
    )


class _ToolFields(_Model):
    tools: Tools = None
    tool_choice: Annotated[
        Literal["auto", "none", "required"] | NamedToolChoice | None,
        BeforeValidator(_tool_choice),
        Field(description="but for none, needs tools; a named function must be one of them"),
    ] = None
    parallel_tool_calls: bool | None = None

    def chat_tools(self) -> list[dict[str, Any]]:
        return _chat_tools(self.tools)

    def chosen_tool(self) -> ToolChoice:
        """What the tool formats take: a mode, or the name of the function to call."""
        c = self.tool_choice
        if c is None:
            return "auto" if self.tools else "none"
        return c.function.name if isinstance(c, NamedToolChoice) else c

    @field_validator("tool_choice")
    @classmethod
    def _choice_needs_tools(cls, v: Any, info: ValidationInfo) -> Any:
        if v is None or "tools" not in info.data:  # absent, or the tools were refused
            return v
        names = {t.function.name for t in info.data["tools"] or []}
        if v != "none" and not names:
            raise _refuse_whole("'tool_choice' needs 'tools'")
        if isinstance(v, NamedToolChoice) and v.function.name not in names:
            raise _refuse_whole(f"'tool_choice' names '{v.function.name}', which is not in 'tools'")
        return v


class _FormatFields(_Model):
    response_format: ResponseFormat | None = None
    grammar: Annotated[
        str | None,
        Field(
            description="a GBNF grammar the reply must follow (llama-server's extension); not "
            "with a JSON response_format"
        ),
    ] = None

    @field_validator("grammar")
    @classmethod
    def _grammar_alone(cls, v: str | None, info: ValidationInfo) -> str | None:
        rf = info.data.get("response_format")
        if v is not None and rf is not None and rf.type != "text":
            raise _refuse_whole("'grammar' and a JSON 'response_format' exclude each other")
        return v


# pydantic lists the fields of the last base first: the bases are in reverse order of the
# routes' checks, so the first problem reported is the one the routes found first.
class ChatCompletionRequest(_FormatFields, _ToolFields, _OpenAISampling, _Messages):
    reasoning_format: Annotated[
        Literal["auto", "deepseek", "none"] | None,
        Field(
            description="none: thinking stays in the content; auto, deepseek: it comes apart, "
            "in reasoning_content"
        ),
    ] = None
    # OpenAI's fields that the server does not honour.
    reasoning_effort: Annotated[
        Any, Refused("a thinking budget cannot be set; see reasoning_format")
    ] = None
    verbosity: Annotated[Any, Refused("the answer's length is the model's")] = None
    modalities: Annotated[Any, Refused("the answer is text only", (["text"],))] = None
    audio: Annotated[Any, Refused("the answer is text only")] = None
    prediction: Annotated[Any, Refused("predicted outputs are not used")] = None
    web_search_options: Annotated[Any, Refused("this server runs no web search")] = None
    functions: Annotated[Any, Refused("the deprecated functions; send tools")] = None
    function_call: Annotated[Any, Refused("the deprecated function_call; send tool_choice")] = None
    store: Annotated[Any, Refused("completions are not kept", (False,))] = None


def _prompt(v: Any) -> Any:
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        v = v[0]
    if not isinstance(v, str):
        raise _refuse_whole("'prompt' must be a string (one prompt per request)")
    if not v:
        raise _refuse_whole("'prompt' is empty")
    return v


def _echo(v: Any) -> Any:
    if v is not None and not isinstance(v, bool):
        raise _refuse("must be true or false")
    if v:
        raise _refuse("is not supported")
    return v


class _Prompt(_Model):
    # One prompt per request: a list holding one string is taken as that string.
    prompt: Annotated[
        str,
        BeforeValidator(
            _prompt,
            json_schema_input_type=NonEmpty
            | Annotated[list[NonEmpty], Field(min_length=1, max_length=1)],
        ),
    ]


class CompletionRequest(_FormatFields, _OpenAISampling, _Prompt):
    echo: Annotated[Literal[False] | None, BeforeValidator(_echo)] = None
    suffix: Annotated[Any, Refused("no text is inserted before a suffix", ("",))] = None
    best_of: Annotated[Any, Refused("one completion is generated", (1,))] = None


class EmbeddingRequest(_Model):
    model: str | None = None
    ttl: Ttl | None = None
    encoding_format: Literal["float", "base64"] | None = None
    input: EmbedInput
    dimensions: Annotated[Any, Refused("vectors have the model's own length")] = None


class RerankDocument(_Model):
    """A document as Jina and Cohere also send it."""

    text: str


def _documents(v: Any) -> list[str]:
    if not isinstance(v, list) or not v:
        raise _refuse('must be a non-empty list of strings or {"text": ...} objects')
    for i, x in enumerate(v):
        for key in x if isinstance(x, dict) else ():
            if key != "text":
                raise _refuse_whole(f"'documents[{i}].{key}' {UNKNOWN}")
    out = [x["text"] if isinstance(x, dict) and isinstance(x.get("text"), str) else x for x in v]
    if not all(isinstance(x, str) for x in out):
        raise _refuse('must be a non-empty list of strings or {"text": ...} objects')
    if len(out) > MAX_RERANK_DOCUMENTS:
        raise _refuse(f"takes at most {MAX_RERANK_DOCUMENTS} documents")
    return out


# The documents' texts, whichever way they were sent.
RerankDocuments = Annotated[
    list[str],
    BeforeValidator(
        _documents,
        json_schema_input_type=Annotated[
            list[str | RerankDocument], Field(min_length=1, max_length=MAX_RERANK_DOCUMENTS)
        ],
    ),
]


class RerankRequest(_Model):
    """/v1/rerank, as llama-server, Jina and Cohere take it."""

    model: str | None = None
    ttl: Ttl | None = None
    query: NonEmpty
    documents: RerankDocuments
    top_n: Annotated[int, Field(ge=1, description="the best N only (default: all)")] | None = None
    return_documents: Annotated[
        bool | None, Field(description='each result carries its "document": {"text": ...}')
    ] = None


# -- Ollama ---------------------------------------------------------------------------------


class OllamaFunctionCall(_Model):
    name: str
    # Ollama sends the arguments as an object; JSON text is taken too.
    arguments: Annotated[dict[str, Any] | str, _arguments("an object or a JSON string")] = Field(
        default_factory=dict
    )


class OllamaToolCall(_Model):
    # Ollama's calls carry no id; one given is kept, so a tool result can name its call.
    id: str | None = None
    function: OllamaFunctionCall


class OllamaMessage(_Message):
    ROLE_FIELDS = (
        ("assistant", "tool_calls"),
        ("assistant", "thinking"),
        ("tool", "tool_call_id"),
        ("tool", "tool_name"),
    )
    tool_calls: list[OllamaToolCall] | None = None
    thinking: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None

    def as_chat(self, i: int) -> dict[str, Any]:
        return _history(
            super().as_chat(i), i, self.tool_calls, self.thinking, self.tool_call_id, self.tool_name
        )


# Ollama's options that the server does not apply, and why: each is refused by name.
_LOAD_OPTION = "the model is loaded once, with the server's settings, for every request"
_OLLAMA_NOT_APPLIED = {
    **dict.fromkeys(
        ("numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all"),
        _LOAD_OPTION,
    ),
    **dict.fromkeys(
        ("vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread"), _LOAD_OPTION
    ),
    "num_ctx": "the context per request is the server's --ctx",
    "num_keep": "a full context is an error here, never shifted",
    "repeat_last_n": "the repeat penalty's window is the sampler's own",
    "tfs_z": "no tail-free sampling",
    "typical_p": "no locally typical sampling",
    "mirostat": "no mirostat sampling",
    "mirostat_tau": "no mirostat sampling",
    "mirostat_eta": "no mirostat sampling",
    "penalize_newline": "newlines are penalised like any token",
}


class OllamaOptions(_Model):
    """The options the server honours; Ollama's others are refused by name."""

    model_config = ConfigDict(
        json_schema_extra={
            "description": "not applied, refused: " + ", ".join(sorted(_OLLAMA_NOT_APPLIED))
        }
    )

    @model_validator(mode="before")
    @classmethod
    def _not_applied(cls, data: Any) -> Any:
        for key in data if isinstance(data, dict) else ():
            if key in _OLLAMA_NOT_APPLIED:
                raise _refuse_whole(f"'options.{key}' is not supported: {_OLLAMA_NOT_APPLIED[key]}")
        return data

    num_predict: Annotated[int | None, Field(description="-1 or absent: until done (capped)")] = (
        None
    )
    temperature: OllamaTemperature | None = None
    top_p: OllamaTopP | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: UnitInterval | None = None
    repeat_penalty: RepeatPenalty | None = None
    seed: Seed | None = None
    stop: Stop = ()
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None


def _format(v: Any) -> Any:
    if v is None or v in ("", "json") or isinstance(v, dict):
        return v
    raise _refuse('must be "json" or a JSON schema object')


OllamaFormat = Annotated[
    Literal["json", ""] | dict[str, Any] | None,
    BeforeValidator(_format),
    Field(description='"json", or a JSON schema the reply must match'),
]
Think = Annotated[
    bool | None,
    Field(
        description="false: ask a thinking model not to think; "
        "true: refused for a model that does not think"
    ),
]


class LoadModelRequest(_Model):
    """The optional body of /v1/models/{id}/load."""

    keep_alive: KeepAlive = None
    pinned: Annotated[
        bool | None, Field(description="true: never unloaded when idle or to make room")
    ] = None


class _OllamaModel(_Model):
    model: str
    keep_alive: KeepAlive = None


class _OllamaText(_OllamaModel):
    """What /api/chat and /api/generate share."""

    options: OllamaOptions | None = None
    stream: bool | None = None
    think: Think = None
    format: OllamaFormat = None
    logprobs: Annotated[Literal[False] | None, BeforeValidator(_unsupported_true)] = None
    top_logprobs: Annotated[
        None, BeforeValidator(_no_alternatives, json_schema_input_type=Literal[0] | None)
    ] = None


class OllamaChatRequest(_OllamaText):
    messages: Annotated[list[OllamaMessage], BeforeValidator(_messages), Field(min_length=1)]
    tools: Tools = None

    def chat_messages(self) -> list[dict[str, Any]]:
        return [m.as_chat(i) for i, m in enumerate(self.messages)]

    def chat_tools(self) -> list[dict[str, Any]]:
        return _chat_tools(self.tools)


class OllamaGenerateRequest(_OllamaText):
    prompt: str | None = None
    system: str | None = None
    raw: bool | None = None
    suffix: Annotated[Any, Refused("no text is inserted before a suffix", ("",))] = None
    template: Annotated[Any, Refused("the model's own chat template is used", ("",))] = None
    context: Annotated[Any, Refused("send the conversation to /api/chat", ([],))] = None
    images: Annotated[Any, Refused("this model reads text only", ([],))] = None
    width: Annotated[Any, Refused("this server makes no images")] = None
    height: Annotated[Any, Refused("this server makes no images")] = None
    steps: Annotated[Any, Refused("this server makes no images")] = None


class OllamaShowRequest(_Model):
    # One of the two must be a string (null stands for absent).
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [k], "properties": {k: {"type": "string"}}} for k in ("model", "name")
            ]
        }
    )
    model: str | None = None
    # Read only when `model` is absent, as the route does: the document leaves it untyped, or
    # it would promise to refuse {"model": "m", "name": 5}.
    name: Annotated[
        str | None,
        WithJsonSchema({"description": "the older spelling of 'model', read without one"}),
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _name_without_model(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            return {k: v for k, v in data.items() if k != "name"}
        return data

    @model_validator(mode="after")
    def _named(self) -> OllamaShowRequest:
        if self.model is None and self.name is None:
            raise _refuse_whole("'model' is required")
        return self


class OllamaEmbedRequest(_OllamaModel):
    input: EmbedInput
    truncate: Annotated[
        Any, Refused("an input longer than the model's context is refused, not cut", (False,))
    ] = None
    dimensions: Annotated[Any, Refused("vectors have the model's own length")] = None
    options: Annotated[Any, Refused("embeddings take no options", ({},))] = None


# -- responses (documented in the OpenAPI schema; the routes build them as dicts) -----------


class OpenAIErrorDetail(_Reply):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(_Reply):
    error: OpenAIErrorDetail


class OllamaError(_Reply):
    error: str


class Usage(_Reply):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None
    completion_tokens_details: dict[str, int] | None = None


FinishReason = Literal["stop", "length", "tool_calls"]


class ReplyToolCall(_Reply):
    id: str
    type: Literal["function"]
    function: FunctionCall


class ReplyMessage(_Reply):
    role: str
    content: str | None  # null when the reply is tool calls only
    reasoning_content: str | None = None
    tool_calls: list[ReplyToolCall] | None = None


class ChatChoice(_Reply):
    index: int
    message: ReplyMessage
    finish_reason: FinishReason


class ChatCompletion(_Reply):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: Annotated[list[ChatChoice], Field(min_length=1)]
    usage: Usage


class TextChoice(_Reply):
    index: int
    text: str
    finish_reason: FinishReason


class TextCompletion(_Reply):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: Annotated[list[TextChoice], Field(min_length=1)]
    usage: Usage


class ServerSentEvent(_Reply):
    """One event of a stream: `data` is a JSON chunk, or `[DONE]` at the end."""

    data: str
    event: str | None = None
    id: str | None = None


class ModelCard(_Reply):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    loaded: bool | None = None
    meta: dict[str, Any] | None = None


class ModelList(_Reply):
    object: str
    data: list[ModelCard]


class Embedding(_Reply):
    object: str
    index: int
    embedding: list[float] | str  # base64 of little-endian float32 with encoding_format


class EmbeddingList(_Reply):
    object: str
    data: list[Embedding]
    model: str
    usage: dict[str, int]


class RerankResult(_Reply):
    index: int  # the document's place in the request
    relevance_score: float  # the model's raw score: higher is more relevant
    document: RerankDocument | None = None  # with return_documents


class RerankList(_Reply):
    """Results sorted by score, best first, cut to top_n."""

    model: str
    object: Literal["list"]
    usage: dict[str, int]
    results: list[RerankResult]


class OllamaVersion(_Reply):
    version: str


class OllamaTags(_Reply):
    models: list[dict[str, Any]]


class OllamaRunning(_Reply):
    models: list[dict[str, Any]]


class HostedModelState(_Reply):
    """A model as the host holds it: loaded or not, why it stays, when it goes."""

    id: str
    loaded: bool
    state: str | None = None  # loading | ready
    pinned: bool | None = None
    held_by: str | None = None  # the client that loaded it and keeps it (the app's chat)
    requests_in_flight: int | None = None
    keep_alive_s: float | None = None
    expires_in_s: float | None = None
    memory_bytes: dict[str, int] | None = None


class OllamaShowResponse(_Reply):
    details: dict[str, Any]
    model_info: dict[str, Any]
    template: str | None = None
    modelfile: str | None = None


class OllamaReplyMessage(_Reply):
    role: str | None = None
    content: str | None = None
    thinking: str | None = None
    tool_calls: list[OllamaToolCall] | None = None


class OllamaReply(_Reply):
    """A whole answer, or the last line of a stream (`done: true`)."""

    model: str
    created_at: str
    done: bool
    response: str | None = None
    message: OllamaReplyMessage | None = None
    done_reason: str | None = None
    total_duration: int | None = None
    eval_count: int | None = None
    prompt_eval_count: int | None = None


class OllamaEmbedResponse(_Reply):
    model: str | None = None
    embeddings: list[list[float]]


class Health(_Reply):
    status: str
    error: str | None = None
    models: list[dict[str, Any]] | None = None
    loading: list[str] | None = None
    model: str | None = None
    slots_total: int | None = None
    slots_busy: int | None = None
    queue_depth: int | None = None
    settings: dict[str, Any] | None = None


# -- checking a body ------------------------------------------------------------------------


def parse_body(model: type[T], body: dict[str, Any]) -> T:
    """`body` as `model`; the first problem found is a 400 naming its top-level field."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        errs = e.errors(include_url=False)
        # An unknown key inside a union's member says more than the other members' errors.
        err = next(
            (
                x
                for x in errs
                if x["type"] == "extra_forbidden" and x["loc"][:1] == errs[0]["loc"][:1]
            ),
            errs[0],
        )
        loc = err["loc"]
        raise ApiError(400, _message(err), param=str(loc[0]) if loc else None) from None


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, str) and not re.fullmatch(r"\w+", part):
            continue  # a union member's name ("list[TextPart]"), not a key
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(err: ErrorDetails) -> str:
    """One line in the hand checks' style: "'<field>' must be ..."."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "candlewick_whole":
        return err["msg"]
    loc = err["loc"]
    where = f"'{_path(loc)}'" if loc else "the body"
    if kind == "candlewick":
        return f"{where} {err['msg']}"
    if err["input"] is None and kind.endswith("_type"):
        return f"{where} is required"  # null stands for absent, and this field must be there
    text = {
        "missing": "is required",
        "string_type": "must be a string",
        "bool_type": "must be true or false",
        "int_type": "must be a whole number",
        "float_type": "must be a number",
        "finite_number": "must be a number",
        "list_type": "must be a list",
        "dict_type": "must be an object",
        "model_type": "must be an object",
        "model_attributes_type": "must be an object",
        "extra_forbidden": UNKNOWN,
    }.get(kind)
    if text is None:
        text = _bounds(kind, ctx) or re.sub(r"^Input should", "should", err["msg"].split("\n")[0])
    return f"{where} {text}"


def _bounds(kind: str, ctx: dict[str, Any]) -> str | None:
    if kind == "greater_than_equal":
        return f"must be at least {_fmt(ctx['ge'])}"
    if kind == "less_than_equal":
        return f"must be at most {_fmt(ctx['le'])}"
    if kind == "greater_than":
        return f"must be greater than {_fmt(ctx['gt'])}"
    if kind == "less_than":
        return f"must be less than {_fmt(ctx['lt'])}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}"
    if kind == "string_pattern_mismatch":
        return _PATTERN_TEXT.get(ctx["pattern"], f"must match {ctx['pattern']}")
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "too_short":
        return (
            "must not be empty"
            if ctx.get("min_length") == 1
            else (f"takes at least {ctx.get('min_length')} items")
        )
    if kind == "too_long":
        return f"takes at most {ctx.get('max_length')} items"
    return None
