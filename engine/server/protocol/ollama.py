"""Ollama's /api routes: the request bodies and the answers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from engine.server.body_model import Body, NotHonoured, refuse, refuse_whole
from engine.server.protocol.base import (
    ContextPolicyField,
    EmbedInput,
    KeepAlive,
    OllamaTemperature,
    OllamaTopP,
    Penalty,
    RepeatPenalty,
    Reply,
    Seed,
    Stop,
    UnitInterval,
)
from engine.server.protocol.logprobs import (
    LogprobEntry,
    LogprobsFlag,
    TopLogprobsField,
    alternatives_need_logprobs,
    asked,
)
from engine.server.protocol.media import MediaPart, media_text
from engine.server.protocol.messages import (
    Message,
    Tools,
    call_arguments,
    check_messages,
    tools_as_chat,
    with_history,
)


class OllamaFunctionCall(Body):
    name: str
    # Ollama sends the arguments as an object; JSON text is taken too.
    arguments: Annotated[dict[str, Any] | str, call_arguments("an object or a JSON string")] = (
        Field(default_factory=dict)
    )


class OllamaToolCall(Body):
    # Ollama's calls carry no id; one given is kept, so a tool result can name its call.
    id: str | None = None
    function: OllamaFunctionCall


Images = Annotated[
    list[str] | None,
    Field(description="images, each a file (PNG, JPEG, WebP, GIF, BMP, TIFF) in base64"),
]


def images_media(images: list[str] | None, where: str) -> list[MediaPart]:
    return [MediaPart("image", f"{where}[{k}]", b64) for k, b64 in enumerate(images or ())]


class OllamaMessage(Message):
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
    images: Images = None

    def as_chat(self, i: int) -> dict[str, Any]:
        msg = super().as_chat(i)
        if self.images:  # as Ollama places them: the message's images before its text
            msg["content"] = media_text() * len(self.images) + msg["content"]
        return with_history(
            msg, i, self.tool_calls, self.thinking, self.tool_call_id, self.tool_name
        )

    def media(self, i: int) -> list[MediaPart]:
        own = images_media(self.images, f"messages[{i}].images")
        return own + super().media(i)


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


class OllamaOptions(Body):
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
                raise refuse_whole(f"'options.{key}' is not supported: {_OLLAMA_NOT_APPLIED[key]}")
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
    raise refuse('must be "json" or a JSON schema object')


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


class _OllamaModel(Body):
    model: str
    keep_alive: KeepAlive = None


class _OllamaText(_OllamaModel):
    """What /api/chat and /api/generate share."""

    options: OllamaOptions | None = None
    stream: bool | None = None
    think: Think = None
    format: OllamaFormat = None
    logprobs: LogprobsFlag | None = None
    top_logprobs: TopLogprobsField | None = None

    _alternatives = field_validator("top_logprobs")(alternatives_need_logprobs)

    def asked_logprobs(self) -> int | None:
        return asked(self.logprobs, self.top_logprobs)


class OllamaChatRequest(_OllamaText):
    messages: Annotated[list[OllamaMessage], BeforeValidator(check_messages), Field(min_length=1)]
    tools: Tools = None
    context_policy: ContextPolicyField = None

    def chat_messages(self) -> list[dict[str, Any]]:
        return [m.as_chat(i) for i, m in enumerate(self.messages)]

    def chat_media(self) -> list[MediaPart]:
        """The images of the messages, in the order of their markers."""
        return [p for i, m in enumerate(self.messages) for p in m.media(i)]

    def chat_tools(self) -> list[dict[str, Any]]:
        return tools_as_chat(self.tools)


class OllamaGenerateRequest(_OllamaText):
    prompt: str | None = None
    system: str | None = None
    raw: bool | None = None
    suffix: Annotated[Any, NotHonoured("no text is inserted before a suffix", ("",))] = None
    template: Annotated[Any, NotHonoured("the model's own chat template is used", ("",))] = None
    context: Annotated[Any, NotHonoured("send the conversation to /api/chat", ([],))] = None
    images: Images = None
    width: Annotated[Any, NotHonoured("this server makes no images")] = None
    height: Annotated[Any, NotHonoured("this server makes no images")] = None
    steps: Annotated[Any, NotHonoured("this server makes no images")] = None


class OllamaNamedBody(Body):
    """A body naming one model as `model`, or in `name`, the older spelling, read only when
    `model` is absent (/api/show, /api/pull, /api/delete). One of the two must be a string
    (null stands for absent)."""

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
    def _named(self) -> OllamaNamedBody:
        if self.model is None and self.name is None:
            raise refuse_whole("'model' is required")
        return self

    @property
    def model_name(self) -> str:
        return self.model or self.name or ""


class OllamaShowRequest(OllamaNamedBody):
    """POST /api/show."""


class OllamaEmbedRequest(_OllamaModel):
    input: EmbedInput
    truncate: Annotated[
        Any, NotHonoured("an input longer than the model's context is refused, not cut", (False,))
    ] = None
    dimensions: Annotated[Any, NotHonoured("vectors have the model's own length")] = None
    options: Annotated[Any, NotHonoured("embeddings take no options", ({},))] = None


class OllamaError(Reply):
    error: str


class OllamaVersion(Reply):
    version: str


class OllamaModelEntry(Reply):
    """A model of /api/tags: every model a request may name, loaded or not."""

    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: dict[str, Any]


class OllamaTags(Reply):
    models: list[OllamaModelEntry]


class OllamaRunningEntry(Reply):
    """A loaded model of /api/ps: its size in memory and when it goes."""

    name: str
    model: str
    size: int
    size_vram: int
    digest: str
    details: dict[str, Any]
    expires_at: str
    context_length: int
    # Candlewick's own: why it stays or when it goes.
    pinned: bool
    held_by: str | None
    requests_in_flight: int
    keep_alive_s: float | None


class OllamaRunning(Reply):
    models: list[OllamaRunningEntry]


class OllamaShowResponse(Reply):
    modelfile: str
    parameters: str
    template: str | None
    details: dict[str, Any]
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str
    # A created model's (/api/create): its system prompt and license.
    system: str | None = None
    license: str | None = None


class OllamaReplyFunction(Reply):
    name: str
    arguments: Annotated[Any, Field(description="an object")]


class OllamaReplyCall(Reply):
    function: OllamaReplyFunction


class OllamaReplyMessage(Reply):
    role: Literal["assistant"]
    content: str
    thinking: str | None = None
    tool_calls: list[OllamaReplyCall] | None = None


class OllamaReply(Reply):
    """A whole answer, or a line of a stream (the last one `done: true`, with the figures):
    /api/generate's text is in `response`, /api/chat's in `message`."""

    model: str
    created_at: str
    response: str | None = None
    thinking: str | None = None
    message: OllamaReplyMessage | None = None
    done: bool
    done_reason: str | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None
    logprobs: list[LogprobEntry] | None = None  # asked for: the tokens of this line's text


class OllamaEmbedResponse(Reply):
    model: str
    embeddings: list[list[float]]
    prompt_eval_count: int
