"""The server's OpenAPI 3.1 description, served at /openapi.json and fuzzed by the tests.

`PATHS` is the table of routes: each operation names its request model (the one its route
hands to `parse_body`), its answers' models by media type and its error shape. The schemas
come from those pydantic models (the `protocol` package), their shared parts hoisted into
`components/schemas`; a new route is one more row. `AGENT_PATHS` are the agents' APIs
(`protocol.responses`, `protocol.anthropic`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from engine.server.config import ServerConfig
from engine.server.protocol import (
    anthropic,
    base,
    embeddings,
    hosting,
    infill,
    llama,
    llama_utility,
    lora,
    ollama,
    openai,
    responses,
    speech,
    transcription,
)
from engine.server.protocol.ollama_models import (
    OllamaCopyRequest,
    OllamaCreateRequest,
    OllamaDeleteRequest,
    OllamaPullRequest,
    OllamaStatus,
)
from engine.server.rerank_routes import RERANK_PATHS

_REF = "#/components/schemas/{model}"
JSON, SSE, NDJSON, TEXT = (
    "application/json",
    "text/event-stream",
    "application/x-ndjson",
    "text/plain",
)
_ERROR_TEXT = {
    400: "Invalid request",
    401: "Missing or invalid API key",
    403: "The Hub refuses access (a gated repository)",
    404: "Not found",
    413: "Request body too large",
    429: "Queue full; see Retry-After",
    409: "Held by a client of the app",
    500: "Failed (the error says why)",
    501: "Not enabled on this server",
    503: "Model loading, or no room to load it",
}

# A media type's schema: a model, or None for plain text (Prometheus, NDJSON lines).
Media = Mapping[str, type[BaseModel] | None]
# A body can be refused, name no model the server knows, be too large or queued past the
# limit; any route needs the key and, but for /health and /metrics, a model.
DEFAULT_ERRORS = {"post": (400, 401, 404, 413, 429, 503), "get": (401, 503)}


@dataclass(frozen=True)
class Operation:
    method: Literal["get", "post", "delete"]
    summary: str
    ok: Media  # the 200 answer
    body: type[BaseModel] | None = None  # the request body (POST)
    error: type[BaseModel] = openai.OpenAIError  # the shape of every error answer
    # Error statuses; None: what a route of its method may answer (`DEFAULT_ERRORS`).
    errors: tuple[int, ...] | None = None
    also: tuple[int, ...] = ()  # error statuses besides those
    # Answers other than 200 that are not in `error`'s shape: status -> (text, media).
    answers: Mapping[int, tuple[str, Media]] = field(default_factory=dict)
    secured: bool = True  # False: no key needed
    body_required: bool = True
    parameters: tuple[dict[str, Any], ...] = ()
    ok_text: str = "OK"
    # The models of a stream's events: each server-sent event's `data` is one of them, but
    # for a last one that is not JSON (`done`: OpenAI's [DONE]).
    events: tuple[type[BaseModel], ...] = ()
    done: str | None = None
    body_media: str = "application/json"  # the body's media type (multipart/form-data: a form)

    def codes(self) -> tuple[int, ...]:
        base = DEFAULT_ERRORS[self.method] if self.errors is None else self.errors
        return (*base, *self.also)

    def models(self) -> list[type[BaseModel]]:
        media = [self.ok, *(m for _, m in self.answers.values())]
        return [
            m
            for m in (
                self.body,
                self.error,
                *(x for d in media for x in d.values()),
                *self.events,
            )
            if m is not None
        ]


_MODEL_ID = {
    "name": "model_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]+$"},
}
_SLOT_ID = {
    "name": "id_slot",
    "in": "path",
    "required": True,
    "description": "the slot's number (GET /slots lists them)",
    "schema": {"type": "integer", "minimum": 0},
}
_SLOT_ACTION = {
    "name": "action",
    "in": "query",
    "required": True,
    "schema": {"enum": ["save", "restore", "erase"]},
}
# llama-server's routes for code editors (engine.server.infill_routes, slot_routes).
EDITOR_PATHS: dict[str, Operation] = {
    "/infill": Operation(
        "post",
        "Code fill-in-the-middle (llama-server's; stream=true: server-sent events of partial "
        "results, the last one with stop: true and the whole answer's fields)",
        {JSON: infill.InfillAnswer, SSE: base.ServerSentEvent},
        infill.InfillRequest,
        llama.LlamaError,
        events=(infill.InfillChunkEvent, infill.InfillAnswer, llama.LlamaError),
    ),
    "/slots/{id_slot}": Operation(
        "post",
        "Save a slot's prompt state to a file, restore it, or erase the slot (llama-server's; "
        "save and restore take {filename}; needs --slot-save-path)",
        {JSON: infill.SlotActionAnswer},
        infill.SlotFileRequest,
        llama.LlamaError,
        errors=(400, 401, 404, 413, 501, 503),
        body_required=False,
        parameters=(_SLOT_ID, _SLOT_ACTION),
    ),
}


_QUERY_MODEL = {
    "name": "model",
    "in": "query",
    "required": False,
    "description": "a model's id, alias or file name (absent: the default)",
    "schema": {"type": "string"},
}
_FAIL_ON_NO_SLOT = {
    "name": "fail_on_no_slot",
    "in": "query",
    "required": False,
    "description": "1: a 503 when every slot is busy (llama-server's)",
    "schema": {"type": "string"},
}
_AUTOLOAD = {
    "name": "autoload",
    "in": "query",
    "required": False,
    "description": "false: answer only from a model already loaded (a 400 otherwise)",
    "schema": {"enum": ["true", "false", "1", "0"]},
}
# llama-server's utility routes (engine.server.llama_routes), in its shapes.
LLAMA_PATHS: dict[str, Operation] = {
    "/tokenize": Operation(
        "post",
        "Tokenize text with a model's vocabulary (llama-server's)",
        {JSON: llama_utility.TokenizeAnswer},
        llama_utility.TokenizeRequest,
        llama.LlamaError,
    ),
    "/detokenize": Operation(
        "post",
        "Token ids back to text (llama-server's)",
        {JSON: llama_utility.DetokenizeAnswer},
        llama_utility.DetokenizeRequest,
        llama.LlamaError,
    ),
    "/apply-template": Operation(
        "post",
        "The prompt a chat is sent as: its messages through the model's chat template "
        "(llama-server's)",
        {JSON: llama_utility.ApplyTemplateAnswer},
        llama_utility.ApplyTemplateRequest,
        llama.LlamaError,
    ),
    "/slots": Operation(
        "get",
        "Every slot of the model, with the request it serves (llama-server's shape; "
        "fail_on_no_slot=1: a 503 while none is idle)",
        {JSON: infill.SlotList},
        error=llama.LlamaError,
        errors=(400, 401, 404, 503),
        parameters=(_QUERY_MODEL, _FAIL_ON_NO_SLOT),
    ),
    "/props": Operation(
        "get",
        "The served model's properties and a request's defaults (llama-server's)",
        {JSON: llama_utility.Props},
        error=llama.LlamaError,
        errors=(400, 401, 404, 503),
        parameters=(_QUERY_MODEL, _AUTOLOAD),
    ),
}
# The served model's LoRA adapters (engine.server.lora_routes), in llama-server's shapes.
LORA_PATHS: dict[str, Operation] = {
    "/lora-adapters": Operation(
        "get",
        "The served model's LoRA adapters and the scales requests get by default (llama-server's)",
        {JSON: lora.LoraAdapters},
        error=llama.LlamaError,
    ),
}
# A path's second method (the table holds one per path): POST /lora-adapters.
SECOND_METHODS: dict[str, Operation] = {
    "/lora-adapters": Operation(
        "post",
        "Set the LoRA adapters' default scales: those listed, the others 0 (llama-server's)",
        {JSON: lora.LoraApplied},
        lora.LoraScales,
        llama.LlamaError,
        errors=(400, 401, 413, 503),
    ),
}
# Ollama streams one OllamaReply per line.
_OLLAMA_REPLY: Media = {JSON: ollama.OllamaReply, NDJSON: None}

PATHS: dict[str, Operation] = {
    "/v1/models": Operation(
        "get", "List the models (loaded: true for those in memory)", {JSON: hosting.ModelList}
    ),
    "/v1/models/{model_id}": Operation(
        "get", "Describe a model", {JSON: hosting.ModelCard}, also=(404,), parameters=(_MODEL_ID,)
    ),
    "/v1/models/{model_id}/load": Operation(
        "post",
        "Load a model now (optional body: keep_alive, pinned)",
        {JSON: hosting.HostedModelState},
        hosting.LoadModelRequest,
        body_required=False,
        parameters=(_MODEL_ID,),
    ),
    "/v1/models/{model_id}/unload": Operation(
        "post",
        "Unload a model (202: when its requests in flight end)",
        {JSON: hosting.HostedModelState},
        errors=(401, 404, 409),
        parameters=(_MODEL_ID,),
        answers={202: ("Unloading when idle", {JSON: hosting.HostedModelState})},
    ),
    "/v1/chat/completions": Operation(
        "post",
        "Chat completion (stream=true: server-sent events ending with data: [DONE])",
        {JSON: openai.ChatCompletion, SSE: base.ServerSentEvent},
        openai.ChatCompletionRequest,
        events=(openai.ChatCompletionChunk, openai.OpenAIError),
        done="[DONE]",
    ),
    "/v1/completions": Operation(
        "post",
        "Text completion (no chat template)",
        {JSON: openai.TextCompletion, SSE: base.ServerSentEvent},
        openai.CompletionRequest,
        events=(openai.TextCompletionChunk, openai.OpenAIError),
        done="[DONE]",
    ),
    "/v1/embeddings": Operation(
        "post",
        "Embeddings (mean-pooled, L2-normalised)",
        {JSON: embeddings.EmbeddingList},
        embeddings.EmbeddingRequest,
        also=(501,),
    ),
    **{
        path: Operation(
            "post",
            "Rerank documents by relevance to a query (a reranker GGUF: pooling rank)"
            + ("" if path == "/v1/rerank" else "; another name of /v1/rerank"),
            {JSON: embeddings.RerankList},
            embeddings.RerankRequest,
            also=(501,),
        )
        for path in RERANK_PATHS
    },
    "/v1/audio/speech": Operation(
        "post",
        "Speech of a text (OpenAI's text to speech): the whole file, MP3 unless asked",
        {media: None for media in speech.CONTENT_TYPES.values()},
        speech.SpeechRequest,
        errors=(400, 401, 413, 500),
    ),
    "/v1/audio/voices": Operation(
        "get", "The voices /v1/audio/speech takes", {JSON: speech.VoiceList}, errors=(401,)
    ),
    **{
        path: Operation(
            "post",
            summary,
            {JSON: transcription.TranscriptionAnswer}
            | {media: None for media in transcription.TEXT_TYPES.values()},
            body,
            body_media="multipart/form-data",
            errors=(400, 401, 413, 500),
        )
        for path, summary, body in (
            (
                "/v1/audio/transcriptions",
                "Text of speech (OpenAI's speech to text), with the server's --stt-model",
                transcription.TranscriptionUpload,
            ),
            (
                "/v1/audio/translations",
                "English text of speech in any language, with the server's --stt-model",
                transcription.TranslationUpload,
            ),
        )
    },
    "/api/version": Operation(
        "get", "Server version", {JSON: ollama.OllamaVersion}, error=ollama.OllamaError
    ),
    "/api/tags": Operation(
        "get", "List the models (Ollama)", {JSON: ollama.OllamaTags}, error=ollama.OllamaError
    ),
    "/api/ps": Operation(
        "get",
        "The loaded models, their memory and expiry (Ollama)",
        {JSON: ollama.OllamaRunning},
        error=ollama.OllamaError,
        errors=(401,),
    ),
    "/api/show": Operation(
        "post",
        "Model details (Ollama)",
        {JSON: ollama.OllamaShowResponse},
        ollama.OllamaShowRequest,
        ollama.OllamaError,
    ),
    "/api/chat": Operation(
        "post",
        "Chat (Ollama; NDJSON stream unless stream=false)",
        _OLLAMA_REPLY,
        ollama.OllamaChatRequest,
        ollama.OllamaError,
    ),
    "/api/generate": Operation(
        "post",
        "Generate (Ollama; NDJSON stream unless stream=false)",
        _OLLAMA_REPLY,
        ollama.OllamaGenerateRequest,
        ollama.OllamaError,
    ),
    "/api/embed": Operation(
        "post",
        "Embeddings (Ollama)",
        {JSON: ollama.OllamaEmbedResponse},
        ollama.OllamaEmbedRequest,
        ollama.OllamaError,
        also=(501,),
    ),
    # Ollama's model management (engine.server.library_routes): 501 without a library.
    "/api/pull": Operation(
        "post",
        "Download a model from the Hugging Face Hub, hf.co/owner/repo:QUANT (Ollama; NDJSON "
        "progress unless stream=false)",
        {JSON: OllamaStatus, NDJSON: None},
        OllamaPullRequest,
        ollama.OllamaError,
        errors=(400, 401, 403, 404, 413, 500, 501, 503),
    ),
    "/api/delete": Operation(
        "delete",
        "Delete a model: its file where Candlewick owns it (Ollama)",
        {},
        OllamaDeleteRequest,
        ollama.OllamaError,
        errors=(400, 401, 404, 409, 413, 501),
    ),
    "/api/copy": Operation(
        "post",
        "Another name for a model, the same file (Ollama)",
        {},
        OllamaCopyRequest,
        ollama.OllamaError,
        errors=(400, 401, 404, 413, 501),
    ),
    "/api/create": Operation(
        "post",
        "A model over another: its system prompt, parameters and first messages (Ollama; "
        "NDJSON status lines unless stream=false)",
        {JSON: OllamaStatus, NDJSON: None},
        OllamaCreateRequest,
        ollama.OllamaError,
        errors=(400, 401, 404, 413, 501),
    ),
    "/health": Operation(
        "get",
        "Readiness (no key needed)",
        {JSON: hosting.Health},
        errors=(),
        answers={503: ("Loading", {JSON: hosting.Health})},
        secured=False,
        ok_text="Ready",
    ),
    "/metrics": Operation("get", "Prometheus metrics", {TEXT: None}, errors=(401,)),
    **EDITOR_PATHS,
    **LLAMA_PATHS,
    **LORA_PATHS,
}

# The agents' APIs (protocol.responses, protocol.anthropic), documented with the rest.
AGENT_PATHS: dict[str, Operation] = {
    "/v1/responses": Operation(
        "post",
        "OpenAI Responses API (stream=true: its named server-sent events)",
        {JSON: responses.ResponseObject, SSE: base.ServerSentEvent},
        responses.ResponsesRequest,
        events=(
            responses.ResponsesStateEvent,
            responses.ResponsesItemEvent,
            responses.ResponsesPartEvent,
            responses.ResponsesTextDelta,
            responses.ResponsesTextDone,
            responses.ResponsesArgumentsDelta,
            responses.ResponsesArgumentsDone,
            responses.ResponsesErrorEvent,
        ),
    ),
    "/v1/messages": Operation(
        "post",
        "Anthropic Messages API (stream=true: its named server-sent events)",
        {JSON: anthropic.AnthropicReply, SSE: base.ServerSentEvent},
        anthropic.AnthropicMessagesRequest,
        anthropic.AnthropicError,
        events=(
            anthropic.AnthropicMessageStart,
            anthropic.AnthropicBlockStart,
            anthropic.AnthropicBlockDelta,
            anthropic.AnthropicBlockStop,
            anthropic.AnthropicMessageDelta,
            anthropic.AnthropicMessageStop,
            anthropic.AnthropicError,
        ),
    ),
    "/v1/messages/count_tokens": Operation(
        "post",
        "Anthropic token count of a prompt",
        {JSON: anthropic.AnthropicTokenCount},
        anthropic.AnthropicCountTokensRequest,
        anthropic.AnthropicError,
        errors=(400, 401, 404, 413, 503),
    ),
}


def _content(media: Media) -> dict[str, Any]:
    return {
        kind: {"schema": {"$ref": _REF.format(model=m.__name__)} if m else {"type": "string"}}
        for kind, m in media.items()
    }


def _operation(op: Operation, model_id: str) -> dict[str, Any]:
    err = _content({JSON: op.error})
    out: dict[str, Any] = {"summary": op.summary}
    if op.parameters:
        out["parameters"] = [
            {**prm, "examples": {"default": {"value": model_id}}}
            if prm is _MODEL_ID or prm is _QUERY_MODEL
            else prm
            for prm in op.parameters
        ]
    if op.body is not None:
        out["requestBody"] = {
            "required": op.body_required,
            "content": _content({op.body_media: op.body}),
        }
    ok = _content(op.ok)
    if op.events and SSE in ok:
        # Each event's data is JSON text, one of the stream's event models.
        events = {"anyOf": [{"$ref": _REF.format(model=m.__name__)} for m in op.events]}
        data: dict[str, Any] = {"contentMediaType": JSON, "contentSchema": events}
        if op.done is not None:
            data = {"anyOf": [{"const": op.done}, data]}
        ok[SSE]["schema"] = {**ok[SSE]["schema"], "properties": {"data": data}}
    out["responses"] = {
        "200": {"description": op.ok_text, "content": ok},
        **{
            str(c): {"description": text, "content": _content(media)}
            for c, (text, media) in op.answers.items()
        },
        **{str(c): {"description": _ERROR_TEXT[c], "content": err} for c in op.codes()},
    }
    if not op.secured:
        out["security"] = []
    return out


def _hoist(schemas: dict[str, Any], name: str, schema: dict[str, Any]) -> None:
    if schemas.setdefault(name, schema) != schema:
        # Two different models of one name would silently share one schema.
        raise RuntimeError(f"two different schemas are named {name}")


def _schemas(paths: Mapping[str, Operation]) -> dict[str, Any]:
    """The schema of every model the paths name, and of the models those use."""
    schemas: dict[str, Any] = {}
    for model in dict.fromkeys(m for op in paths.values() for m in op.models()):
        schema = model.model_json_schema(ref_template=_REF)
        for name, sub in schema.pop("$defs", {}).items():
            _hoist(schemas, name, sub)
        _hoist(schemas, model.__name__, schema)
    return dict(sorted(schemas.items()))


def _name_examples(schemas: dict[str, Any], model_id: str) -> None:
    """Every request's `model` names a model the server knows: the default one is the
    example (a made-up name is a 404, so a client, or a fuzzer, learns nothing from it)."""
    for schema in schemas.values():
        model = schema.get("properties", {}).get("model")
        if isinstance(model, dict) and "enum" not in model:  # not a speech model's name
            model["examples"] = [model_id]
            model.setdefault(
                "description", "a model's id, alias or file name (GET /v1/models lists them)"
            )


def openapi_schema(
    cfg: ServerConfig, paths: Mapping[str, Operation] | None = None
) -> dict[str, Any]:
    """The document of `paths` (all routes unless told, with `SECOND_METHODS`)."""
    also: Mapping[str, Operation] = {}
    if paths is None:
        paths, also = {**PATHS, **AGENT_PATHS}, SECOND_METHODS
    components: dict[str, Any] = {
        "schemas": _schemas({**paths, **{f"{p} {op.method}": op for p, op in also.items()}})
    }
    _name_examples(components["schemas"], cfg.model_id)
    schema: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "Candlewick local inference server",
            "version": "0.1.0",
            "description": "OpenAI-, Anthropic- and Ollama-compatible API on a local model.",
        },
        "paths": {path: {op.method: _operation(op, cfg.model_id)} for path, op in paths.items()},
        "components": components,
    }
    for path, op in also.items():
        schema["paths"][path][op.method] = _operation(op, cfg.model_id)
    if cfg.api_key:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        schema["security"] = [{"bearer": []}]
    return schema
