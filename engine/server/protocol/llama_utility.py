"""llama-server's utility routes, in its shapes (tools/server/server-context.cpp and its
README): /tokenize, /detokenize, /apply-template and /props. Each body's `model` picks one
of the host's models as the other routes do (GET /props: `?model=`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from engine.server.body_model import Body, refuse
from engine.server.protocol.base import Reply
from engine.server.protocol.llama import TemplateKwargsField
from engine.server.protocol.openai import _Messages, _ToolFields
from engine.settings import SamplingParams

MODEL = Field(description="the model whose tokenizer or template is used (absent: the default)")
# llama.cpp's token ids are int32.
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


def _mixed(v: Any) -> Any:
    # Checked here rather than by the union, whose errors would name its branches.
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(
        isinstance(x, str) or (type(x) is int and 0 <= x < 2**31) for x in v
    ):
        return v
    raise refuse("must be a string, or a list of strings and token ids")


class TokenizeRequest(Body):
    content: Annotated[
        str | list[str | TokenId],
        BeforeValidator(_mixed),
        Field(
            description="the text; or strings and token ids, the ids kept as they are "
            "(llama-server's tokenize_mixed)"
        ),
    ]
    add_special: Annotated[
        bool, Field(description="add the BOS token where the model's vocabulary has one")
    ] = False
    parse_special: Annotated[
        bool, Field(description="read special tokens' text (<|im_start|>) as those tokens")
    ] = True
    with_pieces: Annotated[
        bool,
        Field(
            description="each token as {id, piece}; a piece that is not whole UTF-8 comes as "
            "its bytes"
        ),
    ] = False
    model: Annotated[str | None, MODEL] = None


class TokenPiece(Reply):
    id: int
    piece: str | list[int]  # the bytes of a piece that is not whole UTF-8


class TokenizeAnswer(Reply):
    tokens: list[int] | list[TokenPiece]


class DetokenizeRequest(Body):
    tokens: Annotated[
        list[TokenId],
        Field(default_factory=list, description="token ids of the model's vocabulary, in order"),
    ]
    model: Annotated[str | None, MODEL] = None


class DetokenizeAnswer(Reply):
    content: str


class ApplyTemplateRequest(TemplateKwargsField, _ToolFields, _Messages):
    """A chat's messages (and tools) as /v1/chat/completions takes them."""

    model: Annotated[str | None, MODEL] = None


class ApplyTemplateAnswer(Reply):
    prompt: str  # the chat template applied, as a chat request's prompt is


class Modalities(Reply):
    vision: bool
    audio: bool
    video: bool


class SamplingDefaults(Reply):
    """What a chat request that sets nothing is sampled with (the API's defaults)."""

    n_predict: int
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_last_n: int
    repeat_penalty: float
    presence_penalty: float
    frequency_penalty: float
    seed: int  # -1: a new one per request
    stop: list[str]
    stream: bool

    @classmethod
    def of(cls, s: SamplingParams, *, stream: bool) -> SamplingDefaults:
        """llama-server's fields of what a request is sampled with."""
        return cls(
            n_predict=s.max_tokens,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            min_p=s.min_p,
            repeat_last_n=s.repeat_last_n,
            repeat_penalty=s.repeat_penalty,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            seed=-1 if s.seed is None else s.seed,
            stop=list(s.stop),
            stream=stream,
        )


class GenerationSettings(Reply):
    n_ctx: int  # a slot's context
    params: SamplingDefaults


class Props(Reply):
    """GET /props: the model being served and what a request gets by default, as
    llama-server's web UI reads them."""

    default_generation_settings: GenerationSettings
    total_slots: int
    model_alias: str
    model_path: str
    modalities: Modalities
    endpoint_slots: bool
    endpoint_props: bool  # POST /props changes nothing here: false
    endpoint_metrics: bool
    chat_template: str
    bos_token: str
    eos_token: str
    build_info: str
    is_sleeping: bool
    media_marker: str | None = None  # with a projector: the text that stands for a media item


__all__ = [
    "ApplyTemplateAnswer",
    "ApplyTemplateRequest",
    "DetokenizeAnswer",
    "DetokenizeRequest",
    "GenerationSettings",
    "Modalities",
    "Props",
    "SamplingDefaults",
    "TokenPiece",
    "TokenizeAnswer",
    "TokenizeRequest",
]
