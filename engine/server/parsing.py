"""Reading a request body as a JSON object; `protocol.parse_body` then checks its fields."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from engine.server.errors import ApiError


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, at most `limit` bytes (413 beyond, checked while reading)."""
    body = await read_json_value(request, limit)
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


async def read_json_value(request: Request, limit: int) -> Any:
    """The body as any JSON value (a list, for llama-server's POST /lora-adapters)."""
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
    return body
