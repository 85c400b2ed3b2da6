"""The request models the routes read their bodies with, and the OpenAPI document built
from them.

Each row is a body and what `parse_body` makes of it: accepted, or refused naming the field
the 400 reports (its `param`, always a top-level field). The rows began as a comparison with
the hand-written checks the routes used before, and keep their decisions. Checks that need the
loaded model (a template, a grammar compiled for its vocabulary) are the routes' own and are
tested through the server.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, Literal, get_args

import jsonschema
import pytest
from pydantic import BaseModel

from engine.model.templates import VALID_ROLES
from engine.server import ServerConfig
from engine.server.errors import ApiError
from engine.server.openapi import PATHS, openapi_schema
from engine.server.protocol.base import MAX_TOOLS
from engine.server.protocol.embeddings import EmbeddingRequest, RerankRequest
from engine.server.protocol.hosting import LoadModelRequest
from engine.server.protocol.infill import InfillRequest, SlotFileRequest
from engine.server.protocol.llama_utility import (
    ApplyTemplateRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from engine.server.protocol.messages import Role, Tool
from engine.server.protocol.ollama import (
    OllamaChatRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaMessage,
    OllamaOptions,
    OllamaShowRequest,
    OllamaToolCall,
)
from engine.server.protocol.ollama_models import (
    OllamaCopyRequest,
    OllamaCreateRequest,
    OllamaDeleteRequest,
    OllamaPullRequest,
)
from engine.server.protocol.openai import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    NamedToolChoice,
    ResponseFormat,
    ToolCall,
)
from engine.server.protocol.parse import parse_body
from engine.server.protocol.speech import SpeechRequest
from engine.server.protocol.transcription import TranscriptionUpload, TranslationUpload
from tests.engine.server.conftest import open_document

ROUTES: dict[str, type[BaseModel]] = {
    "chat": ChatCompletionRequest,
    "completions": CompletionRequest,
    "embeddings": EmbeddingRequest,
    "rerank": RerankRequest,
    "ollama_chat": OllamaChatRequest,
    "ollama_generate": OllamaGenerateRequest,
    "ollama_show": OllamaShowRequest,
    "ollama_embed": OllamaEmbedRequest,
    "load_model": LoadModelRequest,
    "ollama_pull": OllamaPullRequest,
    "ollama_delete": OllamaDeleteRequest,
    "ollama_copy": OllamaCopyRequest,
    "ollama_create": OllamaCreateRequest,
    "tokenize": TokenizeRequest,
    "detokenize": DetokenizeRequest,
    "apply_template": ApplyTemplateRequest,
    "infill": InfillRequest,
    "slot_file": SlotFileRequest,
    "speech": SpeechRequest,
    "transcription": TranscriptionUpload,
    "translation": TranslationUpload,
}
OK: Literal[True] = True
WHOLE = ""  # refused by a rule about the body as a whole: no param

M = [{"role": "user", "content": "Hi"}]
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "Look it up.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "Sunny"},
]
OLLAMA_HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "thinking": "Look it up.",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "tool_name": "get_weather", "content": "Sunny"},
]

# (route, body, OK or the param of the refusal)
Row = tuple[str, dict[str, Any], Literal[True] | str]
ROWS: list[Row] = [
    # -- /v1/chat/completions: what it took before tools --
    ("chat", {"messages": M}, OK),
    (
        "chat",
        {
            "messages": M,
            "model": "smollm2",
            "n": 1,
            "max_tokens": 5,
            "temperature": 0,
            "top_p": 1,
            "top_k": 0,
            "min_p": 0,
            "repeat_penalty": 0.01,
            "seed": -(2**63),
            "stop": ["a", ""],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        OK,
    ),
    (
        "chat",
        {
            "messages": M,
            "temperature": None,
            "top_p": None,
            "seed": 2**64 - 1,
            "stop": None,
            "stream_options": None,
            "n": None,
        },
        OK,
    ),
    ("chat", {"messages": M, "unknown": {"x": 1}}, "unknown"),
    (
        "chat",
        {
            "messages": [
                {
                    "role": "developer",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "user", "content": None},
            ]
        },
        OK,
    ),
    ("chat", {"messages": [{"role": "user", "content": None, "extra": 1}]}, "messages"),
    ("chat", {}, "messages"),
    ("chat", {"messages": []}, "messages"),
    ("chat", {"messages": "hi"}, "messages"),
    ("chat", {"messages": [5]}, "messages"),
    ("chat", {"messages": [{"content": "x"}]}, "messages"),
    ("chat", {"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    (
        "chat",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
        "messages",
    ),
    ("chat", {"messages": M, "n": 2}, "n"),
    ("chat", {"messages": M, "n": True}, "n"),
    ("chat", {"messages": M, "n": 1.0}, "n"),
    ("chat", {"messages": M, "model": 5}, "model"),
    ("chat", {"messages": M, "max_tokens": 0}, "max_tokens"),
    ("chat", {"messages": M, "max_tokens": 1.5}, "max_tokens"),
    ("chat", {"messages": M, "max_tokens": "5"}, "max_tokens"),
    ("chat", {"messages": M, "max_completion_tokens": 0}, "max_completion_tokens"),
    ("chat", {"messages": M, "temperature": 2.5}, "temperature"),
    ("chat", {"messages": M, "temperature": -0.1}, "temperature"),
    ("chat", {"messages": M, "temperature": True}, "temperature"),
    ("chat", {"messages": M, "temperature": float("nan")}, "temperature"),
    ("chat", {"messages": M, "temperature": float("inf")}, "temperature"),
    ("chat", {"messages": M, "top_p": 0}, "top_p"),
    ("chat", {"messages": M, "top_p": 1.5}, "top_p"),
    ("chat", {"messages": M, "top_k": -1}, "top_k"),
    ("chat", {"messages": M, "min_p": 2}, "min_p"),
    ("chat", {"messages": M, "repeat_penalty": 0}, "repeat_penalty"),
    ("chat", {"messages": M, "seed": 2**64}, "seed"),
    ("chat", {"messages": M, "seed": -(2**63) - 1}, "seed"),
    ("chat", {"messages": M, "stop": [1]}, "stop"),
    ("chat", {"messages": M, "stop": 5}, "stop"),
    ("chat", {"messages": M, "stop": ["s"] * 17}, "stop"),
    ("chat", {"messages": M, "stream": "yes"}, "stream"),
    ("chat", {"messages": M, "stream": 1}, "stream"),
    ("chat", {"messages": M, "stream_options": []}, "stream_options"),
    ("chat", {"messages": M, "stream_options": {"include_usage": "yes"}}, "stream_options"),
    # -- /v1/chat/completions: tools, formats, thinking --
    ("chat", {"messages": HISTORY, "tools": [TOOL]}, OK),
    (
        "chat",
        {"messages": M, "tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False},
        OK,
    ),
    (
        "chat",
        {
            "messages": M,
            "tools": [{"function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
        OK,
    ),
    ("chat", {"messages": M, "tools": [], "tool_choice": "none"}, OK),
    ("chat", {"messages": M, "tools": None, "tool_choice": None}, OK),
    ("chat", {"messages": M, "tools": TOOL}, "tools"),
    ("chat", {"messages": M, "tools": [TOOL] * 129}, "tools"),
    ("chat", {"messages": M, "tools": [5]}, "tools"),
    ("chat", {"messages": M, "tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools"),
    ("chat", {"messages": M, "tools": [{"type": "function"}]}, "tools"),
    ("chat", {"messages": M, "tools": [{"function": {"name": "a b"}}]}, "tools"),
    ("chat", {"messages": M, "tools": [{"function": {"name": "x" * 65}}]}, "tools"),
    ("chat", {"messages": M, "tools": [{"function": {"name": "f", "parameters": 5}}]}, "tools"),
    ("chat", {"messages": M, "tools": [{"function": {"name": "f", "description": 5}}]}, "tools"),
    ("chat", {"messages": M, "tools": [TOOL, TOOL]}, "tools"),
    ("chat", {"messages": M, "tool_choice": "auto"}, "tool_choice"),
    ("chat", {"messages": M, "tool_choice": "required"}, "tool_choice"),
    ("chat", {"messages": M, "tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ("chat", {"messages": M, "tools": [TOOL], "tool_choice": 5}, "tool_choice"),
    ("chat", {"messages": M, "tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice"),
    (
        "chat",
        {
            "messages": M,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "other"}},
        },
        "tool_choice",
    ),
    ("chat", {"messages": M, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ("chat", {"messages": M, "response_format": {"type": "text"}}, OK),
    ("chat", {"messages": M, "response_format": {"type": "json_object"}}, OK),
    (
        "chat",
        {
            "messages": M,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": SCHEMA, "strict": True},
            },
        },
        OK,
    ),
    (
        "chat",
        {
            "messages": M,
            "response_format": {"type": "json_schema", "json_schema": {"schema": True}},
        },
        OK,
    ),
    ("chat", {"messages": M, "response_format": {"type": "text", "json_schema": 5}}, OK),
    ("chat", {"messages": M, "response_format": "json"}, "response_format"),
    ("chat", {"messages": M, "response_format": {}}, "response_format"),
    ("chat", {"messages": M, "response_format": {"type": "xml"}}, "response_format"),
    ("chat", {"messages": M, "response_format": {"type": "json_schema"}}, "response_format"),
    (
        "chat",
        {"messages": M, "response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
        "response_format",
    ),
    ("chat", {"messages": M, "grammar": 'root ::= "yes" | "no"'}, OK),
    ("chat", {"messages": M, "grammar": 'root ::= "yes"', "response_format": {"type": "text"}}, OK),
    ("chat", {"messages": M, "grammar": 5}, "grammar"),
    (
        "chat",
        {"messages": M, "grammar": 'root ::= "a"', "response_format": {"type": "json_object"}},
        "grammar",
    ),
    ("chat", {"messages": M, "reasoning_format": "none"}, OK),
    ("chat", {"messages": M, "reasoning_format": "deepseek"}, OK),
    ("chat", {"messages": M, "reasoning_format": "sometimes"}, "reasoning_format"),
    ("chat", {"messages": M, "reasoning_format": 1}, "reasoning_format"),
    # History: tool fields are read only in the messages of the role they belong to.
    (
        "chat",
        {"messages": [{"role": "user", "content": "x", "tool_calls": 5, "tool_call_id": 5}]},
        OK,
    ),
    (
        "chat",
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"function": {"name": "f"}},
                        {"function": {"name": "g", "arguments": {"a": 1}}},
                    ],
                }
            ]
        },
        OK,
    ),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": 5}]}, "messages"),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [5]}]}, "messages"),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}, "messages"),
    (
        "chat",
        {
            "messages": [
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}
            ]
        },
        "messages",
    ),
    ("chat", {"messages": [{"role": "user", "content": "x", "images": []}]}, OK),
    ("chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "messages"),
    # -- /v1/completions --
    ("completions", {"prompt": "Once"}, OK),
    ("completions", {"prompt": ["Once"], "echo": False, "max_tokens": 3, "stop": "\n"}, OK),
    ("completions", {"prompt": "Once", "echo": None, "grammar": 'root ::= "a"'}, OK),
    ("completions", {"prompt": "Once", "response_format": {"type": "json_object"}}, OK),
    ("completions", {}, "prompt"),
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"prompt": [""]}, "prompt"),
    ("completions", {"prompt": ["a", "b"]}, "prompt"),
    ("completions", {"prompt": [1]}, "prompt"),
    ("completions", {"prompt": 5}, "prompt"),
    ("completions", {"prompt": "a", "echo": True}, "echo"),
    ("completions", {"prompt": "a", "echo": "no"}, "echo"),
    ("completions", {"prompt": "a", "n": 3}, "n"),
    ("completions", {"prompt": "a", "temperature": 3}, "temperature"),
    ("completions", {"prompt": "a", "grammar": ["x"]}, "grammar"),
    ("completions", {"prompt": "a", "response_format": {"type": "yaml"}}, "response_format"),
    # -- /v1/embeddings --
    ("embeddings", {"input": "a"}, OK),
    ("embeddings", {"input": ["a", "b"], "model": "smollm2", "encoding_format": "base64"}, OK),
    ("embeddings", {"input": "a", "encoding_format": None}, OK),
    ("embeddings", {}, "input"),
    ("embeddings", {"input": ""}, "input"),
    ("embeddings", {"input": []}, "input"),
    ("embeddings", {"input": ["a", ""]}, "input"),
    ("embeddings", {"input": [1]}, "input"),
    ("embeddings", {"input": ["a"] * 65}, "input"),
    ("embeddings", {"input": "a", "encoding_format": "hex"}, "encoding_format"),
    ("embeddings", {"input": "a", "encoding_format": 1}, "encoding_format"),
    ("embeddings", {"input": "a", "model": 1}, "model"),
    # -- /v1/rerank --
    ("rerank", {"query": "q", "documents": ["a"]}, OK),
    ("rerank", {"query": "q", "documents": ["a", {"text": "b"}, ""], "model": "smollm2"}, OK),
    ("rerank", {"query": "q", "documents": ["a"], "top_n": 1, "return_documents": True}, OK),
    ("rerank", {"query": "q", "documents": ["a"], "top_n": None, "ttl": 0}, OK),
    ("rerank", {"query": "q", "documents": [{"text": "a", "title": "t"}]}, "documents"),
    ("rerank", {"query": "q", "documents": ["a"], "rank_fields": ["text"]}, "rank_fields"),
    ("rerank", {"documents": ["a"]}, "query"),
    ("rerank", {"query": "", "documents": ["a"]}, "query"),
    ("rerank", {"query": 1, "documents": ["a"]}, "query"),
    ("rerank", {"query": "q"}, "documents"),
    ("rerank", {"query": "q", "documents": []}, "documents"),
    ("rerank", {"query": "q", "documents": "a"}, "documents"),
    ("rerank", {"query": "q", "documents": [1]}, "documents"),
    ("rerank", {"query": "q", "documents": [{"text": 1}]}, "documents"),
    ("rerank", {"query": "q", "documents": ["a"] * 1001}, "documents"),
    ("rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ("rerank", {"query": "q", "documents": ["a"], "top_n": 1.0}, "top_n"),
    ("rerank", {"query": "q", "documents": ["a"], "return_documents": 1}, "return_documents"),
    ("rerank", {"query": "q", "documents": ["a"], "ttl": -1}, "ttl"),
    # -- /api/chat --
    ("ollama_chat", {"model": "smollm2", "messages": M}, OK),
    (
        "ollama_chat",
        {
            "model": "smollm2",
            "messages": M,
            "stream": False,
            "options": {
                "num_predict": -1,
                "temperature": 100,
                "top_p": 1e-6,
                "top_k": 0,
                "min_p": 1,
                "repeat_penalty": 10,
                "seed": 1,
                "stop": ["a"],
            },
        },
        OK,
    ),
    ("ollama_chat", {"model": "smollm2", "messages": M, "options": {"num_ctx": 99}}, "options"),
    ("ollama_chat", {"model": "smollm2", "messages": M, "options": {"mirostat": 0}}, "options"),
    ("ollama_chat", {"model": "smollm2", "messages": M, "options": {"frob": 1}}, "options"),
    (
        "ollama_chat",
        {
            "model": "smollm2",
            "messages": OLLAMA_HISTORY,
            "tools": [TOOL],
            "think": False,
            "options": None,
        },
        OK,
    ),
    ("ollama_chat", {"model": "smollm2", "messages": M, "format": "json"}, OK),
    ("ollama_chat", {"model": "smollm2", "messages": M, "format": ""}, OK),
    ("ollama_chat", {"model": "smollm2", "messages": M, "format": SCHEMA, "think": None}, OK),
    ("ollama_chat", {"messages": M}, "model"),
    ("ollama_chat", {"model": None, "messages": M}, "model"),
    ("ollama_chat", {"model": 1, "messages": M}, "model"),
    ("ollama_chat", {"model": "smollm2"}, "messages"),
    ("ollama_chat", {"model": "smollm2", "messages": [{"role": "bot"}]}, "messages"),
    ("ollama_chat", {"model": "smollm2", "messages": M, "stream": "no"}, "stream"),
    ("ollama_chat", {"model": "smollm2", "messages": M, "options": 5}, "options"),
    (
        "ollama_chat",
        {"model": "smollm2", "messages": M, "options": {"temperature": 101}},
        "options",
    ),
    ("ollama_chat", {"model": "smollm2", "messages": M, "options": {"top_p": 0}}, "options"),
    (
        "ollama_chat",
        {"model": "smollm2", "messages": M, "options": {"num_predict": 1.5}},
        "options",
    ),
    ("ollama_chat", {"model": "smollm2", "messages": M, "options": {"stop": [1]}}, "options"),
    ("ollama_chat", {"model": "smollm2", "messages": M, "tools": {}}, "tools"),
    ("ollama_chat", {"model": "smollm2", "messages": M, "tools": [{"function": {}}]}, "tools"),
    ("ollama_chat", {"model": "smollm2", "messages": M, "think": "high"}, "think"),
    ("ollama_chat", {"model": "smollm2", "messages": M, "format": "xml"}, "format"),
    ("ollama_chat", {"model": "smollm2", "messages": M, "format": 5}, "format"),
    (
        "ollama_chat",
        {
            "model": "smollm2",
            "messages": [
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}
            ],
        },
        "messages",
    ),
    # Ollama's images parse; a model without a projector refuses them at the route.
    (
        "ollama_chat",
        {"model": "smollm2", "messages": [{"role": "user", "images": ["aGk="]}]},
        OK,
    ),
    # -- /api/generate --
    ("ollama_generate", {"model": "smollm2"}, OK),
    (
        "ollama_generate",
        {
            "model": "smollm2",
            "prompt": "hi",
            "system": "be brief",
            "raw": True,
            "stream": False,
            "options": {"seed": 3},
            "format": SCHEMA,
            "think": True,
        },
        OK,
    ),
    ("ollama_generate", {}, "model"),
    ("ollama_generate", {"model": "smollm2", "prompt": 5}, "prompt"),
    ("ollama_generate", {"model": "smollm2", "system": 5}, "system"),
    ("ollama_generate", {"model": "smollm2", "raw": "yes"}, "raw"),
    ("ollama_generate", {"model": "smollm2", "options": {"min_p": -1}}, "options"),
    ("ollama_generate", {"model": "smollm2", "format": ["json"]}, "format"),
    ("ollama_generate", {"model": "smollm2", "think": 1}, "think"),
    # -- /api/show, /api/embed --
    ("ollama_show", {"model": "smollm2"}, OK),
    ("ollama_show", {"name": "m"}, OK),
    ("ollama_show", {}, WHOLE),
    ("ollama_show", {"model": None, "name": None}, WHOLE),
    ("ollama_show", {"model": 5}, "model"),
    ("ollama_show", {"name": 5}, "name"),
    ("ollama_show", {"model": "smollm2", "name": 5}, OK),
    ("ollama_show", {"model": None, "name": 5}, "name"),
    ("ollama_embed", {"model": "smollm2", "input": ["a"]}, OK),
    ("ollama_embed", {"input": "a"}, "model"),
    ("ollama_embed", {"model": "smollm2"}, "input"),
    ("ollama_embed", {"model": "smollm2", "input": ""}, "input"),
    # -- /api/pull, /api/delete, /api/copy, /api/create --
    ("ollama_pull", {"model": "hf.co/a/b:Q4_K_M", "stream": False, "insecure": False}, OK),
    ("ollama_pull", {"name": "hf.co/a/b"}, OK),
    ("ollama_pull", {}, WHOLE),
    ("ollama_pull", {"model": "a", "stream": "no"}, "stream"),
    ("ollama_delete", {"model": "m"}, OK),
    ("ollama_delete", {"model": 5}, "model"),
    ("ollama_copy", {"source": "a", "destination": "team/b:v2"}, OK),
    ("ollama_copy", {"source": "a"}, "destination"),
    ("ollama_copy", {"source": "a", "destination": "b c"}, "destination"),
    ("ollama_copy", {"source": "a", "destination": ""}, "destination"),
    (
        "ollama_create",
        {
            "model": "pirate",
            "from": "smollm2",
            "system": "Arr.",
            "parameters": {"temperature": 0.2, "stop": ["x"], "seed": 1},
            "messages": [{"role": "user", "content": "Ahoy"}],
            "license": ["MIT", "CC"],
            "stream": True,
            "template": "",
            "files": {},
            "adapters": {},
        },
        OK,
    ),
    ("ollama_create", {"model": "pirate"}, "from"),
    ("ollama_create", {"model": "p", "from": "m", "from_": "smollm2"}, "from_"),
    ("ollama_create", {"model": "pirate", "from": 5}, "from"),
    ("ollama_create", {"model": "p", "from": "m", "quantize": "q4_K_M"}, "quantize"),
    ("ollama_create", {"model": "p", "from": "m", "template": "{{ .Prompt }}"}, "template"),
    ("ollama_create", {"model": "p", "from": "m", "files": {"a.gguf": "sha256:0"}}, "files"),
    ("ollama_create", {"model": "p", "from": "m", "adapters": {"a": "sha256:0"}}, "adapters"),
    ("ollama_create", {"model": "p", "from": "m", "modelfile": "FROM m"}, "modelfile"),
    ("ollama_create", {"model": "p", "from": "m", "parameters": {"num_ctx": 8}}, "parameters"),
    ("ollama_create", {"model": "p", "from": "m", "parameters": {"top_k": -1}}, "parameters"),
    ("ollama_create", {"model": "p", "from": "m", "messages": [{"role": "tool"}]}, "messages"),
    ("ollama_create", {"model": "p", "from": "m", "license": 5}, "license"),
    # -- llama-server's /tokenize, /detokenize, /apply-template --
    ("tokenize", {"content": "hi"}, OK),
    (
        "tokenize",
        {
            "content": ["a", 5, "b"],
            "add_special": True,
            "parse_special": False,
            "with_pieces": True,
            "model": "smollm2",
        },
        OK,
    ),
    ("tokenize", {}, "content"),
    ("tokenize", {"content": 5}, "content"),
    ("tokenize", {"content": ["a", -1]}, "content"),
    ("tokenize", {"content": ["a", 1.5]}, "content"),
    ("tokenize", {"content": "a", "with_pieces": 1}, "with_pieces"),
    ("tokenize", {"content": "a", "pieces": True}, "pieces"),
    ("detokenize", {}, OK),
    ("detokenize", {"tokens": [1, 2], "model": "smollm2"}, OK),
    ("detokenize", {"tokens": "1"}, "tokens"),
    ("detokenize", {"tokens": [-1]}, "tokens"),
    ("detokenize", {"tokens": [2**31]}, "tokens"),
    ("detokenize", {"tokens": [1], "model": 5}, "model"),
    ("apply_template", {"messages": M}, OK),
    ("apply_template", {"messages": HISTORY, "tools": [TOOL], "model": "smollm2"}, OK),
    ("apply_template", {}, "messages"),
    ("apply_template", {"messages": []}, "messages"),
    ("apply_template", {"messages": M, "stream": True}, "stream"),
    # -- llama-server's fields, as its web UI sends them with a chat --
    (
        "chat",
        {
            "messages": M,
            "stream": True,
            "timings_per_token": True,
            "return_progress": True,
            "sse_ping_interval": 1,
            "reasoning_format": "auto",
            "reasoning_control": True,
        },
        OK,
    ),
    ("chat", {"messages": M, "sse_ping_interval": -1}, OK),
    ("chat", {"messages": M, "sse_ping_interval": -2}, "sse_ping_interval"),
    ("chat", {"messages": M, "timings_per_token": 1}, "timings_per_token"),
    ("chat", {"messages": M, "return_progress": "yes"}, "return_progress"),
    ("chat", {"messages": M, "backend_sampling": False}, OK),
    # -- /infill, as llama.vim and llama.vscode send it --
    ("infill", {"input_prefix": "def f(", "input_suffix": ")"}, OK),
    (
        "infill",
        {
            "id_slot": 0,
            "input_prefix": "a",
            "input_suffix": "b",
            "input_extra": [{"text": "x = 1\n", "time": 12.5, "filename": "x.py"}],
            "prompt": "   ",
            "n_predict": 128,
            "stop": [],
            "n_indent": 0,
            "top_k": 40,
            "top_p": 0.9,
            "stream": False,
            "cache_prompt": True,
        },
        OK,
    ),
    ("infill", {"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "t"}]}, OK),
    ("infill", {"input_prefix": "a", "input_suffix": "b", "n_predict": -1}, OK),
    ("infill", {"input_suffix": "b"}, "input_prefix"),
    ("infill", {"input_prefix": "a"}, "input_suffix"),
    ("infill", {"input_prefix": 5, "input_suffix": "b"}, "input_prefix"),
    ("infill", {"input_prefix": "a", "input_suffix": "b", "prompt": 5}, "prompt"),
    ("infill", {"input_prefix": "a", "input_suffix": "b", "input_extra": {}}, "input_extra"),
    (
        "infill",
        {"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "x"}]},
        "input_extra",
    ),
    (
        "infill",
        {"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "t", "filename": 1}]},
        "input_extra",
    ),
    ("infill", {"input_prefix": "a", "input_suffix": "b", "n_predict": -2}, "n_predict"),
    ("infill", {"input_prefix": "a", "input_suffix": "b", "n_predict": 0}, "n_predict"),
    ("infill", {"input_prefix": "a", "input_suffix": "b", "n_indent": 4}, "n_indent"),
    ("infill", {"input_prefix": "a", "input_suffix": "b", "samplers": ["top_k"]}, "samplers"),
    ("infill", {"input_prefix": "a", "input_suffix": "b", "temperature": 3}, "temperature"),
    ("infill", {"input_prefix": "a", "input_suffix": "b", "unknown": 1}, "unknown"),
    # -- /slots/{id}?action=save|restore --
    ("slot_file", {"filename": "chat.bin"}, OK),
    ("slot_file", {}, "filename"),
    ("slot_file", {"filename": ""}, "filename"),
    ("slot_file", {"filename": 5}, "filename"),
    # -- /v1/audio/speech --
    ("speech", {"model": "tts-1", "input": "Hi.", "voice": "default"}, OK),
    (
        "speech",
        {
            "model": "espeak-ng",
            "input": "Hi.",
            "voice": "espeak-de",
            "response_format": "wav",
            "speed": 1,
            "instructions": "",
            "stream_format": "audio",
        },
        OK,
    ),
    ("speech", {"model": "kokoro", "input": "Hi.", "voice": "x", "response_format": None}, OK),
    ("speech", {"model": "gpt-4o-mini-tts", "input": "a" * 4096, "voice": "d", "speed": 4.0}, OK),
    ("speech", {"input": "Hi.", "voice": "default"}, "model"),
    ("speech", {"model": "smollm2", "input": "Hi.", "voice": "default"}, "model"),
    ("speech", {"model": "tts-1", "voice": "default"}, "input"),
    ("speech", {"model": "tts-1", "input": "", "voice": "default"}, "input"),
    ("speech", {"model": "tts-1", "input": "a" * 4097, "voice": "default"}, "input"),
    ("speech", {"model": "tts-1", "input": ["Hi."], "voice": "default"}, "input"),
    ("speech", {"model": "tts-1", "input": "Hi."}, "voice"),
    ("speech", {"model": "tts-1", "input": "Hi.", "voice": ""}, "voice"),
    ("speech", {"model": "tts-1", "input": "Hi.", "voice": "default", "speed": 0.1}, "speed"),
    ("speech", {"model": "tts-1", "input": "Hi.", "voice": "default", "speed": "1"}, "speed"),
    (
        "speech",
        {"model": "tts-1", "input": "Hi.", "voice": "default", "response_format": "opus"},
        "response_format",
    ),
    (
        "speech",
        {"model": "tts-1", "input": "Hi.", "voice": "default", "instructions": "Whisper."},
        "instructions",
    ),
    (
        "speech",
        {"model": "tts-1", "input": "Hi.", "voice": "default", "stream_format": "sse"},
        "stream_format",
    ),
    ("speech", {"model": "tts-1", "input": "Hi.", "voice": "default", "lang": "en"}, "lang"),
    # -- /v1/audio/transcriptions and /translations (multipart: the file and these fields) --
    ("transcription", {"model": "whisper-1", "file": "RIFF"}, OK),
    (
        "transcription",
        {
            "model": "whisper-1",
            "file": "RIFF",
            "language": "de",
            "prompt": "Paris",
            "response_format": "verbose_json",
            "temperature": 0,
            "timestamp_granularities": ["segment", "word"],
        },
        OK,
    ),
    ("transcription", {"file": "RIFF"}, "model"),
    ("transcription", {"model": "whisper-1"}, "file"),
    (
        "transcription",
        {"model": "whisper-1", "file": "RIFF", "response_format": "mp3"},
        "response_format",
    ),
    ("transcription", {"model": "whisper-1", "file": "RIFF", "temperature": "hot"}, "temperature"),
    (
        "transcription",
        {"model": "whisper-1", "file": "RIFF", "timestamp_granularities": ["line"]},
        "timestamp_granularities",
    ),
    ("translation", {"model": "whisper-1", "file": "RIFF", "prompt": "Paris"}, OK),
    ("translation", {"model": "whisper-1", "file": "RIFF", "language": "de"}, "language"),
]


def _outcome(check: Callable[[], Any]) -> tuple[bool, str | None]:
    try:
        check()
    except ApiError as e:
        assert e.status == 400
        return False, e.param
    return True, None


def _id(row: Row) -> str:
    return f"{row[0]}:{json.dumps(row[1])[:60]}"


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_parse_body_decides(row: Row) -> None:
    route, body, expected = row
    ok, param = _outcome(lambda: parse_body(ROUTES[route], json.loads(json.dumps(body))))
    if expected is OK:
        assert ok, f"refused ({param})"
    else:
        assert not ok, "accepted"
        assert param == (expected or None)


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        (
            ChatCompletionRequest,
            {"messages": M, "temperature": 3},
            "'temperature' must be between 0 and 2",
        ),
        (ChatCompletionRequest, {"messages": M, "top_p": 0}, "'top_p' must be greater than 0"),
        (
            ChatCompletionRequest,
            {"messages": M, "max_tokens": 0},
            "'max_tokens' must be at least 1",
        ),
        (ChatCompletionRequest, {"messages": M, "top_k": 1.0}, "'top_k' must be a whole number"),
        (ChatCompletionRequest, {"messages": M, "stream": 1}, "'stream' must be true or false"),
        (ChatCompletionRequest, {"messages": M, "n": 2}, "only n=1 is supported"),
        (
            ChatCompletionRequest,
            {"messages": M, "stop": [1]},
            "'stop' must be a string or a list of strings",
        ),
        (ChatCompletionRequest, {"messages": []}, "'messages' must be a non-empty list"),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": 5}]},
            "'messages[0].content' must be a string or a list of parts",
        ),
        (
            ChatCompletionRequest,
            {"messages": M, "tool_choice": "auto"},
            "'tool_choice' needs 'tools'",
        ),
        (
            ChatCompletionRequest,
            {"messages": M, "tools": [{"function": {"name": "f"}}] * 2},
            "tools: the function name 'f' appears twice",
        ),
        (CompletionRequest, {"prompt": ""}, "'prompt' is empty"),
        (CompletionRequest, {"prompt": "a", "echo": True}, "'echo' is not supported"),
        (OllamaChatRequest, {"model": None, "messages": M}, "'model' is required"),
        (
            OllamaChatRequest,
            {"model": "smollm2", "messages": M, "options": {"temperature": -1}},
            "'options.temperature' must be between 0 and 100",
        ),
        (OllamaShowRequest, {}, "'model' is required"),
        (EmbeddingRequest, {"input": ["a"] * 65}, "'input' takes at most 64 strings"),
        (
            ChatCompletionRequest,
            {"messages": M, "tools": [{"function": {"name": "a b"}}]},
            "'tools[0].function.name' must be 1-64 letters, digits, '_', '.' or '-'",
        ),
        (
            ChatCompletionRequest,
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": 5}}],
                    }
                ]
            },
            "'messages[0].tool_calls[0].function.arguments' must be a JSON string or an object",
        ),
        (
            OllamaChatRequest,
            {
                "model": "smollm2",
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": 5}}],
                    }
                ],
            },
            "'messages[0].tool_calls[0].function.arguments' must be an object or a JSON string",
        ),
        (
            ChatCompletionRequest,
            {
                "messages": M,
                "response_format": {"type": "json_schema", "json_schema": {"schema": 5}},
            },
            "'response_format.json_schema.schema' must be a JSON schema (an object)",
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "images": ["aGk="]}]},
            "'messages[0].images' is Ollama's field, not this API's: send images as image_url "
            'content parts ({"type": "image_url", "image_url": {"url": '
            '"data:image/png;base64,..."}})',
        ),
        (
            ChatCompletionRequest,
            {"messages": M, "grammar": 'root ::= "a"', "response_format": {"type": "json_object"}},
            "'grammar' and a JSON 'response_format' exclude each other",
        ),
    ],
)
def test_messages_are_one_line_in_the_hand_checks_style(
    model: type[BaseModel], body: dict[str, Any], message: str
) -> None:
    """One line naming the field, with no pydantic wording (nor a union's branch names)."""
    with pytest.raises(ApiError) as e:
        parse_body(model, body)
    assert e.value.status == 400 and e.value.message == message


def test_values_come_out_as_the_routes_use_them() -> None:
    r = parse_body(
        ChatCompletionRequest,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            "stop": ["x", ""],
            "temperature": 1,
        },
    )
    assert r.messages[0].text == "ab" and r.stop == ("x",) and r.temperature == 1.0
    assert r.n == 1 and r.tools is None and r.stream is None
    assert parse_body(ChatCompletionRequest, {"messages": M, "stop": ""}).stop == ()
    assert parse_body(CompletionRequest, {"prompt": ["once"]}).prompt == "once"
    assert parse_body(EmbeddingRequest, {"input": "a"}).input == ["a"]
    rf = parse_body(
        ChatCompletionRequest,
        {
            "messages": M,
            "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
        },
    ).response_format
    assert rf is not None and rf.json_schema is not None and rf.json_schema.schema_ == SCHEMA
    tools = parse_body(
        OllamaChatRequest,
        {"model": "smollm2", "messages": M, "tools": [{"function": {"name": "f"}}]},
    ).tools
    assert tools is not None and tools[0].function.parameters == {
        "type": "object",
        "properties": {},
    }
    # A field of another role is dropped, not checked.
    msg = parse_body(
        ChatCompletionRequest, {"messages": [{"role": "user", "content": "x", "tool_calls": 5}]}
    ).messages[0]
    assert msg.tool_calls is None


def test_chat_messages_come_out_openai_shaped() -> None:
    """What plan_chat and the tool formats read, whatever the dialect: role and text content,
    an assistant's calls (arguments as JSON text, numbered without an id) and thinking, a tool
    result's call id and function name."""
    expected: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Look it up.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "Sunny", "tool_call_id": "c1", "name": "get_weather"},
    ]
    assert parse_body(ChatCompletionRequest, {"messages": HISTORY}).chat_messages() == expected
    ollama = parse_body(OllamaChatRequest, {"model": "smollm2", "messages": OLLAMA_HISTORY})
    expected[1]["tool_calls"][0]["id"] = "call_1_0"
    del expected[2]["tool_call_id"]
    assert ollama.chat_messages() == expected
    mixed = parse_body(
        ChatCompletionRequest,
        {
            "messages": [
                {
                    "role": "developer",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "user", "content": None, "name": "bob", "tool_calls": [5], "images": []},
                {
                    "role": "assistant",
                    "reasoning_content": "",
                    "tool_calls": [
                        {"id": "", "function": {"name": "f"}},
                        {"function": {"name": "g", "arguments": {"city": "Zürich"}}},
                    ],
                },
                {"role": "tool", "content": "r", "tool_call_id": "", "name": ""},
            ]
        },
    )
    assert mixed.chat_messages() == [
        {"role": "system", "content": "ab"},
        {"role": "user", "content": ""},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_2_0",
                    "type": "function",
                    "function": {"name": "f", "arguments": "{}"},
                },
                {
                    "id": "call_2_1",
                    "type": "function",
                    "function": {"name": "g", "arguments": '{"city": "Zürich"}'},
                },
            ],
        },
        {"role": "tool", "content": "r", "tool_call_id": "", "name": ""},
    ]
    kept = parse_body(
        OllamaChatRequest,
        {
            "model": "smollm2",
            "messages": [
                {
                    "role": "assistant",
                    "content": "x",
                    "tool_calls": [{"id": "k", "function": {"name": "f", "arguments": '{"a": 1}'}}],
                },
                {"role": "tool", "content": "r", "tool_call_id": "k"},
            ],
        },
    )
    assert kept.chat_messages() == [
        {
            "role": "assistant",
            "content": "x",
            "tool_calls": [
                {"id": "k", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
            ],
        },
        {"role": "tool", "content": "r", "tool_call_id": "k"},
    ]


@pytest.mark.parametrize(
    ("body", "tools", "choice"),
    [
        (
            {"tools": [TOOL, {"function": {"name": "f", "description": "", "strict": True}}]},
            [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "Weather",
                        "parameters": TOOL["function"]["parameters"],
                    },
                },
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
                },
            ],
            "auto",
        ),
        (
            {
                "tools": [TOOL],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            },
            None,
            "get_weather",
        ),
        ({"tools": [TOOL], "tool_choice": "required"}, None, "required"),
        ({"tools": [TOOL], "tool_choice": "none"}, None, "none"),
        ({"tools": []}, [], "none"),
        ({}, [], "none"),
    ],
)
def test_tools_come_out_as_the_tool_formats_take_them(
    body: dict[str, Any], tools: list[dict[str, Any]] | None, choice: str
) -> None:
    r = parse_body(ChatCompletionRequest, {"messages": M, **body})
    if tools is not None:
        assert r.chat_tools() == tools
    assert r.chosen_tool() == choice
    ollama = parse_body(
        OllamaChatRequest, {"model": "smollm2", "messages": M, "tools": body.get("tools")}
    )
    assert ollama.chat_tools() == r.chat_tools()


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (
            ChatCompletionRequest,
            {"messages": M, "tools": [{"function": {"name": "f", "strict": "yes"}}]},
        ),
        (ChatCompletionRequest, {"messages": [{"role": "assistant", "reasoning_content": 5}]}),
        (
            ChatCompletionRequest,
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "f"}}]}
                ]
            },
        ),
        (
            ChatCompletionRequest,
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"type": "retrieval", "function": {"name": "f"}}],
                    }
                ]
            },
        ),
        (ChatCompletionRequest, {"messages": [{"role": "tool", "tool_call_id": 5}]}),
        (OllamaChatRequest, {"model": "smollm2", "messages": [{"role": "tool", "tool_name": 5}]}),
        (
            OllamaChatRequest,
            {
                "model": "smollm2",
                "messages": [
                    {"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "f"}}]}
                ],
            },
        ),
    ],
)
def test_a_wrong_type_is_refused_not_ignored(model: type[BaseModel], body: dict[str, Any]) -> None:
    """The routes' former hand checks ignored these fields when they held the wrong type; the
    models refuse them, as OpenAI and Ollama do."""
    with pytest.raises(ApiError) as e:
        parse_body(model, body)
    assert e.value.status == 400


def test_the_roles_are_the_templates_roles() -> None:
    """`developer` reaches the template as `system`; every other role is the template's."""
    assert set(get_args(Role)) == VALID_ROLES | {"developer"}
    for model in (ChatMessage, OllamaMessage):
        assert get_args(model.model_fields["role"].annotation) == get_args(Role)


def _validator(doc: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    root = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(root)


@functools.cache
def _route_validator(name: str) -> jsonschema.Draft202012Validator:
    """The validator of a body model in the document of a server without a key, built once:
    the hundreds of rows below only read it (building the document takes ~30 ms)."""
    return _validator(open_document(), name)


def test_openapi_is_built_from_the_models() -> None:
    doc = openapi_schema(ServerConfig(port=0, api_key="k"))
    assert doc["openapi"] == "3.1.0" and doc["security"] == [{"bearer": []}]
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["paths"]["/health"]["get"]["security"] == []
    for path in (
        "/v1/models",
        "/v1/models/{model_id}",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/rerank",
        "/v1/reranking",
        "/rerank",
        "/reranking",
        "/api/version",
        "/api/tags",
        "/api/show",
        "/api/chat",
        "/api/generate",
        "/api/embed",
        "/health",
        "/metrics",
    ):
        assert path in doc["paths"], path
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"
    }
    schemas = doc["components"]["schemas"]
    text = json.dumps(doc)
    for ref in {x.split('"')[0] for x in text.split('"$ref": "#/components/schemas/')[1:]}:
        assert ref in schemas, ref
    assert "$defs" not in text
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["temperature"]["anyOf"][0] == {"type": "number", "minimum": 0, "maximum": 2}
    assert chat["tools"]["anyOf"][0]["maxItems"] == MAX_TOOLS
    open_doc = openapi_schema(ServerConfig(port=0))
    assert "security" not in open_doc and "securitySchemes" not in open_doc["components"]
    jsonschema.Draft202012Validator.check_schema(
        {"$ref": "#/components/schemas/ChatCompletionRequest", **doc}
    )


def _documented(schema: dict[str, Any]) -> set[str]:
    """The properties a schema names, in its own `properties` or in its branches'."""
    names = set(schema.get("properties", {}))
    branches = [
        *schema.get("anyOf", []),
        *schema.get("allOf", []),
        *schema.get("oneOf", []),
        *(schema[k] for k in ("then", "else") if k in schema),
    ]
    for sub in branches:
        names |= _documented(sub)
    return names


def test_the_document_shows_every_field_the_routes_read() -> None:
    doc = open_document()
    schemas = doc["components"]["schemas"]
    seen: set[type[BaseModel]] = set()
    todo = [op.body for op in PATHS.values() if op.body is not None]
    assert set(todo) == set(ROUTES.values())
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        fields = {f.alias or name for name, f in model.model_fields.items()}
        assert fields <= _documented(schemas[model.__name__]), model.__name__
        for f in model.model_fields.values():
            todo += [m for m in _models_in(f.annotation) if m not in seen]
    assert {
        ChatMessage,
        OllamaMessage,
        Tool,
        ResponseFormat,
        ToolCall,
        OllamaToolCall,
        NamedToolChoice,
        OllamaOptions,
    } <= seen


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models_in(a)]


@pytest.mark.parametrize("row", [r for r in ROWS if r[2] is OK], ids=_id)
def test_the_document_takes_every_body_the_server_takes(row: Row) -> None:
    """A schema stricter than the server fails the fuzz test's negative-data check."""
    _route_validator(ROUTES[row[0]].__name__).validate(row[1])


# Refusals the document states in words only: rules across fields or list items, a
# whole number written as a float (JSON Schema counts 1.0 as the integer 1), and fields the
# server does not honour.
IN_WORDS = [
    ("ollama_create", {"model": "p", "from": "m", "quantize": "q4_K_M"}),
    ("ollama_create", {"model": "p", "from": "m", "template": "{{ .Prompt }}"}),
    ("ollama_create", {"model": "p", "from": "m", "files": {"a.gguf": "sha256:0"}}),
    ("ollama_create", {"model": "p", "from": "m", "adapters": {"a": "sha256:0"}}),
    ("ollama_create", {"model": "p", "from": "m", "modelfile": "FROM m"}),
    ("infill", {"input_prefix": "a", "input_suffix": "b", "n_indent": 4}),
    ("infill", {"input_prefix": "a", "input_suffix": "b", "samplers": ["top_k"]}),
    ("chat", {"messages": M, "n": 1.0}),
    ("rerank", {"query": "q", "documents": ["a"], "top_n": 1.0}),
    ("speech", {"model": "tts-1", "input": "Hi.", "voice": "default", "instructions": "Whisper."}),
    ("chat", {"messages": M, "tools": [TOOL, TOOL]}),
    ("chat", {"messages": M, "tool_choice": "auto"}),
    ("chat", {"messages": M, "tool_choice": "required"}),
    (
        "chat",
        {
            "messages": M,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "other"}},
        },
    ),
    (
        "chat",
        {"messages": M, "grammar": 'root ::= "a"', "response_format": {"type": "json_object"}},
    ),
]


@pytest.mark.parametrize("row", [r for r in ROWS if r[2] is not OK], ids=_id)
def test_the_document_refuses_what_the_server_refuses(row: Row) -> None:
    route, body = row[0], row[1]
    try:
        sent = json.loads(json.dumps(body, allow_nan=False))
    except ValueError:
        pytest.skip("not JSON: refused as a body")
    valid = _route_validator(ROUTES[route].__name__).is_valid(sent)
    # Compared as JSON text: in Python, True == 1 == 1.0.
    assert valid == (json.dumps([route, body]) in {json.dumps(list(x)) for x in IN_WORDS})


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ({"type": "text"}, True),
        ({"type": "text", "json_schema": 5}, True),
        ({"type": "json_object"}, True),
        ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, True),
        ({"type": "json_schema"}, False),
        ({"type": "json_schema", "json_schema": None}, False),
        ({"type": "json_schema", "json_schema": {"name": "a"}}, False),
        ({"type": "x"}, False),
    ],
)
def test_response_format_document_and_model_agree(value: dict[str, Any], ok: bool) -> None:
    """Its document is hand-shaped (json_schema counts with its type only)."""
    doc = open_document()
    assert _validator(doc, "ResponseFormat").is_valid(value) == ok
    assert _outcome(lambda: parse_body(ResponseFormat, value))[0] == ok


@pytest.mark.parametrize(
    ("message", "ok"),
    [
        ({"role": "user", "tool_calls": 5, "reasoning_content": 5, "tool_call_id": 5}, True),
        ({"role": "assistant", "tool_call_id": 5, "name": 5}, True),
        ({"role": "assistant", "tool_calls": 5}, False),
        ({"role": "assistant", "reasoning_content": 5}, False),
        ({"role": "tool", "tool_call_id": 5}, False),
        ({"role": "tool", "name": 5}, False),
        ({"role": "tool", "tool_calls": 5}, True),
        ({"role": "user", "images": []}, True),
        ({"role": "user", "images": ["aGk="]}, False),
    ],
)
def test_a_messages_fields_are_documented_with_its_role(message: dict[str, Any], ok: bool) -> None:
    """A field of one role is ignored in the others' messages, whatever it holds."""
    doc = open_document()
    assert _validator(doc, "ChatMessage").is_valid(message) == ok
    body = {"messages": [message]}
    assert _outcome(lambda: parse_body(ChatCompletionRequest, body))[0] == ok


def test_the_document_describes_the_answers() -> None:
    doc = open_document()
    _validator(doc, "ChatCompletion").validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "smollm2",
            "system_fingerprint": "candlewick",
            "choices": [
                {
                    "index": 0,
                    "logprobs": None,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                }
            ],
            "usage": {
                "prompt_tokens": 1,
                "completion_tokens": 2,
                "total_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
        }
    )
    _validator(doc, "OpenAIError").validate(
        {"error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}}
    )
    _validator(doc, "OllamaReply").validate(
        {
            "model": "smollm2",
            "created_at": "t",
            "done": True,
            "done_reason": "stop",
            "message": {
                "role": "assistant",
                "content": "",
                "thinking": "hmm",
                "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
            },
            "total_duration": 1,
            "load_duration": 0,
            "eval_count": 1,
        }
    )


@pytest.mark.parametrize("kind", [{}, [], 5, None])
def test_a_responses_part_whose_type_is_not_a_string_is_a_400(kind: Any) -> None:
    # Found by schemathesis under load: a dict as a part's type raised TypeError (a 500).
    from engine.server.protocol.responses import ResponsesRequest

    body = {"model": "m", "input": [{"role": "user", "content": [{"type": kind}]}]}
    ok, param = _outcome(lambda: parse_body(ResponsesRequest, body))
    assert not ok and param is not None and param.startswith("input")
