"""The chat messages and function tools that the OpenAI and Ollama dialects share; both come
out OpenAI-shaped (`as_chat`), as `chat_reply.plan_chat` and the tool formats take them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import BeforeValidator, ConfigDict, Field, Tag, model_validator

from engine.server.body_model import Body, refuse, refuse_whole
from engine.server.protocol.agent import by_type
from engine.server.protocol.base import MAX_TOOLS, TOOL_NAME
from engine.server.protocol.media import ImageUrlPart, InputAudioPart, MediaPart, media_text


class TextPart(Body):
    type: Literal["text"]
    text: str


_PART_TYPES = ("text", "image_url", "input_audio")


def _content(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list):
        for p in v:
            kind = p.get("type") if isinstance(p, dict) else None
            if isinstance(kind, str) and kind not in _PART_TYPES:
                raise refuse(
                    f"has a part of type '{kind}', which is not supported here; "
                    "it takes text, image_url (a data URL) and input_audio (WAV) parts"
                )
        return v
    raise refuse("must be a string or a list of parts")


ContentPart = Annotated[
    Annotated[TextPart, Tag("type=text")]
    | Annotated[ImageUrlPart, Tag("type=image_url")]
    | Annotated[InputAudioPart, Tag("type=input_audio")],
    by_type({k: f"type={k}" for k in _PART_TYPES}),
]
Content = Annotated[str | list[ContentPart] | None, BeforeValidator(_content)]


def call_arguments(what: str) -> BeforeValidator:
    """A call's arguments: JSON text or an object (a refusal names the dialect's own form)."""

    def check(v: Any) -> Any:
        if isinstance(v, str | dict):
            return v
        raise refuse(f"must be {what}")

    return BeforeValidator(check)


class FunctionDefinition(Body):
    name: Annotated[str, Field(pattern=TOOL_NAME, description="1-64 letters, digits, _ . -")]
    description: str | None = None
    # null is refused, as the routes do; absent means a function without arguments.
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="a JSON schema object",
    )
    strict: bool | None = None


class Tool(Body):
    type: Literal["function"] = "function"
    function: FunctionDefinition

    def as_chat(self) -> dict[str, Any]:
        """OpenAI-shaped, as the tool formats take it (`strict` is not read)."""
        fn: dict[str, Any] = {"name": self.function.name, "parameters": self.function.parameters}
        if self.function.description:
            fn["description"] = self.function.description
        return {"type": "function", "function": fn}


def _tools(v: Any) -> Any:
    if v is None:
        return v
    if not isinstance(v, list):
        raise refuse("must be a list of tools")
    if len(v) > MAX_TOOLS:
        raise refuse(f"takes at most {MAX_TOOLS} tools")
    seen: set[str] = set()
    for t in v:
        fn = t.get("function") if isinstance(t, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str):
            if name in seen:
                raise refuse_whole(f"tools: the function name '{name}' appears twice")
            seen.add(name)
    return v


Tools = Annotated[
    Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None,
    BeforeValidator(_tools),
    Field(description="function tools of distinct names"),
]


def tools_as_chat(tools: Sequence[Tool] | None) -> list[dict[str, Any]]:
    return [t.as_chat() for t in tools or ()]


def _fields_by_role(schema: dict[str, Any], cls: type[Any]) -> None:
    """The document says what the model reads: a field of one role is typed only in the
    messages of that role (in the others it is ignored, whatever it holds). Each stays named
    untyped at the top, where the refusal of unknown keys looks."""
    props = schema["properties"]
    by_role: dict[str, dict[str, Any]] = {}
    for role, name in cls.ROLE_FIELDS:
        by_role.setdefault(role, {})[name] = props.pop(name)
        props[name] = {"description": f"read in {role} messages only"}
    if not by_role:
        return
    others = [r for r in props["role"]["enum"] if r not in by_role]
    schema["anyOf"] = [
        {"properties": {"role": {"enum": others}}},
        *({"properties": {"role": {"const": r}, **fields}} for r, fields in by_role.items()),
    ]


Role = Literal["system", "developer", "user", "assistant", "tool"]


class Message(Body):
    model_config = ConfigDict(json_schema_extra=_fields_by_role)
    role: Role
    content: Content = None

    # (role, field): the routes read these fields only in messages of that role; elsewhere
    # they are dropped, whatever they hold (a client may send its whole message objects).
    ROLE_FIELDS: ClassVar[tuple[tuple[Role, str], ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _drop_other_roles_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        role = data.get("role")
        drop = {f for r, f in cls.ROLE_FIELDS if r != role} - {
            f for r, f in cls.ROLE_FIELDS if r == role
        }
        return {k: v for k, v in data.items() if k not in drop}

    @property
    def text(self) -> str:
        """The content as one string (text parts joined, each image or clip as its marker),
        as the chat template takes it."""
        c = self.content
        if isinstance(c, str):
            return c
        return "".join(p.text if isinstance(p, TextPart) else media_text() for p in c or ())

    def media(self, i: int) -> list[MediaPart]:
        """Message `i`'s images and audio, in the order of their markers in `as_chat`."""
        c = self.content
        if isinstance(c, str) or c is None:
            return []
        return [
            p.media(f"messages[{i}].content[{j}]")
            for j, p in enumerate(c)
            if not isinstance(p, TextPart)
        ]

    def as_chat(self, i: int) -> dict[str, Any]:
        """Message `i` OpenAI-shaped, whatever the dialect, as plan_chat and the tool formats
        read it: `developer` is `system` and the content one string."""
        return {"role": "system" if self.role == "developer" else self.role, "content": self.text}


class _SentFunction(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def arguments(self) -> str | dict[str, Any]: ...


class SentCall(Protocol):
    """A call of an assistant's message as either dialect sends it back (OpenAI's or Ollama's)."""

    @property
    def id(self) -> str | None: ...
    @property
    def function(self) -> _SentFunction: ...


def with_history(
    msg: dict[str, Any],
    i: int,
    calls: Sequence[SentCall] | None,
    thought: str | None,
    call_id: str | None,
    name: str | None,
) -> dict[str, Any]:
    """`msg` with an assistant's calls (arguments as JSON text, numbered where they come
    without an id) and thinking, and a tool result's call id and function name."""
    if calls:
        msg["tool_calls"] = [
            {
                "id": c.id or f"call_{i}_{j}",
                "type": "function",
                "function": {
                    "name": c.function.name,
                    "arguments": c.function.arguments
                    if isinstance(c.function.arguments, str)
                    else json.dumps(c.function.arguments, ensure_ascii=False),
                },
            }
            for j, c in enumerate(calls)
        ]
    if thought:
        msg["reasoning_content"] = thought
    if call_id is not None:
        msg["tool_call_id"] = call_id
    if name is not None:
        msg["name"] = name
    return msg


def check_messages(v: Any) -> Any:
    if not isinstance(v, list) or not v:
        raise refuse("must be a non-empty list")
    return v
