"""Reading and checking request bodies: every bad field becomes a 400 with a clear message."""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from starlette.requests import Request

from engine.server.errors import ApiError


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, at most `limit` bytes (413 beyond, checked while reading)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise ApiError(413, f"the request body is larger than {limit} bytes")
        except ValueError:
            raise ApiError(400, "invalid Content-Length header") from None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is larger than {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise ApiError(400, "the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


_MISSING = object()
MAX_EMBED_INPUTS = 64
ROLES = ("system", "developer", "user", "assistant", "tool")
Dialect = Literal["openai", "ollama"]


def get_str(body: dict[str, Any], key: str, default: str | None = None, *,
            required: bool = False) -> str | None:
    v = body.get(key, _MISSING)
    if v is _MISSING or v is None:
        if required:
            raise ApiError(400, f"'{key}' is required", param=key)
        return default
    if not isinstance(v, str):
        raise ApiError(400, f"'{key}' must be a string", param=key)
    return v


def get_bool(body: dict[str, Any], key: str, default: bool) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, f"'{key}' must be true or false", param=key)
    return v


def get_number(body: dict[str, Any], key: str, default: float | None, *,
               lo: float | None = None, hi: float | None = None) -> float | None:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ApiError(400, f"'{key}' must be a number", param=key)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ApiError(400, f"'{key}' must be between {lo} and {hi}", param=key)
    return float(v)


def get_int(body: dict[str, Any], key: str, default: int | None, *, lo: int | None = None,
            hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"'{key}' must be a whole number", param=key)
    if lo is not None and v < lo:
        raise ApiError(400, f"'{key}' must be at least {lo}", param=key)
    if hi is not None and v > hi:
        raise ApiError(400, f"'{key}' must be at most {hi}", param=key)
    return v


def get_stop(body: dict[str, Any], key: str = "stop") -> tuple[str, ...]:
    v = body.get(key)
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        if len(v) > 16:
            raise ApiError(400, f"'{key}' takes at most 16 strings", param=key)
        return tuple(x for x in v if x)
    raise ApiError(400, f"'{key}' must be a string or a list of strings", param=key)


def _text(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(
                    p.get("text"), str):
                raise ApiError(400, f"messages[{i}].content: only text parts are supported",
                               param="messages")
            parts.append(p["text"])
        return "".join(parts)
    raise ApiError(400, f"messages[{i}].content must be a string or a list of parts",
                   param="messages")


def _tool_calls(m: dict[str, Any], i: int, dialect: Dialect) -> list[dict[str, Any]]:
    """A history's tool calls, OpenAI-shaped (arguments as JSON text) whatever the dialect."""
    calls = m.get("tool_calls")
    if calls is None:
        return []
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise ApiError(400, f"{where} must be a list", param="messages")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(400, f"{where}[{j}] must have a function with a name",
                           param="messages")
        args = fn.get("arguments", {} if dialect == "ollama" else "{}")
        if isinstance(args, dict):
            args = json.dumps(args, ensure_ascii=False)
        elif not isinstance(args, str):
            raise ApiError(400, f"{where}[{j}].function.arguments must be "
                           f"{'an object' if dialect == 'ollama' else 'a JSON string'}",
                           param="messages")
        cid = c.get("id")
        out.append({"id": cid if isinstance(cid, str) and cid else f"call_{i}_{j}",
                    "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def get_messages(body: dict[str, Any], dialect: Dialect = "openai") -> list[dict[str, Any]]:
    """Chat messages, OpenAI-shaped whatever the dialect: role and text content (text parts
    joined), plus an assistant's `tool_calls` and `reasoning_content`, and a tool result's
    `tool_call_id` and `name`. Fields a message may carry that cannot be honoured (images)
    are refused by name."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise ApiError(400, f"messages[{i}] must be an object", param="messages")
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}",
                           param="messages")
        if m.get("images"):
            raise ApiError(400, f"messages[{i}].images: this model reads text only",
                           param="messages")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": _text(m.get("content"), i)}
        if role == "assistant":
            calls = _tool_calls(m, i, dialect)
            if calls:
                msg["tool_calls"] = calls
            thought = m.get("thinking" if dialect == "ollama" else "reasoning_content")
            if isinstance(thought, str) and thought:
                msg["reasoning_content"] = thought
        elif role == "tool":
            cid = m.get("tool_call_id")
            if isinstance(cid, str):
                msg["tool_call_id"] = cid
            name = m.get("tool_name" if dialect == "ollama" else "name")
            if isinstance(name, str):
                msg["name"] = name
        out.append(msg)
    return out
