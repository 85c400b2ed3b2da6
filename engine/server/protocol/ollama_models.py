"""Ollama's model management: /api/pull, /api/delete, /api/copy and /api/create, their
bodies and their status lines."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, WithJsonSchema

from engine.server.body_model import Body, NotHonoured, refuse, refuse_whole
from engine.server.protocol.base import Reply
from engine.server.protocol.ollama import _OLLAMA_NOT_APPLIED as OLLAMA_NOT_APPLIED
from engine.server.protocol.ollama import OllamaNamedBody, OllamaOptions

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


class OllamaPullRequest(OllamaNamedBody):
    stream: bool | None = None
    insecure: Annotated[
        bool | None,
        Field(description="ignored: the Hub is always reached over HTTPS with its certificates"),
    ] = None


class OllamaDeleteRequest(OllamaNamedBody):
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
