"""Errors as each API shapes them (each dialect's error model): OpenAI's error object,
Ollama's `{"error": "..."}` and Anthropic's `{"type": "error", "error": {"type", "message"}}`
(on /v1/messages*)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from engine.server.protocol.anthropic import AnthropicError, AnthropicErrorDetail
from engine.server.protocol.ollama import OllamaError
from engine.server.protocol.openai import OpenAIError, OpenAIErrorDetail

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented",
    503: "service_unavailable",
    504: "timeout",
}


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def openai_error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error")
    detail = OpenAIErrorDetail(message=message, type=kind, param=param, code=code)
    return OpenAIError(error=detail).wire()


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(status, "api_error")
    detail = AnthropicErrorDetail(type=kind, message=message)
    return AnthropicError(type="error", error=detail).wire()


def is_anthropic_path(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def error_response(
    path: str,
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """OpenAI shape everywhere except the Ollama routes (`/api/...`) and Anthropic's."""
    if path.startswith("/api/"):
        body = OllamaError(error=message).wire()
    elif is_anthropic_path(path):
        body = anthropic_error_body(status, message)
    else:
        body = openai_error_body(status, message, param, code)
    return JSONResponse(body, status_code=status, headers=headers)
