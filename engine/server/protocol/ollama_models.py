"""Ollama's model management: /api/pull, /api/delete, /api/copy and /api/create, their
bodies and their status lines."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from engine.server.body_model import Body, NotHonoured, refuse, refuse_whole
from engine.server.protocol.base import Reply
from engine.server.protocol.ollama import _OLLAMA_NOT_APPLIED as OLLAMA_NOT_APPLIED
from engine.server.protocol.ollama import OllamaOptions

# What a name may hold: Ollama's own names (`mine`, `mine:v2`, `team/mine:latest`) and Hugging
# Face ones (`hf.co/owner/repo:Q4_K_M`).
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}$"


def _name(v: Any) -> Any:
    if isinstance(v, str) and not re.fullmatch(NAME, v):
        raise refuse(
            "must be 1-200 letters, digits, '_', '.', ':', '/' or '-', starting with a "
            "letter or a digit"
        )
    return v


ModelName = Annotated[
    str,
    BeforeValidator(_name),
    WithJsonSchema({"type": "string", "pattern": NAME, "description": "a model's name"}),
]


class _Named(Body):
    """A body naming one model as `model`, or in `name`, the older spelling, read only when
    `model` is absent (as /api/show does)."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [k], "properties": {k: {"type": "string"}}} for k in ("model", "name")
            ]
        }
    )
    model: str | None = None
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
    def _named(self) -> _Named:
        if self.model is None and self.name is None:
            raise refuse_whole("'model' is required")
        return self

    @property
    def model_name(self) -> str:
        return self.model or self.name or ""


class OllamaPullRequest(_Named):
    stream: bool | None = None
    insecure: Annotated[
        bool | None,
        Field(description="ignored: the Hub is always reached over HTTPS with its certificates"),
    ] = None


class OllamaDeleteRequest(_Named):
    pass


class OllamaCopyRequest(Body):
    source: str
    destination: ModelName


class OllamaParameters(OllamaOptions):
    """A created model's sampling defaults: Ollama's options, the same ones honoured."""


def _parameters(v: Any) -> Any:
    # Refused as the options are, named where they are here.
    for key in v if isinstance(v, dict) else ():
        if key in OLLAMA_NOT_APPLIED:
            raise refuse_whole(f"'parameters.{key}' is not supported: {OLLAMA_NOT_APPLIED[key]}")
    return v


class OllamaCreateMessage(Body):
    """A message a created model's conversations start with."""

    role: Literal["system", "user", "assistant"]
    content: str


_FROM_ONLY = "a model is made from a library model or a pulled one: name it in 'from'"


class OllamaCreateRequest(Body):
    model_config = ConfigDict(populate_by_name=False)

    model: ModelName
    from_: Annotated[str, Field(alias="from", description=f"required here: {_FROM_ONLY}")]
    system: str | None = None
    parameters: Annotated[OllamaParameters | None, BeforeValidator(_parameters)] = None
    messages: list[OllamaCreateMessage] | None = None
    license: str | list[str] | None = None
    stream: bool | None = None
    template: Annotated[
        Any, NotHonoured("a model answers with its own chat template (Jinja, not Go)", ("",))
    ] = None
    quantize: Annotated[
        Any, NotHonoured("nothing is quantized here: pull the quantization you want")
    ] = None
    files: Annotated[Any, NotHonoured(_FROM_ONLY, ({},))] = None
    adapters: Annotated[Any, NotHonoured("LoRA adapters are not applied", ({},))] = None
    modelfile: Annotated[
        Any, NotHonoured("send 'from', 'system' and 'parameters' instead of a Modelfile")
    ] = None

    @property
    def licenses(self) -> list[str]:
        lic = self.license
        return [] if lic is None else [lic] if isinstance(lic, str) else list(lic)


class OllamaStatus(Reply):
    """A line of a pull's or a create's progress, or its whole answer with stream=false."""

    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None


__all__ = [
    "OllamaCopyRequest",
    "OllamaCreateMessage",
    "OllamaCreateRequest",
    "OllamaDeleteRequest",
    "OllamaParameters",
    "OllamaPullRequest",
    "OllamaStatus",
]
