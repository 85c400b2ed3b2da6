"""Checking a body against its model, for every dialect: the first problem found is a 400
naming its field, in one line in the hand checks' style ("'temperature' must be between 0
and 2"). A check of the models words its own refusal with `body_model.refuse` (after the
field's path) or `refuse_whole` (complete as it is)."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from engine.server.body_model import REFUSED, REFUSED_WHOLE, UNKNOWN
from engine.server.errors import ApiError
from engine.server.protocol.base import PATTERN_TEXT

T = TypeVar("T", bound=BaseModel)


def parse_body(model: type[T], body: dict[str, Any] | list[Any]) -> T:
    """`body` as `model`; the first problem is a 400 naming its top-level field. Of several
    errors at one field, the one deepest in the body says most (the union's member the value
    was meant for, an unknown key inside it); wrong types at one place are named together
    ("must be a string or a list")."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        found = e.errors(include_url=False)
        errs = [x for x in found if x["loc"][:1] == found[0]["loc"][:1]]
        err = max(errs, key=lambda x: len(_where(x)))
        top = err["loc"][:1]
        message = _message(err)
        kinds = dict.fromkeys(
            _TYPES[x["type"]] for x in errs if _where(x) == _where(err) and x["type"] in _TYPES
        )
        if len(kinds) > 1 and err["input"] is not None:
            message = f"{_quoted(err)} must be {' or '.join(kinds)}"
        raise ApiError(400, message, param=str(top[0]) if top else None) from None


def _fmt(x: Any) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


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


def _message(err: ErrorDetails) -> str:
    kind, ctx, where = err["type"], err.get("ctx") or {}, _quoted(err)
    if kind == REFUSED_WHOLE:
        return err["msg"]
    if kind == REFUSED:
        return f"{where} {err['msg']}"
    if err["input"] is None and kind in _TYPES:
        return f"{where} is required"  # null stands for absent, and this field must be there
    if kind in _TYPES:
        return f"{where} must be {_TYPES[kind]}"
    text = _texts(kind, ctx) or re.sub(r"^Input should", "should", err["msg"].split("\n")[0])
    return f"{where} {text}"


def _texts(kind: str, ctx: dict[str, Any]) -> str | None:
    if kind in ("missing", "finite_number", "extra_forbidden", "string_too_short"):
        return {
            "missing": "is required",
            "finite_number": "must be a number",
            "extra_forbidden": UNKNOWN,
            "string_too_short": "must not be empty",
        }[kind]
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
    if kind == "too_short":
        n = ctx.get("min_length")
        return "must not be empty" if n == 1 else f"takes at least {n} items"
    if kind == "too_long":
        return f"takes at most {ctx.get('max_length')} items"
    return None
