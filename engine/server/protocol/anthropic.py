"""Anthropic's Messages API (/v1/messages, spoken by Claude-Code-style clients): the request
bodies and the answers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, Tag, ValidationInfo, field_validator, model_validator

from engine.server.body_model import Body, NotHonoured, refuse, refuse_whole
from engine.server.protocol.agent import (
    CacheControl,
    Harmless,
    Temperature1,
    TopP,
    by_type,
    choice_in_tools,
    tools_of,
)
from engine.server.protocol.base import MAX_STOP, MAX_TOOLS, ContextPolicyField, Reply
from engine.server.protocol.media import AnthropicImageSource, MediaPart

_ANTHROPIC_NAME = r"^[A-Za-z0-9_.-]{1,128}$"  # Anthropic allows 128 (MCP tools' long names)


class AnthropicTextBlock(Body):
    type: Literal["text"]
    text: str
    cache_control: CacheControl = None


class AnthropicToolUseBlock(Body):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: str
    input: dict[str, Any]
    cache_control: CacheControl = None


class AnthropicToolResultBlock(Body):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: str | list[AnthropicTextBlock] | None = None
    is_error: bool | None = Field(None, description="true: the result is shown as an error")
    cache_control: CacheControl = None

    @property
    def text(self) -> str:
        c = self.content
        return c if isinstance(c, str) else "\n".join(b.text for b in c or ())


class AnthropicThinkingBlock(Body):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class AnthropicImageBlock(Body):
    type: Literal["image"]
    source: AnthropicImageSource
    cache_control: CacheControl = None

    def media(self, where: str) -> MediaPart:
        return MediaPart("image", where, self.source.data, field=".source.data")


_BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "thinking")
AnthropicBlock = Annotated[
    Annotated[AnthropicTextBlock, Tag("type=text")]
    | Annotated[AnthropicImageBlock, Tag("type=image")]
    | Annotated[AnthropicToolUseBlock, Tag("type=tool_use")]
    | Annotated[AnthropicToolResultBlock, Tag("type=tool_result")]
    | Annotated[AnthropicThinkingBlock, Tag("type=thinking")],
    by_type({k: f"type={k}" for k in _BLOCK_TYPES}),
]
_BLOCK_WHY = {
    "document": "is not read here (no documents, PDF or other); send its text",
    "redacted_thinking": "cannot be read: its thinking is encrypted",
    "search_result": "search results are not read here; send them as text",
}


def _blocks(v: Any) -> Any:
    """Blocks of an unsupported type are refused saying why (a tool result holds text only)."""
    blocks = v if isinstance(v, list) else []
    for b in blocks:
        inner = b.get("content") if isinstance(b, dict) and b.get("type") == "tool_result" else None
        for x in [b, *(inner if isinstance(inner, list) else [])]:
            kind = x.get("type") if isinstance(x, dict) else None
            if kind == "image" and x is not b:
                raise refuse(
                    "has an image in a tool result, which is not read here: send it in the "
                    "user message's content, beside the result"
                )
            if isinstance(kind, str) and kind not in _BLOCK_TYPES:
                raise refuse(
                    f"has a block of type '{kind}', which "
                    + _BLOCK_WHY.get(kind, "is not supported here (no server tools)")
                )
    return v


class AnthropicMessage(Body):
    role: Literal["user", "assistant"]
    content: Annotated[str | list[AnthropicBlock], BeforeValidator(_blocks)]


class AnthropicTool(Body):
    type: Literal["custom"] | None = None
    name: Annotated[str, Field(pattern=_ANTHROPIC_NAME, description="1-128 letters, digits, _ . -")]
    description: str | None = None
    input_schema: dict[str, Any] = Field(description="a JSON schema object")
    strict: bool | None = None
    cache_control: CacheControl = None


_anthropic_tools = tools_of(
    "custom",
    "'tools[{i}]': the server tool '{kind}' is not available here; only custom "
    "tools (name, description, input_schema)",
)


class AnthropicToolChoice(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, description="with type tool")
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> AnthropicToolChoice:
        if self.type == "tool" and self.name is None:
            raise refuse_whole("'tool_choice' of type tool needs a 'name'")
        return self


MIN_THINKING_BUDGET = 1024  # Anthropic's own least budget_tokens


class AnthropicThinking(Body):
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: Annotated[
        int | None,
        Field(
            ge=MIN_THINKING_BUDGET,
            le=2**31 - 1,
            description="with type enabled (and only then): the thinking's tokens at most, "
            "less than max_tokens; the block is closed there and the answer follows",
        ),
    ] = None
    display: Annotated[Any, NotHonoured("the thinking comes whole, as thinking blocks")] = None

    @model_validator(mode="after")
    def _budget_with_enabled(self) -> AnthropicThinking:
        if self.type == "enabled" and self.budget_tokens is None:
            raise refuse_whole("'thinking.budget_tokens' is required with type 'enabled'")
        if self.type != "enabled" and self.budget_tokens is not None:
            raise refuse_whole("'thinking.budget_tokens' goes with type 'enabled' only")
        return self


class AnthropicJsonFormat(Body):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class AnthropicOutputConfig(Body):
    format: AnthropicJsonFormat | None = None
    effort: Annotated[Any, NotHonoured("how hard the model works is not adjustable")] = None


class AnthropicMetadata(Body):
    user_id: Harmless = None


def _system(v: Any) -> Any:
    if isinstance(v, list):
        for b in v:
            if isinstance(b, dict) and b.get("type") != "text":
                raise refuse("takes only text blocks")
    return v


class AnthropicCountTokensRequest(Body):
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
    mcp_servers: Annotated[Any, NotHonoured("this server connects to no MCP servers", ([],))] = None
    context_management: Annotated[Any, NotHonoured("the context is not edited")] = None
    container: Annotated[Any, NotHonoured("this server runs no code containers")] = None

    @field_validator("tool_choice")
    @classmethod
    def _choice_needs_tools(
        cls, v: AnthropicToolChoice | None, info: ValidationInfo
    ) -> AnthropicToolChoice | None:
        if v is not None and "tools" in info.data:
            choice_in_tools(
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
    context_policy: ContextPolicyField = None

    @model_validator(mode="after")
    def _budget_under_max_tokens(self) -> AnthropicMessagesRequest:
        budget = self.thinking.budget_tokens if self.thinking is not None else None
        if budget is not None and budget >= self.max_tokens:
            # Anthropic's rule: the answer needs tokens after the thinking.
            raise refuse_whole("'max_tokens' must be greater than 'thinking.budget_tokens'")
        return self


class AnthropicUsage(Reply):
    """Anthropic counts cache reads apart: input + cache reads are the whole prompt (the
    cache figures come with the last event and the whole answer)."""

    input_tokens: int
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    output_tokens: int


class AnthropicReplyThinking(Reply):
    type: Literal["thinking"]
    thinking: str
    signature: str


class AnthropicReplyToolUse(Reply):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class AnthropicReplyText(Reply):
    type: Literal["text"]
    text: str


AnthropicReplyBlock = Annotated[
    AnthropicReplyText | AnthropicReplyThinking | AnthropicReplyToolUse,
    Field(discriminator="type"),
]
StopReason = Literal[
    "end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"
]


class AnthropicReply(Reply):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[AnthropicReplyBlock]
    stop_reason: Annotated[
        StopReason | None, Field(description="null only in a stream's message_start")
    ]
    stop_sequence: str | None
    usage: AnthropicUsage


# -- the stream's events (each sent as `event: <type>` with this `data`) ------------------


class AnthropicMessageStart(Reply):
    type: Literal["message_start"]
    message: AnthropicReply  # without content yet


class AnthropicBlockStart(Reply):
    type: Literal["content_block_start"]
    index: int
    content_block: AnthropicReplyBlock  # empty: its text comes in deltas


class AnthropicTextDelta(Reply):
    type: Literal["text_delta"]
    text: str


class AnthropicThinkingDelta(Reply):
    type: Literal["thinking_delta"]
    thinking: str


class AnthropicInputDelta(Reply):
    type: Literal["input_json_delta"]
    partial_json: str


class AnthropicBlockDelta(Reply):
    type: Literal["content_block_delta"]
    index: int
    delta: Annotated[
        AnthropicTextDelta | AnthropicThinkingDelta | AnthropicInputDelta,
        Field(discriminator="type"),
    ]


class AnthropicBlockStop(Reply):
    type: Literal["content_block_stop"]
    index: int


class AnthropicStop(Reply):
    stop_reason: StopReason
    stop_sequence: str | None


class AnthropicMessageDelta(Reply):
    type: Literal["message_delta"]
    delta: AnthropicStop
    usage: AnthropicUsage


class AnthropicMessageStop(Reply):
    type: Literal["message_stop"]


class AnthropicTokenCount(Reply):
    input_tokens: int


class AnthropicErrorDetail(Reply):
    type: str
    message: str


class AnthropicError(Reply):
    type: Literal["error"]
    error: AnthropicErrorDetail
