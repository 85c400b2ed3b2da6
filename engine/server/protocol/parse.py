"""Checking a body against its model: the first problem found is a 400 naming its field."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from engine.server.body_model import UNKNOWN
from engine.server.errors import ApiError
from engine.server.protocol.base import PATTERN_TEXT

T = TypeVar("T", bound=BaseModel)


def _fmt(x: Any) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def parse_body(model: type[T], body: dict[str, Any]) -> T:
    """`body` as `model`; the first problem found is a 400 naming its top-level field."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        errs = e.errors(include_url=False)
        # An unknown key inside a union's member says more than the other members' errors.
        err = next(
            (
                x
                for x in errs
                if x["type"] == "extra_forbidden" and x["loc"][:1] == errs[0]["loc"][:1]
            ),
            errs[0],
        )
        loc = err["loc"]
        raise ApiError(400, _message(err), param=str(loc[0]) if loc else None) from None


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, str) and not re.fullmatch(r"\w+", part):
            continue  # a union member's name ("list[TextPart]"), not a key
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(err: ErrorDetails) -> str:
    """One line in the hand checks' style: "'<field>' must be ..."."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "candlewick_whole":
        return err["msg"]
    loc = err["loc"]
    where = f"'{_path(loc)}'" if loc else "the body"
    if kind == "candlewick":
        return f"{where} {err['msg']}"
    if err["input"] is None and kind.endswith("_type"):
        return f"{where} is required"  # null stands for absent, and this field must be there
    text = {
        "missing": "is required",
        "string_type": "must be a string",
        "bool_type": "must be true or false",
        "int_type": "must be a whole number",
        "float_type": "must be a number",
        "finite_number": "must be a number",
        "list_type": "must be a list",
        "dict_type": "must be an object",
        "model_type": "must be an object",
        "model_attributes_type": "must be an object",
        "extra_forbidden": UNKNOWN,
    }.get(kind)
    if text is None:
        text = _bounds(kind, ctx) or re.sub(r"^Input should", "should", err["msg"].split("\n")[0])
    return f"{where} {text}"


def _bounds(kind: str, ctx: dict[str, Any]) -> str | None:
    if kind == "greater_than_equal":
        return f"must be at least {_fmt(ctx['ge'])}"
    if kind == "less_than_equal":
        return f"must be at most {_fmt(ctx['le'])}"
    if kind == "greater_than":
        return f"must be greater than {_fmt(ctx['gt'])}"
    if kind == "less_than":
        return f"must be less than {_fmt(ctx['lt'])}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}"
    if kind == "string_pattern_mismatch":
        return PATTERN_TEXT.get(ctx["pattern"], f"must match {ctx['pattern']}")
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "too_short":
        return (
            "must not be empty"
            if ctx.get("min_length") == 1
            else (f"takes at least {ctx.get('min_length')} items")
        )
    if kind == "too_long":
        return f"takes at most {ctx.get('max_length')} items"
    return None


def parse_request(model: type[T], body: dict[str, Any]) -> T:
    """`body` as `model`; the first problem is a 400 naming its top-level field. Of a union's
    several errors, the one deepest in the body says most (the member the value was meant
    for); wrong types at one place are named together ("must be a string or a list")."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        found = e.errors(include_url=False)
        errs = [x for x in found if x["loc"][:1] == found[0]["loc"][:1]]
        err = max(errs, key=lambda x: len(_where(x)))
        top = err["loc"][:1]
        message = _agent_message(err)
        kinds = dict.fromkeys(
            _TYPES[x["type"]] for x in errs if _where(x) == _where(err) and x["type"] in _TYPES
        )
        if len(kinds) > 1 and err["input"] is not None:
            message = f"{_quoted(err)} must be {' or '.join(kinds)}"
        raise ApiError(400, message, param=str(top[0]) if top else None) from None


# A union's members add their names to an error's path ("str", "list[...]", "type=text"):
# only field names and indexes are kept.
_MEMBERS = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


def _where(err: ErrorDetails) -> tuple[int | str, ...]:
    return tuple(
        p
        for p in err["loc"]
        if isinstance(p, int) or (re.fullmatch(r"\w+", p) and p not in _MEMBERS)
    )


def _quoted(err: ErrorDetails) -> str:
    out = ""
    for part in _where(err):
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return f"'{out}'" if out else "the body"


_TYPES = {
    "string_type": "a string",
    "bool_type": "true or false",
    "int_type": "a whole number",
    "float_type": "a number",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def _agent_message(err: ErrorDetails) -> str:
    kind, ctx, where = err["type"], err.get("ctx") or {}, _quoted(err)
    if kind == "agent_whole":
        return err["msg"]
    if kind == "agent":
        return f"{where} {err['msg']}"
    if err["input"] is None and kind in _TYPES:
        return f"{where} is required"  # null stands for absent
    texts = {
        "missing": "is required",
        "finite_number": "must be a number",
        "too_short": "must not be empty",
        "string_too_short": "must not be empty",
        "greater_than_equal": f"must be at least {_fmt(ctx.get('ge'))}",
        "less_than_equal": f"must be at most {_fmt(ctx.get('le'))}",
        "greater_than": f"must be greater than {_fmt(ctx.get('gt'))}",
        "too_long": f"takes at most {ctx.get('max_length')} items",
        "string_pattern_mismatch": f"must match {ctx.get('pattern')}",
        "literal_error": f"must be one of {ctx.get('expected')}",
        "extra_forbidden": UNKNOWN,
    }
    text = (
        f"must be {_TYPES[kind]}"
        if kind in _TYPES
        else texts.get(kind) or re.sub(r"^Input should", "should", err["msg"].split("\n")[0])
    )
    return f"{where} {text}"
