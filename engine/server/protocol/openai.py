"""OpenAI's /v1/chat/completions and /v1/completions: the request bodies and the answers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from engine.decoding.tool_calls import ToolChoice
from engine.server.body_model import Body, NotHonoured, refuse, refuse_whole
from engine.server.protocol.base import (
    EFFORT_TEXT,
    ContextPolicyField,
    NonEmpty,
    Penalty,
    ReasoningEffort,
    RepeatPenalty,
    Reply,
    Seed,
    Stop,
    Temperature,
    TopP,
    Ttl,
    UnitInterval,
    no_alternatives,
)
from engine.server.protocol.llama import (
    LlamaChatFields,
    PromptProgress,
    ReasoningBudgetFields,
    TemplateKwargsField,
    Timings,
)
from engine.server.protocol.logprobs import (
    ChatLogprobs,
    LegacyLogprobs,
    LogprobsFlag,
    TextLogprobs,
    TopLogprobsField,
    alternatives_need_logprobs,
    asked,
)
from engine.server.protocol.lora import LoraField
from engine.server.protocol.media import MediaPart
from engine.server.protocol.messages import (
    Message,
    Tools,
    call_arguments,
    check_messages,
    tools_as_chat,
    with_history,
)


class FunctionCall(Body):
    name: str
    # OpenAI sends the arguments as JSON text; an object is taken too.
    arguments: Annotated[str | dict[str, Any], call_arguments("a JSON string or an object")] = "{}"


class ToolCall(Body):
    id: str | None = None  # the routes number calls that come without one
    type: Literal["function"] = "function"
    function: FunctionCall


def _no_images(v: Any) -> Any:
    if v:
        raise refuse(
            "is Ollama's field, not this API's: send images as image_url content parts "
            '({"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}})'
        )
    return v


class ChatMessage(Message):
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
    # Only an empty list passes: Ollama's field is refused by name rather than ignored.
    images: Annotated[
        Annotated[list[str], Field(max_length=0)] | None,
        BeforeValidator(_no_images),
        Field(description="refused: Ollama's field; send image_url content parts"),
    ] = None
    refusal: Annotated[Any, NotHonoured("send a refusal as the content")] = None
    audio: Annotated[
        Any, NotHonoured("an earlier answer's audio: send audio as input_audio content parts")
    ] = None
    function_call: Annotated[Any, NotHonoured("the deprecated function call; send tool_calls")] = (
        None
    )

    def as_chat(self, i: int) -> dict[str, Any]:
        return with_history(
            super().as_chat(i),
            i,
            self.tool_calls,
            self.reasoning_content,
            self.tool_call_id,
            self.name,
        )


class StreamOptions(Body):
    include_usage: bool | None = None


class NamedFunction(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"]
    function: NamedFunction


def _schema_value(v: Any) -> Any:
    # Checked before the union, whose errors would name its branches in their path.
    if isinstance(v, dict | bool):
        return v
    raise refuse("must be a JSON schema (an object)")


class JsonSchemaFormat(Body):
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


class ResponseFormat(Body):
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
            raise refuse_whole("'response_format.json_schema' must be an object with a 'schema'")
        return self


def _n(v: Any) -> Any:
    if v is None:
        return 1
    if not isinstance(v, int) or isinstance(v, bool):
        raise refuse("must be a whole number")
    if v != 1:
        raise refuse_whole("only n=1 is supported")
    return v


class _Messages(Body):
    messages: Annotated[list[ChatMessage], BeforeValidator(check_messages), Field(min_length=1)]

    def chat_messages(self) -> list[dict[str, Any]]:
        return [m.as_chat(i) for i, m in enumerate(self.messages)]

    def chat_media(self) -> list[MediaPart]:
        """The images and audio of the messages, in the order of their markers."""
        return [p for i, m in enumerate(self.messages) for p in m.media(i)]


def _no_bias(v: Any) -> Any:
    if v is None or (isinstance(v, dict) and not v):  # an empty bias asks for nothing
        return None
    raise refuse("is not supported")


class _OpenAISampling(Body):
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
    # Sent by clients, not served: refused when it asks for something.
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
    raise refuse(
        "must be 'auto', 'none', 'required' or "
        '{"type": "function", "function": {"name": ...}}'
    )


class _ToolFields(Body):
    tools: Tools = None
    tool_choice: Annotated[
        Literal["auto", "none", "required"] | NamedToolChoice | None,
        BeforeValidator(_tool_choice),
        Field(description="but for none, needs tools; a named function must be one of them"),
    ] = None
    parallel_tool_calls: bool | None = None

    def chat_tools(self) -> list[dict[str, Any]]:
        return tools_as_chat(self.tools)

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
            raise refuse_whole("'tool_choice' needs 'tools'")
        if isinstance(v, NamedToolChoice) and v.function.name not in names:
            raise refuse_whole(f"'tool_choice' names '{v.function.name}', which is not in 'tools'")
        return v


class _FormatFields(Body):
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
            raise refuse_whole("'grammar' and a JSON 'response_format' exclude each other")
        return v


# pydantic lists the fields of the last base first: the bases are in reverse order of the
# routes' checks, so the first problem reported is the one the routes found first.
class ChatCompletionRequest(
    LoraField,
    ReasoningBudgetFields,
    TemplateKwargsField,
    LlamaChatFields,
    _FormatFields,
    _ToolFields,
    _OpenAISampling,
    _Messages,
):
    logprobs: LogprobsFlag | None = None
    top_logprobs: TopLogprobsField | None = None
    reasoning_format: Annotated[
        Literal["auto", "deepseek", "none"] | None,
        Field(
            description="none: thinking stays in the content; auto, deepseek: it comes apart, "
            "in reasoning_content"
        ),
    ] = None
    context_policy: ContextPolicyField = None
    # OpenAI's fields that the server does not honour.
    reasoning_effort: Annotated[ReasoningEffort | None, Field(description=EFFORT_TEXT)] = None
    verbosity: Annotated[Any, NotHonoured("the answer's length is the model's")] = None
    modalities: Annotated[Any, NotHonoured("the answer is text only", (["text"],))] = None
    audio: Annotated[Any, NotHonoured("the answer is text only")] = None
    prediction: Annotated[Any, NotHonoured("predicted outputs are not used")] = None
    web_search_options: Annotated[Any, NotHonoured("this server runs no web search")] = None
    functions: Annotated[Any, NotHonoured("the deprecated functions; send tools")] = None
    function_call: Annotated[Any, NotHonoured("the deprecated function_call; send tool_choice")] = (
        None
    )
    store: Annotated[Any, NotHonoured("completions are not kept", (False,))] = None

    _alternatives = field_validator("top_logprobs")(alternatives_need_logprobs)

    def asked_logprobs(self) -> int | None:
        return asked(self.logprobs, self.top_logprobs)


def _prompt(v: Any) -> Any:
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        v = v[0]
    if not isinstance(v, str):
        raise refuse_whole("'prompt' must be a string (one prompt per request)")
    if not v:
        raise refuse_whole("'prompt' is empty")
    return v


def _echo(v: Any) -> Any:
    if v is not None and not isinstance(v, bool):
        raise refuse("must be true or false")
    if v:
        raise refuse("is not supported")
    return v


class _Prompt(Body):
    # One prompt per request: a list holding one string is taken as that string.
    prompt: Annotated[
        str,
        BeforeValidator(
            _prompt,
            json_schema_input_type=NonEmpty
            | Annotated[list[NonEmpty], Field(min_length=1, max_length=1)],
        ),
    ]


class CompletionRequest(LoraField, _FormatFields, _OpenAISampling, _Prompt):
    logprobs: LegacyLogprobs | None = None
    top_logprobs: Annotated[
        None,
        BeforeValidator(no_alternatives, json_schema_input_type=Literal[0] | None),
        Field(description="chat's field: completions take 'logprobs': N"),
    ] = None
    echo: Annotated[Literal[False] | None, BeforeValidator(_echo)] = None
    suffix: Annotated[Any, NotHonoured("no text is inserted before a suffix", ("",))] = None
    best_of: Annotated[Any, NotHonoured("one completion is generated", (1,))] = None


class OpenAIErrorDetail(Reply):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(Reply):
    error: OpenAIErrorDetail


class Usage(Reply):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None
    completion_tokens_details: dict[str, int] | None = None


FinishReason = Literal["stop", "length", "tool_calls"]
FINGERPRINT = "candlewick"  # every answer's system_fingerprint


class ReplyFunction(Reply):
    name: str
    arguments: str  # JSON text


class ReplyToolCall(Reply):
    id: str
    type: Literal["function"]
    function: ReplyFunction


class ReplyMessage(Reply):
    role: Literal["assistant"]
    content: str | None  # null when the reply is tool calls only
    reasoning_content: str | None = None
    tool_calls: list[ReplyToolCall] | None = None


class ChatChoice(Reply):
    index: int
    logprobs: ChatLogprobs | None  # null unless asked for
    message: ReplyMessage
    finish_reason: FinishReason


class ChatCompletion(Reply):
    id: str
    created: int
    model: str
    system_fingerprint: str
    object: Literal["chat.completion"]
    choices: Annotated[list[ChatChoice], Field(min_length=1)]
    usage: Usage
    timings: Timings | None = None  # llama-server's figures of the request


class ChunkToolCall(Reply):
    index: int  # the call's place in the answer
    id: str
    type: Literal["function"]
    function: ReplyFunction


class ChatDelta(Reply):
    """What a chunk adds to the answer: the role first, then text, thinking or calls."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChatChunkChoice(Reply):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None  # asked for: the tokens of the content delta
    finish_reason: FinishReason | None  # on the last chunk only


class ChatCompletionChunk(Reply):
    """One event of a streamed chat answer; with include_usage, a last one has no choices
    and the usage."""

    id: str
    created: int
    model: str
    system_fingerprint: str
    object: Literal["chat.completion.chunk"]
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    # llama-server's: on the last chunk (every content chunk with timings_per_token), and
    # the prompt's progress with return_progress
    timings: Timings | None = None
    prompt_progress: PromptProgress | None = None


class TextChoice(Reply):
    index: int
    text: str
    logprobs: TextLogprobs | None
    finish_reason: FinishReason


class TextCompletion(Reply):
    id: str
    created: int
    model: str
    object: Literal["text_completion"]
    system_fingerprint: str
    choices: Annotated[list[TextChoice], Field(min_length=1)]
    usage: Usage


class TextChunkChoice(Reply):
    index: int
    text: str
    logprobs: TextLogprobs | None
    finish_reason: FinishReason | None  # on the last chunk only


class TextCompletionChunk(Reply):
    """One event of a streamed text completion; with include_usage, a last one has no
    choices and the usage."""

    id: str
    created: int
    model: str
    object: Literal["text_completion"]
    system_fingerprint: str
    choices: list[TextChunkChoice]
    usage: Usage | None = None
