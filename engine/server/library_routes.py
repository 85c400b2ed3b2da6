"""Ollama's model management over the server's `ModelStore` (engine.server.model_store):
`/api/pull` (progress as Ollama's NDJSON status lines), `/api/delete`, `/api/copy` and
`/api/create`. A server built without a store answers them 501.

A pull is looked up on the Hub before its answer starts, so a name the Hub does not have is
a plain 404; its progress lines follow the download manager's jobs. A client that leaves a
streamed pull pauses its downloads (their bytes kept): pulling again resumes them.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.host.host import ModelBusy
from engine.server.engine_state import ServerState, same_file
from engine.server.errors import ApiError
from engine.server.model_store import ModelStore, NamedModel, PullProgress, StoreError
from engine.server.parsing import read_json
from engine.server.protocol.ollama import OllamaOptions
from engine.server.protocol.ollama_models import (
    OllamaCopyRequest,
    OllamaCreateRequest,
    OllamaDeleteRequest,
    OllamaPullRequest,
    OllamaStatus,
)
from engine.server.protocol.parse import parse_body

T = TypeVar("T")
NDJSON = "application/x-ndjson"


def api_error(e: StoreError) -> ApiError:
    return ApiError(e.status, e.message, param=e.param)


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """A store call (files, the Hub) on a worker thread; its refusal as the API's error."""
    try:
        return await asyncio.to_thread(fn, *args)
    except StoreError as e:
        raise api_error(e) from None


def _line(status: OllamaStatus) -> str:
    return json.dumps(status.wire()) + "\n"


def pulling(p: PullProgress) -> OllamaStatus:
    # As Ollama words it: the digest's first twelve hex digits.
    short = p.digest.split(":", 1)[-1][:12]
    return OllamaStatus(
        status=f"pulling {short}", digest=p.digest, total=p.total, completed=p.completed
    )


def recipe_messages(
    named: NamedModel | None, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A created model's conversation: its system prompt when the request sends none (as
    Ollama does), then its first messages, then the request's."""
    if named is None or not named.has_recipe:
        return messages
    own_system = bool(messages) and messages[0].get("role") == "system"
    head: list[dict[str, Any]] = []
    if named.system and not own_system:
        head.append({"role": "system", "content": named.system})
    start = [{"role": m["role"], "content": m["content"]} for m in named.messages]
    if own_system:
        return [messages[0], *start, *messages[1:]]
    return [*head, *start, *messages]


def recipe_options(named: NamedModel | None, options: OllamaOptions | None) -> OllamaOptions | None:
    """A created model's parameters under the request's own options (those win)."""
    if named is None or not named.parameters:
        return options
    given = options.model_dump(mode="json", exclude_unset=True) if options else {}
    try:
        return parse_body(OllamaOptions, {**named.parameters, **given})
    except ApiError as e:  # the saved parameters were edited by hand since
        raise ApiError(
            400, f"model {named.name!r} has parameters this server refuses: {e}", param="model"
        ) from None


def modelfile(named: NamedModel) -> tuple[str, str]:
    """A created model's Modelfile and its parameters as Ollama's /api/show writes them."""
    params = []
    for key, value in named.parameters.items():
        for v in value if isinstance(value, list) else [value]:
            params.append(f"{key} {json.dumps(v) if isinstance(v, str) else v}")
    lines = [f"FROM {named.base}"]
    if named.system:
        lines.append(f'SYSTEM """{named.system}"""')
    lines += [f"PARAMETER {p}" for p in params]
    lines += [f'MESSAGE {m["role"]} """{m["content"]}"""' for m in named.messages]
    lines += [f'LICENSE """{text}"""' for text in named.license]
    return "\n".join(lines) + "\n", "\n".join(params)


class LibraryRoutes:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def routes(self) -> list[Route]:
        return [
            Route("/api/pull", self.pull, methods=["POST"]),
            Route("/api/delete", self.delete, methods=["DELETE"]),
            Route("/api/copy", self.copy, methods=["POST"]),
            Route("/api/create", self.create, methods=["POST"]),
        ]

    def _store(self) -> ModelStore:
        if self.state.store is None:
            raise ApiError(501, "this server does not manage models (no model library)")
        return self.state.store

    async def pull(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(OllamaPullRequest, body)
        store = self._store()
        plan = await off_loop(store.plan_pull, req.model_name)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[OllamaStatus | NamedModel | StoreError] = asyncio.Queue()
        stop = threading.Event()

        def report(p: PullProgress) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, pulling(p))

        def run() -> None:
            result: NamedModel | StoreError
            try:
                result = store.pull(plan, report, stop)
            except StoreError as e:
                result = e
            loop.call_soon_threadsafe(queue.put_nowait, result)

        worker = threading.Thread(target=run, name="candlewick-pull", daemon=True)
        worker.start()
        finish = [OllamaStatus(status=s) for s in ("verifying sha256 digest", "writing manifest")]
        if req.stream is False:
            try:
                while not isinstance(item := await queue.get(), NamedModel | StoreError):
                    pass
            finally:
                stop.set()  # the client left before the end: the downloads pause
            if isinstance(item, StoreError):
                raise api_error(item)
            return JSONResponse(OllamaStatus(status="success").wire())

        async def lines() -> AsyncIterator[str]:
            try:
                yield _line(OllamaStatus(status="pulling manifest"))
                while isinstance(item := await queue.get(), OllamaStatus):
                    yield _line(item)
                if isinstance(item, StoreError):
                    yield json.dumps({"error": item.message}) + "\n"
                    return
                for status in (*finish, OllamaStatus(status="success")):
                    yield _line(status)
            finally:
                stop.set()

        return StreamingResponse(lines(), media_type=NDJSON)

    def _before_remove(self, path: Path) -> None:
        """Unload the file's model first, as `ollama rm` does; a client of the app holding
        it (the chat) or requests in flight keep it: a 409."""
        host = self.state.host
        for h in host.hosted():
            if h.path is None or not same_file(h.path, path):
                continue
            if h.owner is not None:
                raise StoreError(409, f"{h.name} is held by the {h.owner}: let it go there first")
            try:
                host.unload(h.name)
            except ModelBusy as e:
                raise StoreError(409, f"{e}; delete it once they end") from None

    async def delete(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(OllamaDeleteRequest, body)
        await off_loop(self._store().delete, req.model_name, self._before_remove)
        return Response(status_code=200)

    async def copy(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(OllamaCopyRequest, body)
        await off_loop(self._store().copy, req.source, req.destination)
        return Response(status_code=200)

    async def create(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(OllamaCreateRequest, body)
        store = self._store()
        params = (
            req.parameters.model_dump(mode="json", exclude_unset=True) if req.parameters else {}
        )
        messages: Sequence[Mapping[str, str]] = [m.model_dump() for m in req.messages or ()]

        def create() -> NamedModel:
            return store.create(
                req.model,
                req.from_,
                system=req.system,
                parameters=params,
                messages=messages,
                license=req.licenses,
            )

        await off_loop(create)
        steps = ["reading model metadata"]
        steps += [f"creating {what} layer" for what, has in _layers(req) if has]
        steps += ["writing manifest", "success"]
        if req.stream is False:
            return JSONResponse(OllamaStatus(status="success").wire())

        async def lines() -> AsyncIterator[str]:
            for step in steps:
                yield _line(OllamaStatus(status=step))

        return StreamingResponse(lines(), media_type=NDJSON)


def _layers(req: OllamaCreateRequest) -> list[tuple[str, bool]]:
    """The parts of a created model, as Ollama names the layers it writes."""
    return [
        ("system", bool(req.system)),
        ("parameters", bool(req.parameters)),
        ("messages", bool(req.messages)),
        ("license", bool(req.licenses)),
    ]


__all__ = ["LibraryRoutes", "modelfile", "recipe_messages", "recipe_options"]
