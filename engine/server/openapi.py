"""The server's OpenAPI 3.0 description, served at /openapi.json and fuzzed by the tests.

Written by hand to match what the routes accept and answer (the parsers in `parsing.py`);
the request schemas describe the supported subset of the OpenAI and Ollama APIs.
"""

from __future__ import annotations

from typing import Any

from engine.server.config import ServerConfig
from engine.server.parsing import MAX_EMBED_INPUTS, ROLES

_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_OBJ = {"type": "object"}

OPENAI_ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type"],
        "properties": {"message": _STR, "type": _STR,
                       "param": {"type": "string", "nullable": True},
                       "code": {"type": "string", "nullable": True}}}},
}
OLLAMA_ERROR = {"type": "object", "required": ["error"], "properties": {"error": _STR}}

_STOP = {"oneOf": [{"type": "string"},
                   {"type": "array", "items": {"type": "string"}, "maxItems": 16}]}
_SEED = {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1}

_SAMPLING = {
    "model": _STR,
    "max_tokens": {"type": "integer", "minimum": 1,
                   "description": "capped at the server's max_tokens limit"},
    "max_completion_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1, "exclusiveMinimum": True},
    "top_k": {"type": "integer", "minimum": 0},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "repeat_penalty": {"type": "number", "minimum": 0.01, "maximum": 10},
    "seed": _SEED,
    "stop": _STOP,
    "n": {"type": "integer", "enum": [1]},
    "stream": _BOOL,
    "stream_options": {"type": "object", "properties": {"include_usage": _BOOL}},
}

_MESSAGES = {
    "type": "array", "minItems": 1,
    "items": {"type": "object", "required": ["role"],
              "properties": {"role": {"type": "string", "enum": list(ROLES)},
                             "content": {"type": "string", "nullable": True}}},
}

_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
          "properties": {"prompt_tokens": _INT, "completion_tokens": _INT,
                         "total_tokens": _INT}}
_FINISH = {"type": "string", "enum": ["stop", "length"]}

CHAT_COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": _STR, "object": {"type": "string", "enum": ["chat.completion"]},
        "created": _INT, "model": _STR, "usage": _USAGE,
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["index", "message", "finish_reason"],
            "properties": {"index": _INT, "finish_reason": _FINISH,
                           "message": {"type": "object", "required": ["role", "content"],
                                       "properties": {"role": _STR, "content": _STR}}}}},
    },
}
TEXT_COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": _STR, "object": {"type": "string", "enum": ["text_completion"]},
        "created": _INT, "model": _STR, "usage": _USAGE,
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["index", "text", "finish_reason"],
            "properties": {"index": _INT, "text": _STR, "finish_reason": _FINISH}}},
    },
}
MODEL = {"type": "object", "required": ["id", "object", "created", "owned_by"],
         "properties": {"id": _STR, "object": {"type": "string", "enum": ["model"]},
                        "created": _INT, "owned_by": _STR, "meta": _OBJ}}
EMBEDDINGS = {
    "type": "object", "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": _STR, "model": _STR, "usage": _OBJ,
        "data": {"type": "array", "items": {
            "type": "object", "required": ["object", "index", "embedding"],
            "properties": {"object": _STR, "index": _INT,
                           "embedding": {"oneOf": [{"type": "array", "items": _NUM},
                                                   _STR]}}}},
    },
}
_EMBED_INPUT = {"oneOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "minItems": 1, "maxItems": MAX_EMBED_INPUTS,
     "items": {"type": "string", "minLength": 1}}]}

_OLLAMA_OPTIONS = {"type": "object", "properties": {
    "num_predict": _INT,
    "temperature": {"type": "number", "minimum": 0, "maximum": 100},
    "top_p": {"type": "number", "minimum": 0.000001, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "repeat_penalty": {"type": "number", "minimum": 0.01, "maximum": 10},
    "seed": _SEED,
    "stop": _STOP,
}}
_OLLAMA_DONE = {
    "type": "object", "required": ["model", "created_at", "done"],
    "properties": {"model": _STR, "created_at": _STR, "done": _BOOL, "response": _STR,
                   "done_reason": _STR, "total_duration": _INT, "eval_count": _INT,
                   "prompt_eval_count": _INT,
                   "message": {"type": "object", "properties": {"role": _STR,
                                                                "content": _STR}}},
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _errors(ollama: bool, *codes: int) -> dict[str, Any]:
    err = OLLAMA_ERROR if ollama else OPENAI_ERROR
    text = {400: "Invalid request", 401: "Missing or invalid API key",
            404: "Not found", 413: "Request body too large", 429: "Queue full; see Retry-After",
            501: "Not enabled on this server", 503: "Model loading"}
    return {str(c): {"description": text[c], "content": _json(err)} for c in codes}


def _nullable_optional(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy where every optional property also accepts null: the parsers treat an explicit
    null like an absent field, as OpenAI's API does."""
    out = dict(schema)
    props = schema.get("properties")
    if isinstance(props, dict):
        required = set(schema.get("required", []))
        new: dict[str, Any] = {}
        for name, sub in props.items():
            sub = _nullable_optional(sub)
            if name not in required:
                sub = {**sub, "nullable": True}
                if "enum" in sub:  # OpenAPI 3.0: a nullable enum must list null itself
                    sub["enum"] = [*sub["enum"], None]
            new[name] = sub
        out["properties"] = new
    if isinstance(schema.get("items"), dict):
        out["items"] = _nullable_optional(schema["items"])
    return out


def _post(summary: str, body: dict[str, Any], ok: dict[str, Any], *, ollama: bool = False
          ) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": _json(_nullable_optional(body))},
        "responses": {"200": {"description": "OK", "content": ok},
                      **_errors(ollama, 400, 401, 413, 429, 503)},
    }}


def _get(summary: str, ok: dict[str, Any], *, ollama: bool = False, auth: bool = True,
         extra: tuple[int, ...] = ()) -> dict[str, Any]:
    codes = (401, 503, *extra) if auth else (503, *extra)
    return {"get": {"summary": summary,
                    "responses": {"200": {"description": "OK", "content": ok},
                                  **_errors(ollama, *codes)}}}


def openapi_schema(cfg: ServerConfig) -> dict[str, Any]:
    sse = {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"],
        "properties": {"data": _STR, "event": _STR, "id": _STR}}}}
    ndjson = {"application/x-ndjson": {"schema": _STR}}
    paths: dict[str, Any] = {
        "/v1/models": _get("List the served model", _json(
            {"type": "object", "required": ["object", "data"],
             "properties": {"object": _STR, "data": {"type": "array", "items": MODEL}}})),
        "/v1/models/{model_id}": {"get": {
            "summary": "Describe a model",
            "parameters": [{"name": "model_id", "in": "path", "required": True,
                            "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]+$"}}],
            "responses": {"200": {"description": "OK", "content": _json(MODEL)},
                          **_errors(False, 401, 404, 503)}}},
        "/v1/chat/completions": _post(
            "Chat completion (stream=true: server-sent events ending with data: [DONE])",
            {"type": "object", "required": ["messages"],
             "properties": {"messages": _MESSAGES, **_SAMPLING}},
            {**_json(CHAT_COMPLETION), **sse}),
        "/v1/completions": _post(
            "Text completion (no chat template)",
            {"type": "object", "required": ["prompt"],
             "properties": {"prompt": {"type": "string", "minLength": 1},
                            **_SAMPLING}},
            {**_json(TEXT_COMPLETION), **sse}),
        "/v1/embeddings": _post(
            "Embeddings (mean-pooled, L2-normalised)",
            {"type": "object", "required": ["input"],
             "properties": {"input": _EMBED_INPUT, "model": _STR,
                            "encoding_format": {"type": "string",
                                                "enum": ["float", "base64"]}}},
            _json(EMBEDDINGS)),
        "/api/version": _get("Server version", _json(
            {"type": "object", "required": ["version"], "properties": {"version": _STR}}),
            ollama=True),
        "/api/tags": _get("List the served model (Ollama)", _json(
            {"type": "object", "required": ["models"],
             "properties": {"models": {"type": "array", "items": _OBJ}}}), ollama=True),
        "/api/show": _post(
            "Model details (Ollama)",
            {"type": "object", "required": ["model"], "properties": {"model": _STR}},
            _json({"type": "object", "required": ["details", "model_info"],
                   "properties": {"details": _OBJ, "model_info": _OBJ, "template": _STR,
                                  "modelfile": _STR}}), ollama=True),
        "/api/chat": _post(
            "Chat (Ollama; NDJSON stream unless stream=false)",
            {"type": "object", "required": ["model", "messages"],
             "properties": {"model": _STR, "messages": _MESSAGES, "stream": _BOOL,
                            "options": _OLLAMA_OPTIONS}},
            {**_json(_OLLAMA_DONE), **ndjson}, ollama=True),
        "/api/generate": _post(
            "Generate (Ollama; NDJSON stream unless stream=false)",
            {"type": "object", "required": ["model"],
             "properties": {"model": _STR, "prompt": _STR,
                            "system": _STR, "raw": _BOOL, "stream": _BOOL,
                            "options": _OLLAMA_OPTIONS}},
            {**_json(_OLLAMA_DONE), **ndjson}, ollama=True),
        "/api/embed": _post(
            "Embeddings (Ollama)",
            {"type": "object", "required": ["model", "input"],
             "properties": {"model": _STR, "input": _EMBED_INPUT}},
            _json({"type": "object", "required": ["embeddings"],
                   "properties": {"model": _STR, "embeddings": {
                       "type": "array", "items": {"type": "array", "items": _NUM}}}}),
            ollama=True),
        "/health": {"get": {"summary": "Readiness (no key needed)", "security": [],
                            "responses": {"200": {"description": "Ready", "content": _json(_OBJ)},
                                          "503": {"description": "Loading",
                                                  "content": _json(_OBJ)}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics",
                             "responses": {"200": {"description": "OK",
                                                   "content": {"text/plain": {"schema": _STR}}},
                                           **_errors(False, 401)}}},
    }
    paths["/v1/embeddings"]["post"]["responses"].update(_errors(False, 501))
    paths["/api/embed"]["post"]["responses"].update(_errors(True, 501))
    schema: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {"title": "Candlewick local inference server", "version": "0.1.0",
                 "description": "OpenAI- and Ollama-compatible API on a local model."},
        "paths": paths,
    }
    if cfg.api_key:
        schema["components"] = {"securitySchemes": {"bearer": {"type": "http",
                                                               "scheme": "bearer"}}}
        schema["security"] = [{"bearer": []}]
    return schema
