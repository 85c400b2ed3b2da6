"""What every dialect's models share: refusing a value in words, numbers in a range, stop
strings, embedding inputs, keep-alive durations, and the base of an answer's shape."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
)
from pydantic_core import core_schema

from engine.host.context_policy import ContextPolicy
from engine.host.host import UNSET, Unset
from engine.server.body_model import refuse

MAX_STOP = 16
MAX_TOOLS = 128
MAX_EMBED_INPUTS = 64
TOOL_NAME = r"^[A-Za-z0-9_.-]{1,64}$"
# Patterns refused in words rather than as a regular expression.
PATTERN_TEXT = {TOOL_NAME: "must be 1-64 letters, digits, '_', '.' or '-'"}


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


@dataclass(frozen=True)
class Between:
    """A number in [lo, hi], refused as "must be between lo and hi" (what the hand checks say,
    and pydantic's one-bound errors cannot). What is not a finite number is left to the float
    type's own error."""

    lo: float
    hi: float

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {**handler(schema), "minimum": self.lo, "maximum": self.hi}

    def _check(self, v: Any) -> Any:
        if _is_number(v) and math.isfinite(v) and not self.lo <= v <= self.hi:
            raise refuse(f"must be between {self.lo} and {self.hi}")
        return v


FINITE = Field(allow_inf_nan=False)
Temperature = Annotated[float, FINITE, Between(0, 2)]
TopP = Annotated[float, Field(gt=0, allow_inf_nan=False), Between(0, 1)]
UnitInterval = Annotated[float, FINITE, Between(0, 1)]
RepeatPenalty = Annotated[float, FINITE, Between(0.01, 10)]
Penalty = Annotated[float, FINITE, Between(-2, 2)]
OllamaTemperature = Annotated[float, FINITE, Between(0, 100)]
OllamaTopP = Annotated[float, FINITE, Between(1e-6, 1)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]
NonEmpty = Annotated[str, Field(min_length=1)]


def _stop(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        if len(v) > MAX_STOP:
            raise refuse(f"takes at most {MAX_STOP} strings")
        return tuple(x for x in v if x)
    raise refuse("must be a string or a list of strings")


# Candlewick's extension to every chat dialect (docs/server.md, "Context policy").
ContextPolicyField = Annotated[
    ContextPolicy | None,
    Field(
        description="What to do when the conversation outgrows the context (Candlewick's "
        "extension): stop (refuse), drop_oldest, truncate_middle (keep the first exchange "
        "and the latest turns), summarise (a summary in place of the oldest turns). Absent: "
        "the conversation is sent whole. The X-Context-Left-Out header counts the messages "
        "left out."
    ),
]

# OpenAI's reasoning effort (chat's `reasoning_effort`, Responses' `reasoning.effort`):
# engine.host.chat_plan reads it (engine.decoding.thinking_budget.EFFORT_BUDGET).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
EFFORT_TEXT = (
    "none asks for no thinking; another is given to a chat template that reads "
    "reasoning_effort (gpt-oss), as llama-server gives it, and is otherwise a budget of "
    "thinking tokens: minimal 0, low 1024, medium 2048, high 4096, xhigh no limit"
)

# Stop strings, as a tuple without empty ones.
Stop = Annotated[
    tuple[str, ...],
    BeforeValidator(
        _stop, json_schema_input_type=str | Annotated[list[str], Field(max_length=MAX_STOP)] | None
    ),
]


def _embed_input(v: Any) -> list[str]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise refuse("must be a non-empty string or list of non-empty strings")
    if len(v) > MAX_EMBED_INPUTS:
        raise refuse(f"takes at most {MAX_EMBED_INPUTS} strings")
    return v


EmbedInput = Annotated[
    list[str],
    BeforeValidator(
        _embed_input,
        json_schema_input_type=NonEmpty
        | Annotated[list[NonEmpty], Field(min_length=1, max_length=MAX_EMBED_INPUTS)],
    ),
]


class Reply(BaseModel):
    """An answer's shape: the routes build their answers as these models and send `wire()`,
    so the document and the bytes cannot drift. Clients take keys they do not know.

    A field without a default is always sent (null included, as `logprobs`); one with a
    default is sent only when the route gives it, so optional keys stay absent, not null."""

    model_config = ConfigDict(extra="ignore", strict=True, protected_namespaces=())

    def wire(self) -> dict[str, Any]:
        """The JSON object sent: the keys the route gave, in the model's order."""
        return self.model_dump(exclude_unset=True, by_alias=True)


# Where a streamed value goes in a `Template`: a string no answer holds (a NUL is escaped
# in JSON, so a value that contains it never matches the marker's JSON).
HOLE = "\x00hole\x00"


class Template:
    """A line of a stream checked once as its model, with `HOLE` in each place a value
    goes; each line then puts the values' JSON between the fixed parts. A model validated
    and dumped per token cost twice a dict literal's time on the event loop (measured);
    this costs less than either and sends the same bytes as `dumps(reply.wire())`."""

    def __init__(
        self, reply: Reply, dumps: Callable[[Any], str], keys: tuple[str, ...] = ()
    ) -> None:
        """`keys`: top-level keys whose values are holes too (a number, as an event's
        sequence number, cannot be checked holding `HOLE`)."""
        self._dumps = dumps
        data = reply.wire()
        data.update(dict.fromkeys(keys, HOLE))
        self._parts = dumps(data).split(dumps(HOLE))

    def fill(self, *values: Any) -> str:
        """The line with `values` in its holes, in the order they appear in the JSON."""
        if len(values) != len(self._parts) - 1:
            raise ValueError(f"the template has {len(self._parts) - 1} holes")
        out = [self._parts[0]]
        for v, part in zip(values, self._parts[1:], strict=True):
            out += (self._dumps(v), part)
        return "".join(out)


def unsupported_true(v: Any) -> Any:
    if v is not None and not isinstance(v, bool):
        raise refuse("must be true or false")
    if v:
        raise refuse("is not supported")
    return None


def no_alternatives(v: Any) -> Any:
    if v is None or (type(v) is int and v == 0):  # zero alternatives ask for nothing
        return None
    raise refuse("is not supported")


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|m|s|ms|us|\u00b5s|ns)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "\u00b5s": 1e-6, "ns": 1e-9}


def duration_seconds(v: object) -> float:
    """Seconds from a number or a Go duration ("5m", "1h30m", "0", "-1"), as Ollama reads
    keep_alive; ValueError says what is wrong."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError('must be a number of seconds or a duration such as "5m"')
    if isinstance(v, int | float):
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return float(v)
    text = v.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body and re.fullmatch(rf"(?:{_DURATION.pattern})+", body):
        return sign * sum(float(n) * _UNIT_S[u] for n, u in _DURATION.findall(body))
    try:
        number = float(body)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(
            'must be a number of seconds or a duration such as "5m", "1h", "0" or "-1"'
        )
    return sign * number


def _keep_alive(v: Any) -> Any:
    """Ollama's keep_alive; negative means keep the model loaded."""
    if v is None:
        return None
    try:
        return duration_seconds(v)
    except ValueError as e:
        raise refuse(str(e)) from None


KeepAlive = Annotated[
    float | None,
    BeforeValidator(_keep_alive, json_schema_input_type=float | str | None),
    Field(
        description="how long the model stays loaded after this request: seconds or a duration "
        '("5m"); 0 unloads it when idle, a negative value keeps it'
    ),
]
Ttl = Annotated[
    int,
    Field(
        ge=0,
        description="seconds the model stays loaded once idle, as LM "
        "Studio's ttl; 0 unloads it when idle",
    ),
]


def keep_seconds(v: float | None) -> float | Unset | None:
    """A request's keep-alive for the host: absent -> unchanged, negative -> keep."""
    if v is None:
        return UNSET
    return None if v < 0 else v


class ServerSentEvent(Reply):
    """One event of a stream: `data` is a JSON chunk, or `[DONE]` at the end."""

    data: str
    event: str | None = None
    id: str | None = None
