"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.decoding.tool_calls import ToolCall
from engine.errors import EngineError
from engine.host.scheduler import Finished, Piece
from engine.host.stats import GenerationStats
from engine.server.chat_reply import (
    Part,
    ReplyReader,
    check_tool_choice,
    check_tools,
    openai_grammar,
    plan_chat,
)
from engine.server.common import (
    cap_tokens,
    events_until_disconnect,
    loaded_or_503,
    sampling_from,
    start,
    tokens_for,
)
from engine.server.embeddings import Embedder
from engine.server.engine_state import Generation, LoadedModel, ServerState
from engine.server.errors import ApiError, openai_error_body
from engine.server.parsing import (
    MAX_EMBED_INPUTS,
    get_bool,
    get_int,
    get_messages,
    get_number,
    get_stop,
    get_str,
    read_json,
)

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def finish_reason(st: GenerationStats, calls: list[ToolCall] | None = None) -> str:
    if calls:
        return "tool_calls"
    return "stop" if st.stop_reason in ("stop", "stop_string") else "length"


def usage(st: GenerationStats) -> dict[str, Any]:
    return {"prompt_tokens": st.prompt_tokens, "completion_tokens": st.gen_tokens,
            "total_tokens": st.prompt_tokens + st.gen_tokens,
            "prompt_tokens_details": {"cached_tokens": st.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": st.thinking_tokens}}


def _call_obj(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _model_obj(loaded: LoadedModel) -> dict[str, Any]:
    return {"id": loaded.model_id, "object": "model", "created": loaded.created,
            "owned_by": "candlewick", "meta": loaded.settings()}


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class OpenAIRoutes:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def routes(self) -> list[Route]:
        return [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
        ]

    async def models(self, request: Request) -> Response:
        loaded = loaded_or_503(self.state)
        return JSONResponse({"object": "list", "data": [_model_obj(loaded)]})

    async def model(self, request: Request) -> Response:
        loaded = loaded_or_503(self.state)
        if request.path_params["model_id"] != loaded.model_id:
            raise ApiError(404, f"model '{request.path_params['model_id']}' not found",
                           code="model_not_found")
        return JSONResponse(_model_obj(loaded))

    def _common(self, body: dict[str, Any]) -> tuple[Any, bool, bool]:
        cfg = self.state.config
        n = get_int(body, "n", 1)
        if n != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        get_str(body, "model")
        legacy = get_int(body, "max_tokens", None, lo=1)
        max_tokens = get_int(body, "max_completion_tokens", None, lo=1)
        if max_tokens is None:
            max_tokens = legacy
        sampling = sampling_from(
            temperature=get_number(body, "temperature", None, lo=0, hi=2),
            top_p=get_number(body, "top_p", None, lo=0, hi=1),
            top_k=get_int(body, "top_k", None, lo=0),
            min_p=get_number(body, "min_p", None, lo=0, hi=1),
            repeat_penalty=get_number(body, "repeat_penalty", None, lo=0.01, hi=10),
            seed=get_int(body, "seed", None, lo=-(2**63), hi=2**64 - 1),
            max_tokens=cap_tokens(self.state, max_tokens),
            stop=get_stop(body),
        )
        if sampling.top_p <= 0:
            raise ApiError(400, "'top_p' must be greater than 0", param="top_p")
        stream = get_bool(body, "stream", False)
        opts = body.get("stream_options")
        if opts is not None and not isinstance(opts, dict):
            raise ApiError(400, "'stream_options' must be an object", param="stream_options")
        include_usage = get_bool(opts or {}, "include_usage", False)
        del cfg
        return sampling, stream, include_usage

    async def chat(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        loaded = loaded_or_503(self.state)
        messages = get_messages(body)
        sampling, stream, include_usage = self._common(body)
        tools = check_tools(body.get("tools"))
        choice = check_tool_choice(body.get("tool_choice"), tools)
        parallel = get_bool(body, "parallel_tool_calls", True)
        grammar, grammar_param = openai_grammar(body)
        reasoning = get_str(body, "reasoning_format", "auto")
        if reasoning not in ("auto", "deepseek", "none"):
            raise ApiError(400, "'reasoning_format' must be 'auto', 'deepseek' or 'none'",
                           param="reasoning_format")
        plan = plan_chat(loaded, messages, tools=tools, choice=choice, parallel=parallel,
                         grammar=grammar, grammar_param=grammar_param, think=None,
                         separate_reasoning=reasoning != "none")
        sampling = replace(sampling, grammar=plan.grammar)
        # Thinking is timed from the pieces as they come, streamed to the client or not.
        gen = start(self.state, loaded, plan.prompt, sampling,
                    stream=stream or plan.markers is not None)
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        base = {"id": cid, "created": created, "model": loaded.model_id,
                "system_fingerprint": "candlewick"}
        reader = ReplyReader(plan)
        if not stream:
            done = await self._result(request, gen, reader)
            _, reply = reader.finish(done.stats)
            message: dict[str, Any] = {"role": "assistant",
                                       "content": reply.content or
                                       (None if reply.calls else "")}
            if reply.reasoning:
                message["reasoning_content"] = reply.reasoning
            if reply.calls:
                message["tool_calls"] = [_call_obj(c) for c in reply.calls]
            return JSONResponse({
                **base, "object": "chat.completion",
                "choices": [{"index": 0, "logprobs": None, "message": message,
                             "finish_reason": finish_reason(done.stats, reply.calls)}],
                "usage": usage(done.stats),
            })

        def chunk(delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
            return {**base, "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": reason}]}

        def deltas(parts: list[Part]) -> Iterator[str]:
            for kind, text in parts:
                key = "reasoning_content" if kind == "reasoning" else "content"
                yield _sse(chunk({key: text}, None))

        async def body_iter() -> AsyncIterator[str]:
            yield _sse(chunk({"role": "assistant", "content": ""}, None))
            async for ev in gen.events():
                if isinstance(ev, Piece):
                    for line in deltas(reader.push(ev.text, ev.n_tokens)):
                        yield line
                elif isinstance(ev, Finished):
                    if ev.stats.stop_reason == "error":
                        yield _sse(openai_error_body(500, ev.stats.error or "generation failed"))
                        return
                    tail, reply = reader.finish(ev.stats)
                    for line in deltas(tail):
                        yield line
                    for k, call in enumerate(reply.calls):
                        yield _sse(chunk({"tool_calls": [{"index": k, **_call_obj(call)}]},
                                         None))
                    yield _sse(chunk({}, finish_reason(ev.stats, reply.calls)))
                    if include_usage:
                        yield _sse({**base, "object": "chat.completion.chunk", "choices": [],
                                    "usage": usage(ev.stats)})
            yield "data: [DONE]\n\n"

        return StreamingResponse(body_iter(), media_type="text/event-stream",
                                 headers=_SSE_HEADERS)

    async def completions(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        loaded = loaded_or_503(self.state)
        prompt_v = body.get("prompt")
        if isinstance(prompt_v, list) and len(prompt_v) == 1 and isinstance(prompt_v[0], str):
            prompt_v = prompt_v[0]
        if not isinstance(prompt_v, str):
            raise ApiError(400, "'prompt' must be a string (one prompt per request)",
                           param="prompt")
        if not prompt_v:
            raise ApiError(400, "'prompt' is empty", param="prompt")
        text = prompt_v
        sampling, stream, include_usage = self._common(body)
        if get_bool(body, "echo", False):
            raise ApiError(400, "'echo' is not supported", param="echo")
        grammar, _ = openai_grammar(body)
        sampling = replace(sampling, grammar=grammar)
        prompt = tokens_for(loaded, lambda: loaded.model.tokenize(text))
        gen = start(self.state, loaded, prompt, sampling, stream=stream)
        base = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                "model": loaded.model_id, "object": "text_completion",
                "system_fingerprint": "candlewick"}
        if not stream:
            done = await self._result(request, gen)
            return JSONResponse({
                **base,
                "choices": [{"index": 0, "text": done.text, "logprobs": None,
                             "finish_reason": finish_reason(done.stats)}],
                "usage": usage(done.stats),
            })

        async def body_iter() -> AsyncIterator[str]:
            async for ev in gen.events():
                if isinstance(ev, Piece):
                    yield _sse({**base, "choices": [{"index": 0, "text": ev.text,
                                                     "logprobs": None,
                                                     "finish_reason": None}]})
                elif isinstance(ev, Finished):
                    if ev.stats.stop_reason == "error":
                        yield _sse(openai_error_body(500, ev.stats.error or "generation failed"))
                        return
                    yield _sse({**base, "choices": [{"index": 0, "text": "", "logprobs": None,
                                                     "finish_reason": finish_reason(ev.stats)}]})
                    if include_usage:
                        yield _sse({**base, "choices": [], "usage": usage(ev.stats)})
            yield "data: [DONE]\n\n"

        return StreamingResponse(body_iter(), media_type="text/event-stream",
                                 headers=_SSE_HEADERS)

    async def _result(self, request: Request, gen: Generation,
                      reader: ReplyReader | None = None) -> Finished:
        """The finished generation; a reader is fed its pieces (streamed internally for
        timing) or, when none came, its whole text."""
        pieces = False
        async for ev in events_until_disconnect(request, gen):
            if isinstance(ev, Piece) and reader is not None:
                pieces = True
                reader.push(ev.text, ev.n_tokens)
            elif isinstance(ev, Finished):
                if reader is not None and not pieces and ev.stats.stop_reason != "error":
                    reader.push(ev.text, ev.stats.gen_tokens)
                if ev.stats.stop_reason == "error":
                    raise ApiError(500, ev.stats.error or "generation failed")
                return ev
        # The client went away; nobody will read this.
        raise ApiError(499, "client closed the request")

    async def embeddings(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        loaded = loaded_or_503(self.state)
        get_str(body, "model")
        fmt = get_str(body, "encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise ApiError(400, "encoding_format must be 'float' or 'base64'",
                           param="encoding_format")
        inputs = embedding_inputs(body, "input")
        embedder = loaded.embedder
        if embedder is None:
            raise ApiError(501, "embeddings are turned off on this server")
        vectors, n_tokens = await run_embeddings(embedder, inputs)
        return JSONResponse({
            "object": "list",
            "data": [{"object": "embedding", "index": i,
                      "embedding": _b64(v) if fmt == "base64" else v}
                     for i, v in enumerate(vectors)],
            "model": loaded.model_id,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        })


def _b64(vec: list[float]) -> str:
    """Little-endian float32, as OpenAI sends `encoding_format=base64` (its client's default)."""
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")


def embedding_inputs(body: dict[str, Any], key: str) -> list[str]:
    v = body.get(key)
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise ApiError(400, f"'{key}' must be a non-empty string or list of non-empty strings",
                       param=key)
    if len(v) > MAX_EMBED_INPUTS:
        raise ApiError(400, f"'{key}' takes at most {MAX_EMBED_INPUTS} strings", param=key)
    return list(v)


async def run_embeddings(embedder: Embedder, inputs: list[str]
                         ) -> tuple[list[list[float]], int]:
    """Embed on the embedder's own thread so generation streams keep flowing."""
    def work() -> tuple[list[list[float]], int]:
        out, total = [], 0
        for text in inputs:
            vec, n = embedder.embed(text)
            out.append(vec)
            total += n
        return out, total

    try:
        return await asyncio.get_running_loop().run_in_executor(embedder.executor, work)
    except EngineError as e:
        raise ApiError(400, str(e)) from None
