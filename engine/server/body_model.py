"""The base of every request body's model (the `protocol` package): values are
strict, and a key the model does not declare is a 400 naming it, so that a misspelt or
unsupported field is never silently dropped.

The exception is `IGNORED`, the one list of keys that official clients send and that change
nothing here: they are accepted, whatever they hold, and dropped. docs/server.md ("Unknown
keys") gives the same list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

# The refusal of a key a model does not declare, after the key's quoted path.
UNKNOWN = "is not a field of this API: unknown keys are refused, not ignored"

# The two kinds of a refusal that a model's own check words (`parse.parse_body` reads them).
REFUSED = "refused"
REFUSED_WHOLE = "refused_whole"


def refuse(message: str) -> PydanticCustomError:
    """A refusal read after the field's quoted path: "'stop' <message>"."""
    return PydanticCustomError(REFUSED, message)


def refuse_whole(message: str) -> PydanticCustomError:
    """A refusal complete as it is (it names its field itself)."""
    return PydanticCustomError(REFUSED_WHOLE, message)


_ABUSE = "an end-user id for OpenAI's abuse monitoring"
_CACHE = "prompt prefixes are cached per slot anyway"
_ECHO = "bookkeeping of an earlier answer, sent back with it"

# By model (its class name; a model also takes its bases' keys): key -> why it is harmless.
# Keys that ask for something the server does not do are declared and refused instead.
IGNORED: dict[str, dict[str, str]] = {
    # OpenAI chat and completions (the models' shared base)
    "_OpenAISampling": {
        "user": _ABUSE,
        "safety_identifier": _ABUSE,
        "metadata": "tags for OpenAI's dashboard",
        "prompt_cache_key": _CACHE,
        "prompt_cache_retention": _CACHE,
        "service_tier": "there is one tier here",
    },
    "ChatMessage": {"annotations": "an answer's citations, sent back with it"},
    # llama-server's web UI, with every chat request
    "LlamaChatFields": {
        "reasoning_control": "arms ending the thinking early through llama-server's "
        "/v1/chat/completions/control, which this server does not have: the reply is the same"
    },
    "EmbeddingRequest": {"user": _ABUSE},
    # Ollama: its servers number the calls of an answer, and clients send them back so
    "OllamaFunctionCall": {"index": _ECHO},
    # OpenAI Responses: an earlier response's output items, sent back as they came
    "ResponsesRequest": {"prompt_cache_retention": _CACHE, "prompt_cache_options": _CACHE},
    "ResponsesMessageItem": {
        "id": _ECHO,
        "status": _ECHO,
        "phase": "marks commentary and final answers of OpenAI's agents",
    },
    "ResponsesTextPart": {
        "annotations": _ECHO,
        "logprobs": _ECHO,
        "prompt_cache_breakpoint": _CACHE,
    },
    "ResponsesFunctionCallItem": {"id": _ECHO, "status": _ECHO},
    "ResponsesFunctionCallOutputItem": {"id": _ECHO, "status": _ECHO},
    "ResponsesReasoningItem": {"id": _ECHO, "status": _ECHO},
    # llama-server's /infill, as llama.vim sends it
    "InfillRequest": {
        "id_slot": "slots are picked by the prompt's cached prefix, wherever it is",
        "cache_prompt": _CACHE,
    },
    "InfillChunk": {"time": "when the editor picked the chunk; their order says as much"},
    # Anthropic Messages
    "AnthropicMessagesRequest": {"inference_geo": "where the model runs: here"},
    "AnthropicTextBlock": {"citations": _ECHO},
    "AnthropicTool": {
        "eager_input_streaming": "a tool's input is streamed whole, as one delta, anyway"
    },
}


def ignored_keys(model: type[BaseModel]) -> dict[str, str]:
    return {k: v for c in reversed(model.__mro__) for k, v in IGNORED.get(c.__name__, {}).items()}


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _drop_ignored(cls, data: Any) -> Any:
        keys = ignored_keys(cls)
        if keys and isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in keys}
        return data

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        # The document takes the ignored keys too, or it would promise a refusal.
        out = handler(schema)
        own = handler.resolve_ref_schema(out)
        for key, why in ignored_keys(cls).items():
            own.setdefault("properties", {})[key] = {"description": f"ignored: {why}"}
        return out


@dataclass(frozen=True)
class NotHonoured:
    """A field of an API that the server does not honour, in every dialect: absent, null or
    one of `allowed` (values that ask for nothing) passes, as it was sent; anything else is a
    400 naming the field and saying `why`. Its document takes any value: the refusal is in
    words."""

    why: str
    allowed: tuple[Any, ...] = ()

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {"description": f"not supported: {self.why}"}

    def _check(self, v: Any) -> Any:
        if v is None or any(v == a and type(v) is type(a) for a in self.allowed):
            return v
        raise refuse(f"is not supported: {self.why}")
