"""Loading and unloading models by hand: `/v1/models/{id}/load` and `/unload` (behind the API
key, like every route but /health). Requests load models on their own; these are for apps that
want a model ready before their first request, or its memory back now."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.host.host import ModelBusy, ModelNotFound, ModelNotLoaded
from engine.server.engine_state import ServerState
from engine.server.errors import ApiError
from engine.server.parsing import read_json
from engine.server.protocol.base import keep_seconds
from engine.server.protocol.hosting import HostedModelState, LoadModelRequest
from engine.server.protocol.parse import parse_body


def hosted_obj(state: ServerState, name: str) -> dict[str, Any]:
    h = next((h for h in state.host.hosted() if h.name == name), None)
    if h is None:
        return HostedModelState(id=name, loaded=False).wire()
    return HostedModelState(
        id=h.name,
        loaded=h.state == "ready",
        state=h.state,
        pinned=h.pinned,
        held_by=h.owner,
        requests_in_flight=h.in_flight,
        keep_alive_s=h.keep_s,
        expires_in_s=h.expires_in_s,
        memory_bytes=dict(h.memory),
    ).wire()


class ModelRoutes:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def routes(self) -> list[Route]:
        return [
            Route("/v1/models/{model_id:path}/load", self.load, methods=["POST"]),
            Route("/v1/models/{model_id:path}/unload", self.unload, methods=["POST"]),
        ]

    async def _body(self, request: Request) -> LoadModelRequest:
        raw = await request.body()
        if not raw.strip():
            return LoadModelRequest()
        return parse_body(
            LoadModelRequest, await read_json(request, self.state.config.max_body_bytes)
        )

    async def load(self, request: Request) -> Response:
        req = await self._body(request)
        keep = keep_seconds(req.keep_alive)
        loaded = await self.state.acquire(
            request.path_params["model_id"], keep_s=keep, generate=False
        )
        name = self.state.host.resolve(loaded.model_id)
        if req.pinned is not None:
            self.state.host.pin(name, req.pinned)
        return JSONResponse(hosted_obj(self.state, name))

    async def unload(self, request: Request) -> Response:
        """Unloaded now when idle; with requests in flight, as soon as they end (202)."""
        wanted = request.path_params["model_id"]
        host = self.state.host
        try:
            name = host.resolve(wanted)
            host.pin(name, False)
            host.set_keep(name, 0.0)
        except ModelNotFound as e:
            raise ApiError(404, str(e), code="model_not_found") from None
        except ModelNotLoaded:
            return JSONResponse(HostedModelState(id=wanted, loaded=False).wire())
        except ModelBusy as e:
            raise ApiError(409, str(e), code="model_held") from None
        gone = host.wait_unloaded(name, 5.0)
        return JSONResponse(hosted_obj(self.state, name), status_code=200 if gone else 202)


__all__ = ["ModelRoutes"]
