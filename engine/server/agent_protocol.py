"""Request and response shapes of OpenAI's Responses API and Anthropic's Messages API, as
pydantic models (the agent tools' APIs: Codex-style clients speak the first, Claude-Code-style
clients the second).

As on the other routes, a key a model does not declare is refused by name, but for the few
harmless ones official clients send (`body_model.IGNORED`), and values are strict (true is not
a number, "1" is not 1). Fields of these APIs
that the server cannot honour are declared here and refused by name when they ask for
something (`background: true`, images, a thinking budget); the harmless ones (`metadata`,
`user`, cache hints) are accepted. `parse_request` turns the first problem into a 400 naming
its top-level field. `openapi.py` documents the routes from the same models; a custom check's
schema is never narrower than what it lets through (the fuzz test sends schema-invalid bodies
and expects them refused).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from engine.server.body_model import UNKNOWN, Body, NotHonoured
from engine.server.errors import ApiError

T = TypeVar("T", bound=BaseModel)

MAX_TOOLS = 128
MAX_STOP = 16
_OPENAI_NAME = r"^[A-Za-z0-9_.-]{1,64}$"
_ANTHROPIC_NAME = r"^[A-Za-z0-9_.-]{1,128}$"  # Anthropic allows 128 (MCP tools' long names)
_TEXT_ONLY = "cannot be read: this model reads text only"


class _Model(Body):
    """A request body or a part of one: a key it does not declare is refused (body_model)."""


class _Reply(BaseModel):
    """An answer's shape, for the document: clients take keys they do not know."""

    model_config = ConfigDict(extra="ignore", strict=True, protected_namespaces=())


def _refuse(message: str) -> PydanticCustomError:
    """An error read as "'<field path>' <message>"."""
    return PydanticCustomError("agent", message)


class Refuse(NotHonoured):
    """A field of the agent APIs (Responses, Messages) that the server cannot honour."""

    error_type = "agent"
    keeps_allowed = True


_FINITE = Field(allow_inf_nan=False)
Temperature2 = Annotated[float, _FINITE, Field(ge=0, le=2)]
Temperature1 = Annotated[float, _FINITE, Field(ge=0, le=1)]
TopP = Annotated[float, _FINITE, Field(gt=0, le=1)]
PositiveInt = Annotated[int, Field(ge=1)]
Harmless = Annotated[str | None, Field(description="accepted; no effect on the answer")]
# Prompt-cache markers: every slot reuses the longest cached prefix of a prompt by itself.
CacheControl = Annotated[
    dict[str, Any] | None, Field(description="accepted: prompt prefixes are cached automatically")
]


def _unique_tools(names: list[str]) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise _refuse(f"names the tool '{n}' twice")
        seen.add(n)


# -- OpenAI Responses: input items --------------------------------------------------------


class ResponsesTextPart(_Model):
    type: Literal["input_text", "output_text"]
    text: str


class ResponsesRefusalPart(_Model):
    type: Literal["refusal"]
    refusal: str


def _by_type(tags: dict[str, str], default: str | None = None) -> Discriminator:
    """A union chosen by the `type` key. Its tags (which pydantic puts in an error's path)
    are written "type=..." so that `_message` can leave them out."""

    def tag(v: Any) -> str | None:
        kind = v.get("type", default) if isinstance(v, dict) else getattr(v, "type", None)
        return tags.get(kind) if isinstance(kind, str) else None

    return Discriminator(
        tag,
        custom_error_type="agent",
        custom_error_message=f"must have a 'type' of {', '.join(tags)}",
    )


ResponsesPart = Annotated[
    Annotated[ResponsesTextPart, Tag("type=text")]
    | Annotated[ResponsesRefusalPart, Tag("type=refusal")],
    _by_type({"input_text": "type=text", "output_text": "type=text", "refusal": "type=refusal"}),
]


def _text_parts(v: Any) -> Any:
    if isinstance(v, list):
        for p in v:
            if isinstance(p, dict) and p.get("type") in (
                "input_image",
                "input_file",
                "input_audio",
            ):
                raise _refuse(f"{_TEXT_ONLY} (a part of type '{p['type']}')")
    return v


ResponsesContent = Annotated[str | list[ResponsesPart], BeforeValidator(_text_parts)]


def parts_text(content: str | list[ResponsesTextPart | ResponsesRefusalPart]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.text if isinstance(p, ResponsesTextPart) else p.refusal for p in content)


class ResponsesMessageItem(_Model):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: ResponsesContent


class ResponsesFunctionCallItem(_Model):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: str
    arguments: str


class ResponsesFunctionCallOutputItem(_Model):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: ResponsesContent


class ResponsesSummaryText(_Model):
    type: Literal["summary_text"]
    text: str


class ResponsesReasoningText(_Model):
    type: Literal["reasoning_text"]
    text: str


class ResponsesReasoningItem(_Model):
    type: Literal["reasoning"]
    summary: list[ResponsesSummaryText] = Field(default_factory=list)
    content: list[ResponsesReasoningText] | None = None
    encrypted_content: Annotated[
        Any,
        Refuse(
            "encrypted reasoning cannot be read here; send "
            "the reasoning item as this server returned it"
        ),
    ] = None

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.content or self.summary)


_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
ResponsesItem = Annotated[
    Annotated[ResponsesMessageItem, Tag("type=message")]
    | Annotated[ResponsesFunctionCallItem, Tag("type=function_call")]
    | Annotated[ResponsesFunctionCallOutputItem, Tag("type=function_call_output")]
    | Annotated[ResponsesReasoningItem, Tag("type=reasoning")],
    _by_type({k: f"type={k}" for k in _ITEM_TYPES}, default="message"),
]


def _items(v: Any) -> Any:
    """Items of the types this server cannot read are refused saying why. (An item without a
    `type` is a message, its short form.)"""
    for i, item in enumerate(v if isinstance(v, list) else ()):
        kind = item.get("type") if isinstance(item, dict) else None
        if isinstance(kind, str) and kind not in _ITEM_TYPES:
            why = (
                "items are not kept by id here; send the item itself"
                if kind == "item_reference"
                else "this server runs no built-in tools"
            )
            raise PydanticCustomError(
                "agent_whole",
                f"'input[{i}]': items of type '{kind}' are not supported "
                f"({why}); it takes {', '.join(_ITEM_TYPES)}",
            )
    return v


ResponsesInput = Annotated[str | list[ResponsesItem], BeforeValidator(_items)]


# -- OpenAI Responses: tools, formats, the request ----------------------------------------


class ResponsesFunctionTool(_Model):
    type: Literal["function"]
    name: Annotated[str, Field(pattern=_OPENAI_NAME, description="1-64 letters, digits, _ . -")]
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema object")
    strict: bool | None = None


def _tools_of(kind_taken: str, refusal: str) -> Callable[[Any], Any]:
    """A check of a tools list: each of type `kind_taken` (or none given), names unique.
    `refusal` says why another type is refused, with {i} and {kind} to fill."""

    def check(v: Any) -> Any:
        if isinstance(v, list):
            for i, t in enumerate(v):
                kind = t.get("type") if isinstance(t, dict) else None
                if isinstance(kind, str) and kind != kind_taken:
                    raise PydanticCustomError("agent_whole", refusal.format(i=i, kind=kind))
            _unique_tools(
                [t["name"] for t in v if isinstance(t, dict) and isinstance(t.get("name"), str)]
            )
        return v

    return check


_responses_tools = _tools_of(
    "function",
    "'tools[{i}]': tools of type '{kind}' are not supported (this server runs no "
    "built-in tools); only function tools",
)


class ResponsesNamedChoice(_Model):
    type: Literal["function"]
    name: str


class ResponsesTextFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(
        None, alias="schema", description="with type json_schema"
    )
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponsesTextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise PydanticCustomError(
                "agent_whole", "'text.format' of type json_schema needs a 'schema'"
            )
        return self


class ResponsesText(_Model):
    format: ResponsesTextFormat | None = None
    verbosity: Annotated[Any, Refuse("the answer's length is the model's")] = None


def _effort(v: Any) -> Any:
    if isinstance(v, str) and v not in ("none", "minimal"):
        raise _refuse(
            "cannot be set here beyond 'none' or 'minimal' (the model is asked not "
            "to think); leave 'reasoning' out for the model's own thinking"
        )
    return v


class ResponsesReasoning(_Model):
    effort: Annotated[
        Literal["none", "minimal"] | None,
        BeforeValidator(_effort, json_schema_input_type=Literal["none", "minimal"] | None),
    ] = None
    summary: Annotated[
        Any,
        Refuse("the thinking is not summarised; it comes whole, as the reasoning item's content"),
    ] = None
    generate_summary: Annotated[Any, Refuse("the thinking is not summarised")] = None


class ResponsesStreamOptions(_Model):
    include_obfuscation: Annotated[Any, Refuse("stream deltas are not padded", (False,))] = None


def _truncation(v: Any) -> Any:
    if v == "auto":
        raise _refuse(
            "cannot be 'auto': input is never dropped to fit; a prompt too long for a slot is a 400"
        )
    return v


def _choice_in_tools(choice: Any, name: str | None, tools: list[Any] | None) -> None:
    names = {t.name for t in tools or []}
    if choice is not None and not names:
        raise PydanticCustomError("agent_whole", "'tool_choice' needs 'tools'")
    if name is not None and name not in names:
        raise PydanticCustomError(
            "agent_whole", f"'tool_choice' names '{name}', which is not in 'tools'"
        )


class ResponsesRequest(_Model):
    model: str | None = None
    input: ResponsesInput
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: Annotated[
        Annotated[list[ResponsesFunctionTool], Field(max_length=MAX_TOOLS)] | None,
        BeforeValidator(_responses_tools),
    ] = None
    tool_choice: Literal["auto", "none", "required"] | ResponsesNamedChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: Annotated[
        PositiveInt | None, Field(description="capped at the server's limit")
    ] = None
    temperature: Temperature2 | None = None
    top_p: TopP | None = None
    text: ResponsesText | None = None
    reasoning: ResponsesReasoning | None = None
    stream: bool | None = None
    stream_options: ResponsesStreamOptions | None = None
    store: bool | None = Field(None, description="false: not kept for previous_response_id")
    metadata: dict[str, str] | None = None
    user: Harmless = None
    safety_identifier: Harmless = None
    prompt_cache_key: Harmless = None
    service_tier: Literal["auto", "default"] | None = None
    max_tool_calls: Annotated[
        PositiveInt | None,
        Field(description="limits built-in tools, of which this server has none"),
    ] = None
    truncation: Annotated[
        Literal["disabled"] | None,
        BeforeValidator(_truncation, json_schema_input_type=Literal["disabled"] | None),
    ] = None
    background: Annotated[
        Any, Refuse("the answer comes in the reply to this request", (False,))
    ] = None
    include: Annotated[
        Any, Refuse("no extra output data is kept (encrypted reasoning, logprobs, ...)", ([],))
    ] = None
    top_logprobs: Annotated[Any, Refuse("log probabilities are not returned", (0,))] = None
    conversation: Annotated[
        Any,
        Refuse(
            "conversations are not kept; use previous_response_id or send the whole conversation"
        ),
    ] = None
    prompt: Annotated[
        Any, Refuse("stored prompt templates are not kept; send 'instructions' and 'input'")
    ] = None
    context_management: Annotated[Any, Refuse("the context is not compacted")] = None

    @field_validator("tool_choice")
    @classmethod
    def _choice_needs_tools(cls, v: Any, info: ValidationInfo) -> Any:
        if "tools" in info.data:  # else the tools were refused already
            _choice_in_tools(
                None if v in (None, "none") else v,
                v.name if isinstance(v, ResponsesNamedChoice) else None,
                info.data["tools"],
            )
        return v


# -- OpenAI Responses: the response (documented; the route builds it as a dict) -----------


class ResponsesOutputText(_Reply):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]


class ResponsesOutputMessage(_Reply):
    type: Literal["message"]
    id: str
    role: Literal["assistant"]
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[ResponsesOutputText]


class ResponsesOutputFunctionCall(_Reply):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ResponsesOutputReasoning(_Reply):
    type: Literal["reasoning"]
    id: str
    summary: list[ResponsesSummaryText]
    content: list[ResponsesReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]


class ResponsesUsage(_Reply):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class ResponsesError(_Reply):
    code: str
    message: str


class ResponseObject(_Reply):
    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: ResponsesError | None
    incomplete_details: dict[str, str] | None
    model: str
    output: list[
        Annotated[
            ResponsesOutputMessage | ResponsesOutputFunctionCall | ResponsesOutputReasoning,
            Field(discriminator="type"),
        ]
    ]
    usage: ResponsesUsage | None
    instructions: str | None
    previous_response_id: str | None
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    temperature: float
    top_p: float
    max_output_tokens: int | None
    store: bool
    metadata: dict[str, str]


# -- Anthropic Messages ---------------------------------------------------------------------


class AnthropicTextBlock(_Model):
    type: Literal["text"]
    text: str
    cache_control: CacheControl = None


class AnthropicToolUseBlock(_Model):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: str
    input: dict[str, Any]
    cache_control: CacheControl = None


class AnthropicToolResultBlock(_Model):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: str | list[AnthropicTextBlock] | None = None
    is_error: bool | None = Field(None, description="true: the result is shown as an error")
    cache_control: CacheControl = None

    @property
    def text(self) -> str:
        c = self.content
        return c if isinstance(c, str) else "\n".join(b.text for b in c or ())


class AnthropicThinkingBlock(_Model):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


_BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking")
AnthropicBlock = Annotated[
    Annotated[AnthropicTextBlock, Tag("type=text")]
    | Annotated[AnthropicToolUseBlock, Tag("type=tool_use")]
    | Annotated[AnthropicToolResultBlock, Tag("type=tool_result")]
    | Annotated[AnthropicThinkingBlock, Tag("type=thinking")],
    _by_type({k: f"type={k}" for k in _BLOCK_TYPES}),
]
_BLOCK_WHY = {
    "image": _TEXT_ONLY,
    "document": _TEXT_ONLY,
    "redacted_thinking": "cannot be read: its thinking is encrypted",
    "search_result": "search results are not read here; send them as text",
}


def _blocks(v: Any) -> Any:
    """Blocks of an unsupported type are refused saying why (images: text-only models)."""
    blocks = v if isinstance(v, list) else []
    for b in blocks:
        inner = b.get("content") if isinstance(b, dict) and b.get("type") == "tool_result" else None
        for x in [b, *(inner if isinstance(inner, list) else [])]:
            kind = x.get("type") if isinstance(x, dict) else None
            if isinstance(kind, str) and kind not in _BLOCK_TYPES:
                raise _refuse(
                    f"has a block of type '{kind}', which "
                    + _BLOCK_WHY.get(kind, "is not supported here (no server tools)")
                )
    return v


class AnthropicMessage(_Model):
    role: Literal["user", "assistant"]
    content: Annotated[str | list[AnthropicBlock], BeforeValidator(_blocks)]


class AnthropicTool(_Model):
    type: Literal["custom"] | None = None
    name: Annotated[str, Field(pattern=_ANTHROPIC_NAME, description="1-128 letters, digits, _ . -")]
    description: str | None = None
    input_schema: dict[str, Any] = Field(description="a JSON schema object")
    strict: bool | None = None
    cache_control: CacheControl = None


_anthropic_tools = _tools_of(
    "custom",
    "'tools[{i}]': the server tool '{kind}' is not available here; only custom "
    "tools (name, description, input_schema)",
)


class AnthropicToolChoice(_Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, description="with type tool")
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> AnthropicToolChoice:
        if self.type == "tool" and self.name is None:
            raise PydanticCustomError("agent_whole", "'tool_choice' of type tool needs a 'name'")
        return self


def _thinking_type(v: Any) -> Any:
    if v == "enabled":
        raise _refuse(
            "cannot be 'enabled': a thinking budget cannot be enforced here; use "
            "'adaptive' (the model thinks as it would) or 'disabled'"
        )
    return v


class AnthropicThinking(_Model):
    type: Annotated[
        Literal["adaptive", "disabled"],
        BeforeValidator(_thinking_type, json_schema_input_type=Literal["adaptive", "disabled"]),
    ]
    display: Annotated[Any, Refuse("the thinking comes whole, as thinking blocks")] = None


class AnthropicJsonFormat(_Model):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class AnthropicOutputConfig(_Model):
    format: AnthropicJsonFormat | None = None
    effort: Annotated[Any, Refuse("how hard the model works is not adjustable")] = None


class AnthropicMetadata(_Model):
    user_id: Harmless = None


def _system(v: Any) -> Any:
    if isinstance(v, list):
        for b in v:
            if isinstance(b, dict) and b.get("type") != "text":
                raise _refuse("takes only text blocks")
    return v


class AnthropicCountTokensRequest(_Model):
    """What a prompt is made of: /v1/messages/count_tokens takes this much."""

    model: str | None = None
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: Annotated[str | list[AnthropicTextBlock] | None, BeforeValidator(_system)] = None
    tools: Annotated[
        Annotated[list[AnthropicTool], Field(max_length=MAX_TOOLS)] | None,
        BeforeValidator(_anthropic_tools),
    ] = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: AnthropicThinking | None = None
    output_config: AnthropicOutputConfig | None = None
    mcp_servers: Annotated[Any, Refuse("this server connects to no MCP servers", ([],))] = None
    context_management: Annotated[Any, Refuse("the context is not edited")] = None
    container: Annotated[Any, Refuse("this server runs no code containers")] = None

    @field_validator("tool_choice")
    @classmethod
    def _choice_needs_tools(
        cls, v: AnthropicToolChoice | None, info: ValidationInfo
    ) -> AnthropicToolChoice | None:
        if v is not None and "tools" in info.data:
            _choice_in_tools(
                None if v.type == "none" else v,
                v.name if v.type == "tool" else None,
                info.data["tools"],
            )
        return v


class AnthropicMessagesRequest(AnthropicCountTokensRequest):
    max_tokens: Annotated[int, Field(ge=1, description="capped at the server's limit")]
    stop_sequences: (
        Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP)] | None
    ) = None
    stream: bool | None = None
    temperature: Temperature1 | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: AnthropicMetadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    cache_control: CacheControl = None


class AnthropicUsage(_Reply):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class AnthropicReplyThinking(_Reply):
    type: Literal["thinking"]
    thinking: str
    signature: str


class AnthropicReplyToolUse(_Reply):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class AnthropicReplyText(_Reply):
    type: Literal["text"]
    text: str


class AnthropicReply(_Reply):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[
        Annotated[
            AnthropicReplyText | AnthropicReplyThinking | AnthropicReplyToolUse,
            Field(discriminator="type"),
        ]
    ]
    stop_reason: Literal[
        "end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"
    ]
    stop_sequence: str | None
    usage: AnthropicUsage


class AnthropicTokenCount(_Reply):
    input_tokens: int


class AnthropicErrorDetail(_Reply):
    type: str
    message: str


class AnthropicError(_Reply):
    type: Literal["error"]
    error: AnthropicErrorDetail


# -- checking a body ------------------------------------------------------------------------


def parse_request(model: type[T], body: dict[str, Any]) -> T:
    """`body` as `model`; the first problem is a 400 naming its top-level field. Of a union's
    several errors, the one deepest in the body says most (the member the value was meant
    for); wrong types at one place are named together ("must be a string or a list")."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        found = e.errors(include_url=False)
        errs = [x for x in found if x["loc"][:1] == found[0]["loc"][:1]]
        err = max(errs, key=lambda x: len(_where(x)))
        top = err["loc"][:1]
        message = _message(err)
        kinds = dict.fromkeys(
            _TYPES[x["type"]] for x in errs if _where(x) == _where(err) and x["type"] in _TYPES
        )
        if len(kinds) > 1 and err["input"] is not None:
            message = f"{_quoted(err)} must be {' or '.join(kinds)}"
        raise ApiError(400, message, param=str(top[0]) if top else None) from None


def _fmt(x: Any) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


# A union's members add their names to an error's path ("str", "list[...]", "type=text"):
# only field names and indexes are kept.
_MEMBERS = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


def _where(err: ErrorDetails) -> tuple[int | str, ...]:
    return tuple(
        p
        for p in err["loc"]
        if isinstance(p, int) or (re.fullmatch(r"\w+", p) and p not in _MEMBERS)
    )


def _quoted(err: ErrorDetails) -> str:
    out = ""
    for part in _where(err):
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return f"'{out}'" if out else "the body"


_TYPES = {
    "string_type": "a string",
    "bool_type": "true or false",
    "int_type": "a whole number",
    "float_type": "a number",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def _message(err: ErrorDetails) -> str:
    kind, ctx, where = err["type"], err.get("ctx") or {}, _quoted(err)
    if kind == "agent_whole":
        return err["msg"]
    if kind == "agent":
        return f"{where} {err['msg']}"
    if err["input"] is None and kind in _TYPES:
        return f"{where} is required"  # null stands for absent
    texts = {
        "missing": "is required",
        "finite_number": "must be a number",
        "too_short": "must not be empty",
        "string_too_short": "must not be empty",
        "greater_than_equal": f"must be at least {_fmt(ctx.get('ge'))}",
        "less_than_equal": f"must be at most {_fmt(ctx.get('le'))}",
        "greater_than": f"must be greater than {_fmt(ctx.get('gt'))}",
        "too_long": f"takes at most {ctx.get('max_length')} items",
        "string_pattern_mismatch": f"must match {ctx.get('pattern')}",
        "literal_error": f"must be one of {ctx.get('expected')}",
        "extra_forbidden": UNKNOWN,
    }
    text = (
        f"must be {_TYPES[kind]}"
        if kind in _TYPES
        else texts.get(kind) or re.sub(r"^Input should", "should", err["msg"].split("\n")[0])
    )
    return f"{where} {text}"
