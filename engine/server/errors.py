"""Errors as the two APIs shape them: OpenAI's error object and Ollama's `{"error": "..."}`."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_error", 501: "not_implemented", 503: "service_unavailable",
          504: "timeout"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def openai_error_body(status: int, message: str, param: str | None = None,
                      code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def error_response(path: str, status: int, message: str, *, param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None
                   ) -> JSONResponse:
    """OpenAI shape everywhere except the Ollama routes (`/api/...`)."""
    if path.startswith("/api/"):
        body: dict[str, Any] = {"error": message}
    else:
        body = openai_error_body(status, message, param, code)
    return JSONResponse(body, status_code=status, headers=headers)
