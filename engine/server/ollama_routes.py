"""Ollama-compatible routes, so apps written for Ollama work unchanged.

A request names its model as in Ollama (`model`, the id, an alias or the file name); one that
is known but not loaded is loaded first, and `keep_alive` says how long it stays. Streaming is
NDJSON and on by default, as in Ollama.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.decoding.reply_reader import Part
from engine.decoding.tool_calls import ToolCall
from engine.host.chat_plan import ChatPlan
from engine.host.host import ModelNotFound
from engine.host.logprobs import TokenLogprob
from engine.host.requests import Finished, Piece
from engine.host.stats import GenerationStats
from engine.model.facts import model_facts
from engine.model.gguf import GGUFError, read_gguf
from engine.model.templates import CHATML_TEMPLATE
from engine.server.chat_reply import (
    answer_reserve,
    fitted_plan,
    left_out_headers,
    ollama_grammar,
    plan_chat,
)
from engine.server.common import (
    OLLAMA_REPEAT_PENALTY,
    cap_tokens,
    events_until_disconnect,
    sampling_from,
    start,
    tokens_for,
)
from engine.server.engine_state import (
    ServedModel,
    ServerState,
    capabilities,
    details,
    facts_details,
    file_digest,
    media_capabilities,
)
from engine.server.errors import ApiError
from engine.server.library_routes import modelfile, recipe_messages, recipe_options
from engine.server.media_parts import decode_media
from engine.server.model_store import NamedModel
from engine.server.openai_routes import run_embeddings
from engine.server.parsing import read_json
from engine.server.protocol.base import HOLE, Template, keep_seconds
from engine.server.protocol.logprobs import entries
from engine.server.protocol.media import media_text
from engine.server.protocol.ollama import (
    OllamaChatRequest,
    OllamaEmbedRequest,
    OllamaEmbedResponse,
    OllamaError,
    OllamaGenerateRequest,
    OllamaModelEntry,
    OllamaOptions,
    OllamaReply,
    OllamaReplyCall,
    OllamaReplyFunction,
    OllamaReplyMessage,
    OllamaRunning,
    OllamaRunningEntry,
    OllamaShowRequest,
    OllamaShowResponse,
    OllamaTags,
    OllamaVersion,
    images_media,
)
from engine.server.protocol.parse import parse_body
from engine.server.reply_logprobs import CONTENT, SHOWN, PartLogprobs
from engine.settings import SamplingParams

VERSION = "0.1.0"


_FOREVER = "2318-08-31T00:00:00Z"  # what Ollama says for a model kept loaded


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _with_figures(reply: OllamaReply, st: GenerationStats) -> OllamaReply:
    """The last line: why it ended and the figures, in nanoseconds."""
    ns = 1_000_000_000
    reply.done_reason = "stop" if st.stop_reason in ("stop", "stop_string") else "length"
    reply.total_duration = int(st.total_s * ns)
    reply.load_duration = 0
    reply.prompt_eval_count = st.prompt_tokens
    reply.prompt_eval_duration = int(max(st.ttft_s - st.queue_s, 0.0) * ns)
    reply.eval_count = st.gen_tokens
    reply.eval_duration = int(max(st.total_s - st.ttft_s, 0.0) * ns)
    return reply


def _arguments(call: ToolCall) -> Any:
    """Ollama sends a call's arguments as an object, not as JSON text."""
    try:
        return json.loads(call.arguments)
    except ValueError:
        return {}


def _with_recipe(answer: OllamaShowResponse, named: NamedModel) -> None:
    """A named model's /api/show: its Modelfile, parameters, system prompt and license."""
    answer.modelfile, answer.parameters = modelfile(named)
    answer.details = {**answer.details, "parent_model": named.base}
    if named.system:
        answer.system = named.system
    if named.license:
        answer.license = "\n".join(named.license)


class OllamaRoutes:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def routes(self) -> list[Route]:
        return [
            Route("/api/version", self.version, methods=["GET"]),
            Route("/api/tags", self.tags, methods=["GET"]),
            Route("/api/ps", self.ps, methods=["GET"]),
            Route("/api/show", self.show, methods=["POST"]),
            Route("/api/chat", self.chat, methods=["POST"]),
            Route("/api/generate", self.generate, methods=["POST"]),
            Route("/api/embed", self.embed, methods=["POST"]),
        ]

    async def version(self, request: Request) -> Response:
        return JSONResponse(OllamaVersion(version=VERSION).wire())

    def _model_entry(self, loaded: ServedModel) -> OllamaModelEntry:
        st = loaded.model.path.stat()
        return OllamaModelEntry(
            name=loaded.model_id,
            model=loaded.model_id,
            modified_at=_iso(st.st_mtime),
            size=st.st_size,
            digest=loaded.digest,
            details=details(loaded),
        )

    async def tags(self, request: Request) -> Response:
        """Every model a request may name, loaded or not (Ollama's local models)."""
        served = self.state.served()
        entries = [self._model_entry(m) for m in served]
        paths = {m.model.path for m in served}
        for spec in self.state.host.known():
            if spec.path not in paths and spec.path.exists():
                st = spec.path.stat()
                entries.append(
                    OllamaModelEntry(
                        name=spec.name,
                        model=spec.name,
                        modified_at=_iso(st.st_mtime),
                        size=st.st_size,
                        digest=file_digest(spec.path),
                        details={"format": "gguf"},
                    )
                )
        entries += self._named_entries()
        if not entries:
            raise self.state.unavailable()  # nothing to list yet: say why
        return JSONResponse(OllamaTags(models=entries).wire())

    def _named_entries(self) -> list[OllamaModelEntry]:
        """The store's names (pulled, copied, created), each listed as Ollama lists them."""
        store = self.state.store
        out = []
        for m in store.named_models() if store is not None else ():
            if m.path.exists():
                st = m.path.stat()
                out.append(
                    OllamaModelEntry(
                        name=m.name,
                        model=m.name,
                        modified_at=_iso(m.created_at or st.st_mtime),
                        size=st.st_size,
                        digest=file_digest(m.path),
                        details={"format": "gguf", "parent_model": m.base},
                    )
                )
        return out

    async def ps(self, request: Request) -> Response:
        """The loaded models: size in memory (and on GPUs), when each will be unloaded."""
        out = []
        served = {m.model_id: m for m in self.state.served()}
        now = time.time()
        for h in self.state.host.hosted():
            if h.state != "ready":
                continue
            loaded = served.get(h.name)
            size = sum(h.memory.values())
            vram = sum(n for dev, n in h.memory.items() if dev != "CPU")
            # Ollama writes a far-off date for a model that stays.
            until = now + h.expires_in_s if h.expires_in_s is not None else None
            out.append(
                OllamaRunningEntry(
                    name=h.name,
                    model=h.name,
                    size=size,
                    size_vram=vram,
                    digest=loaded.digest if loaded else "",
                    details=details(loaded) if loaded else {"format": "gguf"},
                    expires_at=_iso(until) if until is not None else _FOREVER,
                    context_length=loaded.scheduler.n_ctx_seq if loaded else 0,
                    pinned=h.pinned,
                    held_by=h.owner,
                    requests_in_flight=h.in_flight,
                    keep_alive_s=h.keep_s,
                )
            )
        return JSONResponse(OllamaRunning(models=out).wire())

    async def show(self, request: Request) -> Response:
        """A model's details, read from its file when it is not loaded: clients ask for
        every model they list, and none is loaded for that."""
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(OllamaShowRequest, body)
        name = req.model_name
        named = self.state.named(name)
        if named is not None:  # its file's model, shown with its recipe
            name = await asyncio.to_thread(self.state.name_of_file, named)
        try:
            name = self.state.host.resolve(name)
        except ModelNotFound as e:
            if not e.names:
                raise self.state.unavailable() from None
            raise ApiError(404, str(e)) from None
        loaded = next((m for m in self.state.served() if m.model_id == name), None)
        template: str | None
        if loaded is not None:
            f, template, path = loaded.facts, loaded.model.template.source, loaded.model.path
            embeds = loaded.embedder is not None
        else:
            path = self.state.host.find(name).path
            try:
                gf = await asyncio.to_thread(read_gguf, path)
            except (GGUFError, OSError) as e:
                raise ApiError(400, f"cannot read {path.name}: {e}") from None
            f = model_facts(gf)
            raw = gf.metadata.get("tokenizer.chat_template")
            # What the model will use once loaded: its own template, or the fallback.
            template = raw if isinstance(raw, str) and raw else CHATML_TEMPLATE
            embeds = self.state.config.embeddings
        info: dict[str, Any] = {"general.architecture": f.architecture if f else ""}
        if f:
            info.update(
                {
                    "general.parameter_count": f.n_params,
                    f"{f.architecture}.context_length": f.context_length,
                    f"{f.architecture}.block_count": f.n_layer,
                    f"{f.architecture}.embedding_length": f.n_embd,
                }
            )
        answer = OllamaShowResponse(
            modelfile=f"FROM {path.name}\n",
            parameters="",
            template=template,
            details=facts_details(f),
            model_info=info,
            capabilities=capabilities(
                template,
                embeds,
                embedding_only=bool(f and f.embedding_only),
                reranker=bool(f and f.is_reranker),
                media=media_capabilities(loaded) if loaded is not None else (),
            ),
            modified_at=_iso(path.stat().st_mtime),
        )
        if named is not None:
            _with_recipe(answer, named)
        return JSONResponse(answer.wire())

    def _sampling(self, options: OllamaOptions | None) -> SamplingParams:
        o = options or OllamaOptions()
        n = o.num_predict
        return sampling_from(
            frequency_penalty=o.frequency_penalty,
            presence_penalty=o.presence_penalty,
            temperature=o.temperature,
            top_p=o.top_p,
            top_k=o.top_k,
            min_p=o.min_p,
            repeat_penalty=o.repeat_penalty,
            seed=o.seed,
            # Ollama: num_predict -1 (or absent) means "until done"; the server cap applies.
            max_tokens=cap_tokens(self.state, n if n is not None and n > 0 else None),
            stop=o.stop,
            default_repeat_penalty=OLLAMA_REPEAT_PENALTY,
        )

    async def chat(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(OllamaChatRequest, body)
        named = self.state.named(req.model)
        loaded = await self.state.acquire(
            req.model, keep_s=keep_seconds(req.keep_alive), recipes=True
        )
        sampling = self._sampling(recipe_options(named, req.options))
        tools = req.chat_tools()
        media = await decode_media(loaded, req.chat_media())
        plan = await fitted_plan(
            request,
            self.state,
            loaded,
            recipe_messages(named, req.chat_messages()),
            policy=req.context_policy,
            reserve=answer_reserve(loaded, sampling.max_tokens),
            tools=tools,
            choice="auto" if tools else "none",
            parallel=True,
            grammar=ollama_grammar(req.format),
            grammar_param="format",
            think=req.think,
            media=media,
        )
        return await self._respond(
            request,
            loaded,
            plan,
            plan.sampling(sampling),
            req.stream is not False,
            chat=True,
            think=req.think,
            name=req.model if named is not None else None,
            logprobs=req.asked_logprobs(),
            headers=left_out_headers(plan, req.context_policy),
        )

    async def generate(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(OllamaGenerateRequest, body)
        prompt_text, system, think = req.prompt or "", req.system, req.think
        named = self.state.named(req.model)
        sampling = self._sampling(recipe_options(named, req.options))
        grammar = ollama_grammar(req.format)
        keep = keep_seconds(req.keep_alive)
        asks = bool(prompt_text or req.images)  # images alone are a prompt too
        loaded = await self.state.acquire(req.model, keep_s=keep, generate=asks, recipes=True)
        if not asks:
            # Ollama answers an empty prompt by loading the model (keep_alive 0: unloading
            # it) and saying it is done.
            answer = OllamaReply(
                model=req.model if named is not None else loaded.model_id,
                created_at=_now(),
                response="",
                done=True,
                done_reason="unload" if keep == 0 else "load",
            )
            return JSONResponse(answer.wire())
        parts = images_media(req.images, "images")
        if req.raw:
            if think:
                raise ApiError(400, "'think' needs the chat template ('raw' is on)", param="think")
            if parts:
                raise ApiError(400, "'images' need the chat template ('raw' is on)", param="images")
            prompt = tokens_for(loaded, lambda: loaded.model.tokenize(prompt_text))
            plan = ChatPlan(prompt, grammar, None, None, False)
        else:
            media = await decode_media(loaded, parts)
            # As Ollama places them: the images before the prompt.
            user = (media_text() * len(parts) if parts else "") + prompt_text
            msgs: list[dict[str, Any]] = (
                [{"role": "system", "content": system}] if system else []
            ) + [{"role": "user", "content": user}]
            msgs = recipe_messages(named, msgs)
            plan = plan_chat(
                loaded,
                msgs,
                tools=[],
                choice="none",
                parallel=False,
                grammar=grammar,
                grammar_param="format",
                think=think,
                media=media,
                media_param="images",
                default_budget=self.state.config.reasoning_budget,
            )
        return await self._respond(
            request,
            loaded,
            plan,
            plan.sampling(sampling),
            req.stream is not False,
            chat=False,
            think=think,
            name=req.model if named is not None else None,
            logprobs=req.asked_logprobs(),
        )

    async def _respond(
        self,
        request: Request,
        loaded: ServedModel,
        plan: ChatPlan,
        sampling: SamplingParams,
        stream: bool,
        *,
        chat: bool,
        think: bool | None,
        name: str | None = None,
        logprobs: int | None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        gen = start(
            self.state,
            loaded,
            plan.prompt,
            sampling,
            stream=stream or plan.markers is not None or logprobs is not None,
            media=plan.media,
            logprobs=logprobs,
            thinking=plan.thinking,
        )
        reader = plan.reader()
        show_thinking = think is not False
        # A token's log probability goes with the line that shows its text (thinking too).
        follow = None if logprobs is None else PartLogprobs(SHOWN if show_thinking else CONTENT)

        def piece(
            text: str,
            thinking: str = "",
            calls: list[ToolCall] | None = None,
            *,
            done: bool = False,
            created_at: str | None = None,
        ) -> OllamaReply:
            d = OllamaReply(
                model=name or loaded.model_id, created_at=created_at or _now(), done=done
            )
            if chat:
                msg = OllamaReplyMessage(role="assistant", content=text)
                if thinking and show_thinking:
                    msg.thinking = thinking
                if calls:
                    msg.tool_calls = [
                        OllamaReplyCall(
                            function=OllamaReplyFunction(name=c.name, arguments=_arguments(c))
                        )
                        for c in calls
                    ]
                d.message = msg
            else:
                d.response = text
                if thinking and show_thinking:
                    d.thinking = thinking
            return d

        def as_line(reply: OllamaReply) -> str:
            return json.dumps(reply.wire()) + "\n"

        # A line per token: its time and text filled into a line checked once.
        said = Template(piece(HOLE, created_at=HOLE), json.dumps)
        thought = Template(piece("", HOLE, created_at=HOLE), json.dumps)

        def lines_of(parts: list[Part], lps: tuple[TokenLogprob, ...] = ()) -> Iterator[str]:
            if follow is not None:  # asked for: each line built whole
                for (kind, text), own in zip(parts, follow.push(parts, lps), strict=True):
                    if kind == "content" or show_thinking:
                        line = piece(text) if kind == "content" else piece("", text)
                        line.logprobs = entries(own)
                        yield as_line(line)
                return
            for kind, text in parts:
                if kind == "reasoning":
                    if show_thinking:
                        yield thought.fill(_now(), text) + "\n"
                else:
                    yield said.fill(_now(), text) + "\n"

        if not stream:
            async for ev in events_until_disconnect(request, gen):
                if isinstance(ev, Piece):
                    parts = reader.push(ev.text, ev.n_tokens)
                    if follow is not None:
                        follow.push(parts, ev.logprobs)
                elif isinstance(ev, Finished):
                    if ev.stats.stop_reason == "error":
                        raise ApiError(500, ev.stats.error or "generation failed")
                    if not gen.request.stream:  # the text came whole
                        reader.push(ev.text, ev.stats.gen_tokens)
                    tail, reply = reader.finish(ev.stats)
                    whole = piece(reply.content, reply.reasoning, reply.calls, done=True)
                    if follow is not None:
                        follow.push(tail, ())
                        whole.logprobs = entries(follow.taken)
                    return JSONResponse(_with_figures(whole, ev.stats).wire(), headers=headers)
            raise ApiError(499, "client closed the request")

        async def lines() -> AsyncIterator[str]:
            async for ev in gen.events():
                if isinstance(ev, Piece):
                    for line in lines_of(reader.push(ev.text, ev.n_tokens), ev.logprobs):
                        yield line
                elif isinstance(ev, Finished):
                    if ev.stats.stop_reason == "error":
                        failed = OllamaError(error=ev.stats.error or "generation failed")
                        yield json.dumps(failed.wire()) + "\n"
                        return
                    tail, reply = reader.finish(ev.stats)
                    for line in lines_of(tail):
                        yield line
                    if reply.calls:
                        yield as_line(piece("", calls=reply.calls))
                    yield as_line(_with_figures(piece("", done=True), ev.stats))

        return StreamingResponse(lines(), media_type="application/x-ndjson", headers=headers)

    async def embed(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(OllamaEmbedRequest, body)
        loaded = await self.state.acquire(
            req.model, keep_s=keep_seconds(req.keep_alive), generate=False
        )
        if loaded.embedder is None:
            raise ApiError(501, "embeddings are turned off on this server")
        vectors, n = await run_embeddings(loaded.embedder, req.input)
        answer = OllamaEmbedResponse(model=loaded.model_id, embeddings=vectors, prompt_eval_count=n)
        return JSONResponse(answer.wire())
