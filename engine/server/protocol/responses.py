"""OpenAI's Responses API (/v1/responses, spoken by Codex-style clients): the request body
and the response object."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, Tag, ValidationInfo, field_validator, model_validator

from engine.host.logprobs import MAX_TOP_LOGPROBS
from engine.server.body_model import Body, NotHonoured, refuse, refuse_whole
from engine.server.protocol.agent import (
    Harmless,
    PositiveInt,
    Temperature2,
    TopP,
    by_type,
    choice_in_tools,
    tools_of,
)
from engine.server.protocol.base import (
    EFFORT_TEXT,
    MAX_TOOLS,
    TOOL_NAME,
    ContextPolicyField,
    ReasoningEffort,
    Reply,
)
from engine.server.protocol.logprobs import LogprobEntry
from engine.server.protocol.media import MediaPart, ResponsesImagePart, media_text


class ResponsesTextPart(Body):
    type: Literal["input_text", "output_text"]
    text: str


class ResponsesRefusalPart(Body):
    type: Literal["refusal"]
    refusal: str


ResponsesPart = Annotated[
    Annotated[ResponsesTextPart, Tag("type=text")]
    | Annotated[ResponsesRefusalPart, Tag("type=refusal")]
    | Annotated[ResponsesImagePart, Tag("type=image")],
    by_type(
        {
            "input_text": "type=text",
            "output_text": "type=text",
            "refusal": "type=refusal",
            "input_image": "type=image",
        }
    ),
]
_NOT_READ = {
    "input_file": "files are not read here; send their text",
    "input_audio": "audio is read on /v1/chat/completions (input_audio parts), not here",
}


def _parts(images: bool) -> Any:
    def check(v: Any) -> Any:
        for p in v if isinstance(v, list) else ():
            kind = p.get("type") if isinstance(p, dict) else None
            if not isinstance(kind, str):
                continue  # the part's own model says what its type must be
            if kind in _NOT_READ:
                why = _NOT_READ[kind]
                raise refuse(f"has a part of type '{kind}', which is not supported: {why}")
            if kind == "input_image" and not images:
                raise refuse(
                    "has an image, which a function call's output cannot hold here: send it "
                    "in a user message"
                )
        return v

    return BeforeValidator(check)


ResponsesContent = Annotated[str | list[ResponsesPart], _parts(images=True)]
ResponsesOutput = Annotated[str | list[ResponsesPart], _parts(images=False)]
Parts = str | list[ResponsesTextPart | ResponsesRefusalPart | ResponsesImagePart]


def parts_text(content: Parts) -> str:
    """The parts as one string, each image as its marker."""
    if isinstance(content, str):
        return content
    return "".join(
        p.text
        if isinstance(p, ResponsesTextPart)
        else p.refusal
        if isinstance(p, ResponsesRefusalPart)
        else media_text()
        for p in content
    )


def parts_media(content: Parts, where: str) -> list[MediaPart]:
    """The images of the parts, in the order of their markers in `parts_text`."""
    if isinstance(content, str):
        return []
    return [
        p.media(f"{where}[{j}]") for j, p in enumerate(content) if isinstance(p, ResponsesImagePart)
    ]


class ResponsesMessageItem(Body):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: ResponsesContent


class ResponsesFunctionCallItem(Body):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: str
    arguments: str


class ResponsesFunctionCallOutputItem(Body):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: ResponsesOutput


class ResponsesSummaryText(Body):
    type: Literal["summary_text"]
    text: str


class ResponsesReasoningText(Body):
    type: Literal["reasoning_text"]
    text: str


class ResponsesReasoningItem(Body):
    type: Literal["reasoning"]
    summary: list[ResponsesSummaryText] = Field(default_factory=list)
    content: list[ResponsesReasoningText] | None = None
    encrypted_content: Annotated[
        Any,
        NotHonoured(
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
    by_type({k: f"type={k}" for k in _ITEM_TYPES}, default="message"),
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
            raise refuse_whole(
                f"'input[{i}]': items of type '{kind}' are not supported "
                f"({why}); it takes {', '.join(_ITEM_TYPES)}",
            )
    return v


ResponsesInput = Annotated[str | list[ResponsesItem], BeforeValidator(_items)]


class ResponsesFunctionTool(Body):
    type: Literal["function"]
    name: Annotated[str, Field(pattern=TOOL_NAME, description="1-64 letters, digits, _ . -")]
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema object")
    strict: bool | None = None


_responses_tools = tools_of(
    "function",
    "'tools[{i}]': tools of type '{kind}' are not supported (this server runs no "
    "built-in tools); only function tools",
)


class ResponsesNamedChoice(Body):
    type: Literal["function"]
    name: str


class ResponsesTextFormat(Body):
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
            raise refuse_whole("'text.format' of type json_schema needs a 'schema'")
        return self


class ResponsesText(Body):
    format: ResponsesTextFormat | None = None
    verbosity: Annotated[Any, NotHonoured("the answer's length is the model's")] = None


class ResponsesReasoning(Body):
    effort: Annotated[ReasoningEffort | None, Field(description=EFFORT_TEXT)] = None
    summary: Annotated[
        Any,
        NotHonoured(
            "the thinking is not summarised; it comes whole, as the reasoning item's content"
        ),
    ] = None
    generate_summary: Annotated[Any, NotHonoured("the thinking is not summarised")] = None


class ResponsesStreamOptions(Body):
    include_obfuscation: Annotated[Any, NotHonoured("stream deltas are not padded", (False,))] = (
        None
    )


def _truncation(v: Any) -> Any:
    if v == "auto":
        raise refuse(
            "cannot be 'auto': input is never dropped to fit; a prompt too long for a slot is a 400"
        )
    return v


# The one extra output kept: the message text's log probabilities.
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _include(v: Any) -> Any:
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise refuse("must be a list of strings")
    for x in v:
        if x != LOGPROBS_INCLUDE:
            raise refuse(
                f"'{x}' is not supported: no extra output data is kept but '{LOGPROBS_INCLUDE}'"
            )
    return v


class ResponsesRequest(Body):
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
    context_policy: ContextPolicyField = None
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
        Any, NotHonoured("the answer comes in the reply to this request", (False,))
    ] = None
    include: Annotated[
        list[str] | None,
        BeforeValidator(_include, json_schema_input_type=list[str] | None),
        Field(
            description=f'["{LOGPROBS_INCLUDE}"] gives the output text\'s log probabilities; '
            "no other extra output data is kept (encrypted reasoning, ...)"
        ),
    ] = None
    top_logprobs: (
        Annotated[
            int,
            Field(
                ge=0,
                le=MAX_TOP_LOGPROBS,
                description="the output text's log probabilities with this many of the most "
                "likely tokens at each (as the include does with none)",
            ),
        ]
        | None
    ) = None
    conversation: Annotated[
        Any,
        NotHonoured(
            "conversations are not kept; use previous_response_id or send the whole conversation"
        ),
    ] = None
    prompt: Annotated[
        Any, NotHonoured("stored prompt templates are not kept; send 'instructions' and 'input'")
    ] = None
    context_management: Annotated[Any, NotHonoured("the context is not compacted")] = None

    @field_validator("tool_choice")
    @classmethod
    def _choice_needs_tools(cls, v: Any, info: ValidationInfo) -> Any:
        if "tools" in info.data:  # else the tools were refused already
            choice_in_tools(
                None if v in (None, "none") else v,
                v.name if isinstance(v, ResponsesNamedChoice) else None,
                info.data["tools"],
            )
        return v

    def asked_logprobs(self) -> int | None:
        """The output text's log probabilities: None, or how many alternatives per token."""
        if self.top_logprobs or LOGPROBS_INCLUDE in (self.include or ()):
            return self.top_logprobs or 0
        return None


# -- the response ---------------------------------------------------------------------------


class ResponsesOutputText(Reply):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[LogprobEntry] | None = None  # asked for: the text's tokens


class ResponsesOutputMessage(Reply):
    type: Literal["message"]
    id: str
    role: Literal["assistant"]
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[ResponsesOutputText]


class ResponsesOutputFunctionCall(Reply):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ResponsesOutputReasoning(Reply):
    type: Literal["reasoning"]
    id: str
    summary: list[ResponsesSummaryText]
    content: list[ResponsesReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = Annotated[
    ResponsesOutputMessage | ResponsesOutputFunctionCall | ResponsesOutputReasoning,
    Field(discriminator="type"),
]
OutputPart = Annotated[ResponsesOutputText | ResponsesReasoningText, Field(discriminator="type")]


class ResponsesUsage(Reply):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class ResponsesError(Reply):
    code: str
    message: str


class ResponsesTextSettings(Reply):
    format: dict[str, Any]  # the request's text.format, or {"type": "text"}


class ResponsesReasoningSettings(Reply):
    effort: str | None
    summary: None  # the thinking is not summarised


class ResponseObject(Reply):
    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: ResponsesError | None
    incomplete_details: dict[str, str] | None
    model: str
    output: list[OutputItem]
    usage: ResponsesUsage | None
    instructions: str | None
    previous_response_id: str | None
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    temperature: float
    top_p: float
    max_output_tokens: int | None
    text: ResponsesTextSettings
    reasoning: ResponsesReasoningSettings
    truncation: Literal["disabled"]
    store: bool
    background: Literal[False]
    metadata: dict[str, str]
    user: str | None
    completed_at: int | None = None  # once it is complete


# -- the stream's events (each sent as `event: <type>`, numbered by `sequence_number`) -------


class ResponsesStateEvent(Reply):
    type: Literal[
        "response.created",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    ]
    sequence_number: int
    response: ResponseObject


class ResponsesItemEvent(Reply):
    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int
    item: OutputItem


class ResponsesPartEvent(Reply):
    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputPart


class ResponsesTextDelta(Reply):
    type: Literal["response.output_text.delta", "response.reasoning_text.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[LogprobEntry] | None = None  # output text only: its tokens, when asked for


class ResponsesTextDone(Reply):
    type: Literal["response.output_text.done", "response.reasoning_text.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[LogprobEntry] | None = None  # output text only: its tokens, when asked for


class ResponsesArgumentsDelta(Reply):
    type: Literal["response.function_call_arguments.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ResponsesArgumentsDone(Reply):
    type: Literal["response.function_call_arguments.done"]
    sequence_number: int
    item_id: str
    output_index: int
    name: str
    arguments: str


class ResponsesErrorEvent(Reply):
    type: Literal["error"]
    sequence_number: int
    code: str
    message: str
    param: None
