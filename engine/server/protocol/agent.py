"""What the agent tools' APIs (the Responses API, Anthropic Messages) share: their refusal
in words, number ranges, unions chosen by `type`, tool lists and choices."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import Discriminator, Field

from engine.server.body_model import REFUSED, refuse, refuse_whole
from engine.server.protocol.base import FINITE

TEXT_ONLY = "cannot be read: this model reads text only"


Temperature2 = Annotated[float, FINITE, Field(ge=0, le=2)]
Temperature1 = Annotated[float, FINITE, Field(ge=0, le=1)]
TopP = Annotated[float, FINITE, Field(gt=0, le=1)]
PositiveInt = Annotated[int, Field(ge=1)]
Harmless = Annotated[str | None, Field(description="accepted; no effect on the answer")]
# Prompt-cache markers: every slot reuses the longest cached prefix of a prompt by itself.
CacheControl = Annotated[
    dict[str, Any] | None, Field(description="accepted: prompt prefixes are cached automatically")
]


def _unique_tools(names: list[str]) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise refuse(f"names the tool '{n}' twice")
        seen.add(n)


def by_type(tags: dict[str, str], default: str | None = None) -> Discriminator:
    """A union chosen by the `type` key. Its tags (which pydantic puts in an error's path)
    are written "type=..." so that `_message` can leave them out."""

    def tag(v: Any) -> str | None:
        kind = v.get("type", default) if isinstance(v, dict) else getattr(v, "type", None)
        return tags.get(kind) if isinstance(kind, str) else None

    return Discriminator(
        tag,
        custom_error_type=REFUSED,
        custom_error_message=f"must have a 'type' of {', '.join(tags)}",
    )


def tools_of(kind_taken: str, refusal: str) -> Callable[[Any], Any]:
    """A check of a tools list: each of type `kind_taken` (or none given), names unique.
    `refusal` says why another type is refused, with {i} and {kind} to fill."""

    def check(v: Any) -> Any:
        if isinstance(v, list):
            for i, t in enumerate(v):
                kind = t.get("type") if isinstance(t, dict) else None
                if isinstance(kind, str) and kind != kind_taken:
                    raise refuse_whole(refusal.format(i=i, kind=kind))
            _unique_tools(
                [t["name"] for t in v if isinstance(t, dict) and isinstance(t.get("name"), str)]
            )
        return v

    return check


def choice_in_tools(choice: Any, name: str | None, tools: list[Any] | None) -> None:
    names = {t.name for t in tools or []}
    if choice is not None and not names:
        raise refuse_whole("'tool_choice' needs 'tools'")
    if name is not None and name not in names:
        raise refuse_whole(f"'tool_choice' names '{name}', which is not in 'tools'")
