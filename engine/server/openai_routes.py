"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.decoding.reply_reader import Part, ReplyReader
from engine.decoding.tool_calls import ToolCall
from engine.errors import EngineError
from engine.host.host import UNSET, Loadable, ModelNotFound, Unset
from engine.host.logprobs import TokenLogprob
from engine.host.requests import Finished, Piece
from engine.host.stats import GenerationStats
from engine.server.chat_reply import (
    answer_reserve,
    fitted_plan,
    left_out_headers,
    openai_grammar,
)
from engine.server.common import (
    cap_tokens,
    events_until_disconnect,
    sampling_from,
    start,
    tokens_for,
)
from engine.server.embeddings import Embedder
from engine.server.engine_state import (
    AsyncGeneration,
    ServedModel,
    ServerState,
    served_capabilities,
)
from engine.server.errors import ApiError, openai_error_body
from engine.server.library_routes import recipe_messages, recipe_options
from engine.server.llama_stream import PING, LlamaStream
from engine.server.media_parts import decode_media
from engine.server.model_store import NamedModel
from engine.server.parsing import read_json
from engine.server.protocol.base import HOLE, Reply, Template
from engine.server.protocol.embeddings import Embedding, EmbeddingList, EmbeddingRequest
from engine.server.protocol.hosting import ModelCard, ModelList
from engine.server.protocol.llama import Timings
from engine.server.protocol.logprobs import ChatLogprobs, TextColumns, TextLogprobs, entries
from engine.server.protocol.ollama import OllamaOptions
from engine.server.protocol.openai import (
    FINGERPRINT,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChunkToolCall,
    CompletionRequest,
    FinishReason,
    ReplyFunction,
    ReplyMessage,
    ReplyToolCall,
    TextChoice,
    TextChunkChoice,
    TextCompletion,
    TextCompletionChunk,
    Usage,
)
from engine.server.protocol.parse import parse_body
from engine.server.reply_logprobs import CONTENT, PartLogprobs
from engine.settings import SamplingParams

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def finish_reason(st: GenerationStats, calls: list[ToolCall] | None = None) -> FinishReason:
    """A call the token limit cut is "length", with the partial call in `tool_calls`."""
    if calls and all(c.complete for c in calls):
        return "tool_calls"
    if calls:
        return "length"
    return "stop" if st.stop_reason in ("stop", "stop_string") else "length"


def usage(st: GenerationStats) -> Usage:
    return Usage(
        prompt_tokens=st.prompt_tokens,
        completion_tokens=st.gen_tokens,
        total_tokens=st.prompt_tokens + st.gen_tokens,
        prompt_tokens_details={"cached_tokens": st.cached_tokens},
        completion_tokens_details={"reasoning_tokens": st.thinking_tokens},
    )


def _call(call: ToolCall) -> ReplyToolCall:
    return ReplyToolCall(
        id=call.id,
        type="function",
        function=ReplyFunction(name=call.name, arguments=call.arguments),
    )


def _model_obj(loaded: ServedModel) -> ModelCard:
    return ModelCard(
        id=loaded.model_id,
        object="model",
        created=loaded.created,
        owned_by="candlewick",
        loaded=True,
        capabilities=served_capabilities(loaded),
        meta=loaded.settings(),
    )


def _known_obj(spec: Loadable) -> ModelCard:
    """A model of the catalog that is not loaded: a request for it loads it."""
    created = int(spec.path.stat().st_mtime) if spec.path.exists() else 0
    return ModelCard(
        id=spec.name, object="model", created=created, owned_by="candlewick", loaded=False
    )


def models_list(state: ServerState) -> list[ModelCard]:
    """Every model a request may name: the loaded ones (with their settings), the catalog's
    others, and the names pulled, copied or created through Ollama's routes (a created
    one's chat answers with its system prompt and parameters)."""
    served = state.served()
    out = [_model_obj(m) for m in served]
    paths = {m.model.path for m in served}
    out += [_known_obj(s) for s in state.host.known() if s.path not in paths]
    ids = {c.id for c in out}
    for m in state.store.named_models() if state.store is not None else ():
        if m.name not in ids and m.path.exists():
            out.append(
                ModelCard(
                    id=m.name,
                    object="model",
                    created=int(m.created_at or m.path.stat().st_mtime),
                    owned_by="candlewick",
                    loaded=m.path in paths,
                )
            )
    return out


def _ttl(ttl: int | None) -> float | Unset | None:
    return UNSET if ttl is None else float(ttl)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _sse(reply: Reply) -> str:
    return f"data: {_dumps(reply.wire())}\n\n"


def _error_event(message: str) -> str:
    return f"data: {_dumps(openai_error_body(500, message))}\n\n"


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
        data = models_list(self.state)
        if not data:
            raise self.state.unavailable()  # nothing to list yet: say why
        return JSONResponse(ModelList(object="list", data=data).wire())

    async def model(self, request: Request) -> Response:
        name = request.path_params["model_id"]
        for card in models_list(self.state):
            if card.id == name:
                return JSONResponse(card.wire())
        try:
            name = self.state.host.resolve(name)
        except ModelNotFound as e:
            raise ApiError(404, str(e), code="model_not_found") from None
        return JSONResponse(next(c for c in models_list(self.state) if c.id == name).wire())

    def _sampling(
        self, req: ChatCompletionRequest | CompletionRequest, named: NamedModel | None = None
    ) -> SamplingParams:
        """The request's sampling; a created model's parameters for what it leaves out."""
        max_tokens = req.max_completion_tokens
        if max_tokens is None:
            max_tokens = req.max_tokens
        o = recipe_options(named, None) or OllamaOptions()
        if max_tokens is None and o.num_predict is not None and o.num_predict > 0:
            max_tokens = o.num_predict

        def given(name: str) -> Any:
            v = getattr(req, name)
            return getattr(o, name) if v is None else v

        return sampling_from(
            temperature=given("temperature"),
            top_p=given("top_p"),
            top_k=given("top_k"),
            min_p=given("min_p"),
            repeat_penalty=given("repeat_penalty"),
            seed=given("seed"),
            max_tokens=cap_tokens(self.state, max_tokens),
            stop=req.stop or o.stop,
            frequency_penalty=given("frequency_penalty"),
            presence_penalty=given("presence_penalty"),
        )

    async def chat(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(ChatCompletionRequest, body)
        named = self.state.named(req.model)  # made by /api/create: its recipe applies
        sampling = self._sampling(req, named)
        loaded = await self.state.acquire(req.model, keep_s=_ttl(req.ttl), recipes=True)
        stream = bool(req.stream)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        grammar, grammar_param = openai_grammar(req.response_format, req.grammar)
        media = await decode_media(loaded, req.chat_media())
        plan = await fitted_plan(
            request,
            self.state,
            loaded,
            recipe_messages(named, req.chat_messages()),
            policy=req.context_policy,
            reserve=answer_reserve(loaded, sampling.max_tokens),
            tools=req.chat_tools(),
            choice=req.chosen_tool(),
            parallel=req.parallel_tool_calls is not False,
            grammar=grammar,
            grammar_param=grammar_param,
            think=None,
            separate_reasoning=req.reasoning_format != "none",
            media=media,
            budget=req.asked_budget(),
            effort=req.reasoning_effort,
            budget_message=req.reasoning_budget_message or "",
            template_kwargs=req.chat_template_kwargs,
        )
        sampling = plan.sampling(sampling)
        want = req.asked_logprobs()
        # Thinking is timed from the pieces as they come, streamed to the client or not; a
        # token's log probability goes with the part its piece became.
        gen = start(
            self.state,
            loaded,
            plan.prompt,
            sampling,
            stream=stream or plan.markers is not None or want is not None,
            media=plan.media,
            logprobs=want,
            lora=req.lora_scales(),
            thinking=plan.thinking,
        )
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        model = req.model if named is not None and req.model else loaded.model_id
        reader = plan.reader()
        extras = LlamaStream(req, gen)  # llama-server's timings, progress and pings
        follow = None if want is None else PartLogprobs(CONTENT)
        if not stream:
            done = await self._result(request, gen, reader, follow)
            tail, reply = reader.finish(done.stats)
            if follow is not None:
                follow.push(tail, ())
            message = ReplyMessage(
                role="assistant",
                content=reply.content or (None if reply.calls or reply.forced else ""),
            )
            if reply.reasoning:
                message.reasoning_content = reply.reasoning
            if reply.calls:
                message.tool_calls = [_call(c) for c in reply.calls]
            choice = ChatChoice(
                index=0,
                logprobs=None if follow is None else _chat_logprobs(follow.taken),
                message=message,
                finish_reason=finish_reason(done.stats, reply.calls),
            )
            answer = ChatCompletion(
                id=cid,
                created=created,
                model=model,
                system_fingerprint=FINGERPRINT,
                object="chat.completion",
                choices=[choice],
                usage=usage(done.stats),
            )
            answer.timings = Timings.of(done.stats)
            return JSONResponse(answer.wire(), headers=left_out_headers(plan, req.context_policy))

        def chunk(
            delta: ChatDelta | None,
            reason: FinishReason | None = None,
            last: Usage | None = None,
            lp: ChatLogprobs | None = None,
        ) -> ChatCompletionChunk:
            """A chunk of one choice, or (no delta) the last one, of the usage."""
            one = (
                []
                if delta is None
                else [ChatChunkChoice(index=0, delta=delta, logprobs=lp, finish_reason=reason)]
            )
            out = ChatCompletionChunk(
                id=cid,
                created=created,
                model=model,
                system_fingerprint=FINGERPRINT,
                object="chat.completion.chunk",
                choices=one,
            )
            if last is not None:
                out.usage = last
            return out

        # A piece of text or thinking per token: filled into a chunk checked once.
        said = Template(chunk(ChatDelta(content=HOLE)), _dumps)
        thought = Template(chunk(ChatDelta(reasoning_content=HOLE)), _dumps)

        def deltas(parts: list[Part], lps: tuple[TokenLogprob, ...] = ()) -> Iterator[str]:
            owns = None if follow is None else follow.push(parts, lps)
            for k, (kind, text) in enumerate(parts):
                if owns is None and extras.now is None:
                    yield f"data: {(thought if kind == 'reasoning' else said).fill(text)}\n\n"
                    continue
                # Built whole: a content chunk with its tokens' log probabilities, and with
                # timings_per_token each chunk with the timings so far.
                if kind == "reasoning":
                    one = chunk(ChatDelta(reasoning_content=text))
                else:
                    lp = None if owns is None else _chat_logprobs(owns[k])
                    one = chunk(ChatDelta(content=text), lp=lp)
                if extras.now is not None:
                    one.timings = extras.now
                yield _sse(one)

        async def body_iter() -> AsyncIterator[str]:
            yield _sse(chunk(ChatDelta(role="assistant", content="")))
            async for ev in extras.events():
                if ev is None:  # silent for sse_ping_interval seconds
                    yield PING
                    continue
                progress = extras.progress(ev)
                if progress is not None:
                    note = chunk(ChatDelta())
                    note.prompt_progress = progress
                    yield _sse(note)
                if isinstance(ev, Piece):
                    extras.tick(ev)
                    for line in deltas(reader.push(ev.text, ev.n_tokens), ev.logprobs):
                        yield line
                elif isinstance(ev, Finished):
                    if ev.stats.stop_reason == "error":
                        yield _error_event(ev.stats.error or "generation failed")
                        return
                    tail, reply = reader.finish(ev.stats)
                    for line in deltas(tail):
                        yield line
                    for k, call in enumerate(reply.calls):
                        c = _call(call)
                        at = ChunkToolCall(index=k, id=c.id, type=c.type, function=c.function)
                        yield _sse(chunk(ChatDelta(tool_calls=[at])))
                    end = chunk(ChatDelta(), finish_reason(ev.stats, reply.calls))
                    last = chunk(None, last=usage(ev.stats)) if include_usage else None
                    # llama-server's timings go on the stream's last chunk
                    (end if last is None else last).timings = Timings.of(ev.stats)
                    yield _sse(end)
                    if last is not None:
                        yield _sse(last)
            yield "data: [DONE]\n\n"

        return StreamingResponse(
            body_iter(),
            media_type="text/event-stream",
            headers=left_out_headers(plan, req.context_policy, _SSE_HEADERS),
        )

    async def completions(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(CompletionRequest, body)
        loaded = await self.state.acquire(req.model, keep_s=_ttl(req.ttl))
        stream = bool(req.stream)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        grammar, _ = openai_grammar(req.response_format, req.grammar)
        sampling = replace(self._sampling(req), grammar=grammar)
        prompt = tokens_for(loaded, lambda: loaded.model.tokenize(req.prompt))
        gen = start(
            self.state,
            loaded,
            prompt,
            sampling,
            stream=stream,
            logprobs=req.logprobs,
            lora=req.lora_scales(),
        )
        cid, created, model = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time()), loaded.model_id
        columns = None if req.logprobs is None else TextColumns()
        if not stream:
            done = await self._result(request, gen)
            choice = TextChoice(
                index=0,
                text=done.text,
                logprobs=None if columns is None else columns.take(done.logprobs),
                finish_reason=finish_reason(done.stats),
            )
            answer = TextCompletion(
                id=cid,
                created=created,
                model=model,
                object="text_completion",
                system_fingerprint=FINGERPRINT,
                choices=[choice],
                usage=usage(done.stats),
            )
            return JSONResponse(answer.wire())

        def chunk(
            text: str | None,
            reason: FinishReason | None = None,
            last: Usage | None = None,
            lp: TextLogprobs | None = None,
        ) -> TextCompletionChunk:
            """A chunk of one choice, or (no text) the last one, of the usage."""
            one = (
                []
                if text is None
                else [TextChunkChoice(index=0, text=text, logprobs=lp, finish_reason=reason)]
            )
            out = TextCompletionChunk(
                id=cid,
                created=created,
                model=model,
                object="text_completion",
                system_fingerprint=FINGERPRINT,
                choices=one,
            )
            if last is not None:
                out.usage = last
            return out

        piece = Template(chunk(HOLE), _dumps)  # one per token: checked once

        async def body_iter() -> AsyncIterator[str]:
            async for ev in gen.events():
                if isinstance(ev, Piece) and columns is not None:
                    yield _sse(chunk(ev.text, lp=columns.take(ev.logprobs)))
                elif isinstance(ev, Piece):
                    yield f"data: {piece.fill(ev.text)}\n\n"
                elif isinstance(ev, Finished):
                    if ev.stats.stop_reason == "error":
                        yield _error_event(ev.stats.error or "generation failed")
                        return
                    yield _sse(chunk("", finish_reason(ev.stats)))
                    if include_usage:
                        yield _sse(chunk(None, last=usage(ev.stats)))
            yield "data: [DONE]\n\n"

        return StreamingResponse(body_iter(), media_type="text/event-stream", headers=_SSE_HEADERS)

    async def _result(
        self,
        request: Request,
        gen: AsyncGeneration,
        reader: ReplyReader | None = None,
        follow: PartLogprobs | None = None,
    ) -> Finished:
        """The finished generation; a reader is fed its pieces (streamed internally for
        timing or log probabilities, which `follow` takes) or, when none came, its whole
        text."""
        pieces = False
        async for ev in events_until_disconnect(request, gen):
            if isinstance(ev, Piece) and reader is not None:
                pieces = True
                parts = reader.push(ev.text, ev.n_tokens)
                if follow is not None:
                    follow.push(parts, ev.logprobs)
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
        req = parse_body(EmbeddingRequest, body)
        loaded = await self.state.acquire(req.model, keep_s=_ttl(req.ttl), generate=False)
        embedder = loaded.embedder
        if embedder is None:
            raise ApiError(501, "embeddings are turned off on this server")
        vectors, n_tokens = await run_embeddings(embedder, req.input)
        answer = EmbeddingList(
            object="list",
            data=[
                Embedding(
                    object="embedding",
                    index=i,
                    embedding=_b64(v) if req.encoding_format == "base64" else v,
                )
                for i, v in enumerate(vectors)
            ],
            model=loaded.model_id,
            usage={"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        )
        return JSONResponse(answer.wire())


def _chat_logprobs(lps: Sequence[TokenLogprob]) -> ChatLogprobs:
    return ChatLogprobs(content=entries(lps), refusal=None)


def _b64(vec: list[float]) -> str:
    """Little-endian float32, as OpenAI sends `encoding_format=base64` (its client's default)."""
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")


async def run_embeddings(embedder: Embedder, inputs: list[str]) -> tuple[list[list[float]], int]:
    """Embed on the embedder's own thread so generation streams keep flowing."""

    def work() -> tuple[list[list[float]], int]:
        got = embedder.embed_many(inputs)
        return [vec for vec, _ in got], sum(n for _, n in got)

    try:
        return await asyncio.get_running_loop().run_in_executor(embedder.executor, work)
    except EngineError as e:
        raise ApiError(400, str(e)) from None
