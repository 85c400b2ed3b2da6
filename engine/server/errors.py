"""Errors as each API shapes them (each dialect's error model): OpenAI's error object,
Ollama's `{"error": "..."}`, Anthropic's `{"type": "error", "error": {"type", "message"}}`
(on /v1/messages*) and llama-server's `{"error": {"code", "message", "type"}}` (on its own
routes, and for a route the server does not have)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from engine.server.protocol.anthropic import AnthropicError, AnthropicErrorDetail
from engine.server.protocol.llama import LlamaError, LlamaErrorDetail
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


# llama-server's names (`format_error_response`) for the statuses these routes answer.
_LLAMA_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    501: "not_supported_error",
    503: "unavailable_error",
}

# llama-server's own routes (engine.server.llama_routes): their errors are in its shape.
LLAMA_PATHS = frozenset(
    {
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/props",
        "/infill",
        "/lora-adapters",
        "/slots",
    }
)
LLAMA_PREFIXES = ("/slots/",)  # its slot actions (engine.server.slot_routes)


def llama_error_body(status: int, message: str) -> dict[str, Any]:
    kind = _LLAMA_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return LlamaError(error=LlamaErrorDetail(code=status, message=message, type=kind)).wire()


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
    llama: bool = False,
) -> JSONResponse:
    """OpenAI shape everywhere except the Ollama routes (`/api/...`), Anthropic's and
    llama-server's own (or, `llama`, an answer in its shape elsewhere: a route not here)."""
    if path.startswith("/api/"):
        body = OllamaError(error=message).wire()
    elif is_anthropic_path(path):
        body = anthropic_error_body(status, message)
    elif llama or path in LLAMA_PATHS or path.startswith(LLAMA_PREFIXES):
        body = llama_error_body(status, message)
    else:
        body = openai_error_body(status, message, param, code)
    return JSONResponse(body, status_code=status, headers=headers)
