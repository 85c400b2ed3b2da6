"""LoRA adapters in llama-server's shapes (tools/server/README.md, "LoRA adapters"):
GET /lora-adapters lists the served model's adapters, POST /lora-adapters sets the scales
requests get by default, and a completion or chat request's `lora` sets them for itself.

A list of {id, scale} sets the adapters it names and leaves every other at 0, as
llama-server's `construct_lora_list` does; an id the model has not loaded is a 400 (llama-server
ignores it)."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field, RootModel

from engine.server.body_model import Body, refuse
from engine.server.protocol.base import Reply


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise refuse("must be a finite number")
    return v


class LoraScale(Body):
    id: Annotated[int, Field(ge=0, le=2**31 - 1, description="the adapter's id (its index)")]
    scale: Annotated[
        float,
        AfterValidator(_finite),
        Field(description="its weight: 0 leaves it out, 1 applies it as trained"),
    ]


LoraList = list[LoraScale]


class LoraScales(RootModel[LoraList]):
    """POST /lora-adapters: the scales of the adapters it names; the others are set to 0."""

    model_config = ConfigDict(strict=True)


class LoraField(Body):
    """The per-request adapters of llama-server's completion and chat routes."""

    lora: Annotated[
        LoraList | None,
        Field(
            description="llama-server's: this request's LoRA adapters, [{id, scale}]; those "
            "not listed get 0 (absent or empty: the server's scales, GET /lora-adapters)"
        ),
    ] = None

    def lora_scales(self) -> dict[int, float] | None:
        return {a.id: a.scale for a in self.lora} if self.lora else None


class LoraAdapterInfo(Reply):
    id: int
    path: str
    scale: float
    task_name: str
    prompt_prefix: str


class LoraAdapters(RootModel[list[LoraAdapterInfo]]):
    """GET /lora-adapters: each adapter loaded with the model, with the scale requests get."""

    model_config = ConfigDict(strict=True)

    def wire(self) -> list[dict[str, Any]]:
        return [a.wire() for a in self.root]


class LoraApplied(Reply):
    success: bool
