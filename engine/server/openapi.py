"""The server's OpenAPI 3.1 description, served at /openapi.json and fuzzed by the tests.

Request and response schemas come from the pydantic models in `protocol.py` (the ones
`parse_body` checks bodies with), their shared parts hoisted into `components/schemas`; this
module only lays out the paths, status codes and media types.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from engine.server import protocol as p
from engine.server.config import ServerConfig

_REF = "#/components/schemas/{model}"
_STR = {"type": "string"}

_REQUESTS: tuple[type[BaseModel], ...] = (
    p.ChatCompletionRequest, p.CompletionRequest, p.EmbeddingRequest, p.OllamaChatRequest,
    p.OllamaGenerateRequest, p.OllamaShowRequest, p.OllamaEmbedRequest)
_RESPONSES: tuple[type[BaseModel], ...] = (
    p.OpenAIError, p.OllamaError, p.ChatCompletion, p.TextCompletion, p.ServerSentEvent,
    p.ModelCard, p.ModelList, p.EmbeddingList, p.OllamaVersion, p.OllamaTags,
    p.OllamaShowResponse, p.OllamaReply, p.OllamaEmbedResponse, p.Health)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(model)}}


def _hoist(schemas: dict[str, Any], name: str, schema: dict[str, Any]) -> None:
    if schemas.setdefault(name, schema) != schema:
        # Two different models of one name would silently share one schema.
        raise RuntimeError(f"two different schemas are named {name}")


def _without_pending(node: Any) -> Any:
    """The schema without the properties marked PENDING (see protocol.py)."""
    if isinstance(node, list):
        return [_without_pending(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _without_pending(v) for k, v in node.items()}
    props = out.get("properties")
    if isinstance(props, dict):
        hidden = {k for k, v in props.items() if isinstance(v, dict) and v.get(
            "x-candlewick-pending")}
        out["properties"] = {k: v for k, v in props.items() if k not in hidden}
        if "required" in out:
            out["required"] = [k for k in out["required"] if k not in hidden]
    return out


def _refs(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*map(_refs, node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = {node["$ref"].rsplit("/", 1)[1]} if isinstance(node.get("$ref"), str) else set()
    return found.union(*map(_refs, node.values())) if node else found


def _schemas(paths: dict[str, Any]) -> dict[str, Any]:
    """Every model's schema and the models they use, less what no path reaches."""
    schemas: dict[str, Any] = {}
    for model in (*_REQUESTS, *_RESPONSES):
        schema = model.model_json_schema(ref_template=_REF)
        for name, sub in schema.pop("$defs", {}).items():
            _hoist(schemas, name, sub)
        _hoist(schemas, model.__name__, schema)
    schemas = _without_pending(schemas)
    # Hidden fields leave models (the tools' ones) that nothing refers to any more.
    reached, todo = set(), _refs(paths)
    while todo:
        name = todo.pop()
        reached.add(name)
        todo |= _refs(schemas[name]) - reached
    return {k: v for k, v in schemas.items() if k in reached}


def _errors(ollama: bool, *codes: int) -> dict[str, Any]:
    err = p.OllamaError if ollama else p.OpenAIError
    text = {400: "Invalid request", 401: "Missing or invalid API key",
            404: "Not found", 413: "Request body too large", 429: "Queue full; see Retry-After",
            501: "Not enabled on this server", 503: "Model loading"}
    return {str(c): {"description": text[c], "content": _json(err)} for c in codes}


def _post(summary: str, body: type[BaseModel], ok: dict[str, Any], *, ollama: bool = False,
          extra: tuple[int, ...] = ()) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": _json(body)},
        "responses": {"200": {"description": "OK", "content": ok},
                      **_errors(ollama, 400, 401, 413, 429, 503, *extra)},
    }}


def _get(summary: str, ok: type[BaseModel], *, ollama: bool = False) -> dict[str, Any]:
    return {"get": {"summary": summary,
                    "responses": {"200": {"description": "OK", "content": _json(ok)},
                                  **_errors(ollama, 401, 503)}}}


def openapi_schema(cfg: ServerConfig) -> dict[str, Any]:
    sse = {"text/event-stream": {"schema": _ref(p.ServerSentEvent)}}
    ndjson = {"application/x-ndjson": {"schema": _STR}}  # one OllamaReply per line
    paths: dict[str, Any] = {
        "/v1/models": _get("List the served model", p.ModelList),
        "/v1/models/{model_id}": {"get": {
            "summary": "Describe a model",
            "parameters": [{"name": "model_id", "in": "path", "required": True,
                            "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]+$"}}],
            "responses": {"200": {"description": "OK", "content": _json(p.ModelCard)},
                          **_errors(False, 401, 404, 503)}}},
        "/v1/chat/completions": _post(
            "Chat completion (stream=true: server-sent events ending with data: [DONE])",
            p.ChatCompletionRequest, {**_json(p.ChatCompletion), **sse}),
        "/v1/completions": _post("Text completion (no chat template)", p.CompletionRequest,
                                 {**_json(p.TextCompletion), **sse}),
        "/v1/embeddings": _post("Embeddings (mean-pooled, L2-normalised)", p.EmbeddingRequest,
                                _json(p.EmbeddingList), extra=(501,)),
        "/api/version": _get("Server version", p.OllamaVersion, ollama=True),
        "/api/tags": _get("List the served model (Ollama)", p.OllamaTags, ollama=True),
        "/api/show": _post("Model details (Ollama)", p.OllamaShowRequest,
                           _json(p.OllamaShowResponse), ollama=True),
        "/api/chat": _post("Chat (Ollama; NDJSON stream unless stream=false)",
                           p.OllamaChatRequest, {**_json(p.OllamaReply), **ndjson},
                           ollama=True),
        "/api/generate": _post("Generate (Ollama; NDJSON stream unless stream=false)",
                               p.OllamaGenerateRequest, {**_json(p.OllamaReply), **ndjson},
                               ollama=True),
        "/api/embed": _post("Embeddings (Ollama)", p.OllamaEmbedRequest,
                            _json(p.OllamaEmbedResponse), ollama=True, extra=(501,)),
        "/health": {"get": {"summary": "Readiness (no key needed)", "security": [],
                            "responses": {"200": {"description": "Ready",
                                                  "content": _json(p.Health)},
                                          "503": {"description": "Loading",
                                                  "content": _json(p.Health)}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics",
                             "responses": {"200": {"description": "OK",
                                                   "content": {"text/plain": {"schema": _STR}}},
                                           **_errors(False, 401)}}},
    }
    components: dict[str, Any] = {"schemas": _schemas(paths)}
    schema: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "Candlewick local inference server", "version": "0.1.0",
                 "description": "OpenAI- and Ollama-compatible API on a local model."},
        "paths": paths,
        "components": components,
    }
    if cfg.api_key:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        schema["security"] = [{"bearer": []}]
    return schema
