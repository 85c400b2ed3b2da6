"""A tool call as every format returns it, the tool choice, and the bounds of a forced call."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from engine.errors import EngineError

ToolChoice: TypeAlias = Literal["auto", "none", "required"] | str

Json: TypeAlias = dict[str, Any]

EMPTY_PARAMETERS: Json = {"type": "object", "properties": {}}

# A forced call's bounds. Parallel calls: enough for a fan-out over a few items (the weather in
# several cities), few enough that a model repeating one call ends within a usual max_tokens.
MAX_PARALLEL_CALLS = 8

# A string argument without a maxLength of its own: room for a paragraph or a short file, not
# for a model looping inside the string until the token limit.
MAX_ARGUMENT_CHARS = 2000


class ToolCallError(EngineError):
    """Tools or a tool choice that cannot be honoured; `str()` is one line."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object (as OpenAI sends `function.arguments`)
    id: str  # "call_" + random hex if the model gave none
    # False: the token limit cut the call; `arguments` holds the values written so far (the
    # last one possibly cut), closed into an object.
    complete: bool = True


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]
