"""The ASGI application: routes, API-key check, CORS, metrics and error shaping.

Middleware is plain ASGI (not BaseHTTPMiddleware) so streamed answers pass straight through and
a client disconnect reaches the route that must cancel its generation.
"""

from __future__ import annotations

import hmac
import logging
import time
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.host.host import Lease
from engine.server.anthropic_routes import AnthropicRoutes
from engine.server.chat_reply import LEFT_OUT_HEADER
from engine.server.engine_state import ServerState, request_leases
from engine.server.errors import ApiError, error_response
from engine.server.infill_routes import InfillRoutes
from engine.server.library_routes import LibraryRoutes
from engine.server.llama_routes import LlamaRoutes
from engine.server.lora_routes import LoraRoutes
from engine.server.metrics import ModelFigures
from engine.server.model_routes import ModelRoutes
from engine.server.ollama_routes import OllamaRoutes
from engine.server.openai_routes import OpenAIRoutes
from engine.server.openapi import openapi_schema
from engine.server.protocol.hosting import Health
from engine.server.request_log import RequestRecord, current_record
from engine.server.rerank_routes import RerankRoutes
from engine.server.responses_routes import ResponsesRoutes
from engine.server.slot_routes import SlotRoutes
from engine.server.speech_routes import SpeechRoutes
from engine.server.transcription_routes import TranscriptionRoutes
from engine.server.webui import ui_mount, ui_paths

log = logging.getLogger("candlewick.server")

PUBLIC_PATHS = frozenset({"/health"})


class AuthMiddleware:
    """When a key is set, every route except /health needs `Authorization: Bearer KEY`
    (or `x-api-key: KEY`). The comparison is constant-time; the key is never logged."""

    def __init__(
        self, app: ASGIApp, api_key: str | None, public: frozenset[str] = frozenset()
    ) -> None:
        self.app = app
        self._key = api_key.encode() if api_key else None
        self._public = public  # paths anyone may GET: a web UI's files (engine.server.webui)

    def _authorized(self, scope: Scope) -> bool:
        assert self._key is not None
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = token.strip()
            elif name == b"x-api-key" and not given:
                given = value.strip()
        # compare_digest also takes time independent of where the first difference is.
        return hmac.compare_digest(given, self._key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or self._key is None
            or scope["path"] in PUBLIC_PATHS
            or (scope["method"] in ("GET", "HEAD") and scope["path"] in self._public)
            or scope["method"] == "OPTIONS"
            or self._authorized(scope)
        ):
            await self.app(scope, receive, send)
            return
        resp = error_response(
            scope["path"],
            401,
            "missing or invalid API key",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await resp(scope, receive, send)


class LeaseMiddleware:
    """Holds the models a request uses (`ServerState.acquire`) until its answer has been sent,
    streamed answers included, so none is unloaded under it; then lets them go."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        leases: list[Lease] = []
        token = request_leases.set(leases)
        try:
            await self.app(scope, receive, send)
        finally:
            request_leases.reset(token)
            for lease in leases:
                lease.release()


class MetricsMiddleware:
    """Counts every answered request by route and status (unknown paths share one label) and,
    when the state has a request log, records it there (method, path, status, tokens, time)."""

    def __init__(self, app: ASGIApp, state: ServerState, known: frozenset[str]) -> None:
        self.app = app
        self.state = state
        self.known = known

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]
        log_ = self.state.request_log
        record = None
        if log_ is not None:
            client = scope.get("client")
            record = RequestRecord(
                scope["method"], scope["path"], f"{client[0]}:{client[1]}" if client else ""
            )
            current_record.set(record)  # this task's context only
        t0 = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            path = scope["path"]
            route = path if path in self.known else "other"
            self.state.metrics.request_done(route, status[0])
            if log_ is not None and record is not None:
                record.status = status[0]
                record.latency_s = time.perf_counter() - t0
                log_.append(record)


def create_app(state: ServerState) -> ASGIApp:
    cfg = state.config
    openai = OpenAIRoutes(state)
    ollama = OllamaRoutes(state)
    stt = TranscriptionRoutes(state)
    schema = openapi_schema(cfg)

    async def health(request: Request) -> Response:
        loaded = state.loaded
        hosted = state.host.hosted()
        if (
            state.load_error
            or state.starting
            or (loaded is None and not hosted and not state.host.known())
        ):
            status = "error" if state.load_error else "loading"
            return JSONResponse(
                Health(status=status, error=state.load_error).wire(), status_code=503
            )
        body = Health(
            status="ok",
            models=[
                {
                    "name": h.name,
                    "state": h.state,
                    "pinned": h.pinned,
                    "held_by": h.owner,
                    "requests_in_flight": h.in_flight,
                    "expires_in_s": h.expires_in_s,
                    "memory_bytes": dict(h.memory),
                }
                for h in hosted
            ],
            loading=[h.name for h in hosted if h.state == "loading"],
            speech_to_text=stt.status(),
        )
        if loaded is not None:
            snap = loaded.scheduler.snapshot()
            body.model = loaded.model_id
            body.slots_total = snap.n_slots
            body.slots_busy = snap.busy_slots
            body.queue_depth = snap.queue_depth
            body.settings = loaded.settings()
        return JSONResponse(body.wire())

    async def metrics(request: Request) -> Response:
        loaded = state.loaded
        snap = loaded.scheduler.snapshot() if loaded else None
        served = {m.model_id: m for m in state.served()}
        figures = [
            ModelFigures(
                h.name,
                h.state == "ready",
                h.in_flight,
                h.memory,
                served[h.name].scheduler.snapshot() if h.name in served else None,
            )
            for h in state.host.hosted()
        ]
        return PlainTextResponse(
            state.metrics.render(
                snap,
                loaded is not None,
                figures,
                state.host.loads,
                loaded.model.state_cache if loaded else None,
            ),
            media_type="text/plain; version=0.0.4",
        )

    async def openapi(request: Request) -> Response:
        return JSONResponse(schema)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        *SlotRoutes(state).routes(),
        *InfillRoutes(state).routes(),
        *ModelRoutes(state).routes(),
        *openai.routes(),
        *RerankRoutes(state).routes(),
        *SpeechRoutes(state).routes(),
        *stt.routes(),
        *LlamaRoutes(state).routes(),
        *LoraRoutes(state).routes(),
        *ResponsesRoutes(state).routes(),
        *AnthropicRoutes(state).routes(),
        *ollama.routes(),
        *LibraryRoutes(state).routes(),
    ]
    known = frozenset(r.path for r in routes if "{" not in r.path)
    ui = frozenset[str]()
    mounts: list[BaseRoute] = []
    if cfg.webui_dir is not None:
        ui = ui_paths(cfg.webui_dir)
        mounts.append(ui_mount(cfg.webui_dir))  # after every route: none is hidden

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(
            request.url.path,
            exc.status,
            exc.message,
            param=exc.param,
            code=exc.code,
            headers=exc.headers,
        )

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        path = request.url.path
        msg = {404: f"no such route: {request.method} {path}", 405: "method not allowed"}.get(
            exc.status_code, str(exc.detail)
        )
        # A route the server does not have: llama-server's 404, which its web UI reads.
        return error_response(
            path,
            exc.status_code,
            msg,
            headers=dict(exc.headers or {}),
            llama=exc.status_code == 404,
        )

    async def on_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error in %s", request.url.path)
        return error_response(request.url.path, 500, f"internal error: {type(exc).__name__}")

    handlers: dict[Any, Any] = {
        ApiError: on_api_error,
        HTTPException: on_http_error,
        Exception: on_error,
    }
    middleware = [
        Middleware(MetricsMiddleware, state=state, known=known),
        Middleware(LeaseMiddleware),
    ]
    if cfg.cors_origins:
        # Outside the key check, so browsers' preflight requests get their answer.
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(cfg.cors_origins),
                allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                allow_headers=[
                    "Authorization",
                    "Content-Type",
                    "X-Api-Key",
                    "Anthropic-Version",
                    "Anthropic-Beta",
                ],
                expose_headers=[LEFT_OUT_HEADER],  # a browser client reads what was left out
                max_age=600,
            )
        )
    middleware.append(Middleware(AuthMiddleware, api_key=cfg.api_key, public=ui))
    return Starlette(routes=[*routes, *mounts], middleware=middleware, exception_handlers=handlers)
