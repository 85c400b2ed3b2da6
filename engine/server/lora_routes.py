"""`GET /lora-adapters` and `POST /lora-adapters`: the served model's LoRA adapters and the
scales requests get when they name none, as llama-server has them (`--lora`, shapes in
protocol.lora). The adapters are loaded with the model (`serve --lora`); a new scale applies
to the requests that start after it, without reloading anything: the decode loop switches the
context's adapters between steps (engine.host.batch_builder)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.errors import EngineError
from engine.host.scheduler import lora_scales
from engine.server.engine_state import ServedModel, ServerState
from engine.server.errors import ApiError
from engine.server.parsing import read_json_value
from engine.server.protocol.lora import LoraAdapterInfo, LoraAdapters, LoraApplied, LoraScales
from engine.server.protocol.parse import parse_body


def adapters(loaded: ServedModel) -> LoraAdapters:
    model = loaded.model
    return LoraAdapters(
        [
            LoraAdapterInfo(
                id=a.id,
                path=str(a.path),
                scale=scale,
                task_name=a.task_name,
                prompt_prefix=a.prompt_prefix,
            )
            for a, scale in zip(model.loras, model.lora_scales, strict=True)
        ]
    )


class LoraRoutes:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def routes(self) -> list[Route]:
        # One route for both methods, so that another method's 405 allows both.
        return [Route("/lora-adapters", self.route, methods=["GET", "POST"])]

    async def route(self, request: Request) -> Response:
        return await (self.list(request) if request.method != "POST" else self.set(request))

    def _loaded(self) -> ServedModel:
        loaded = self.state.loaded
        if loaded is None:
            raise self.state.unavailable()
        return loaded

    async def list(self, request: Request) -> Response:
        return JSONResponse(adapters(self._loaded()).wire())

    async def set(self, request: Request) -> Response:
        body = await read_json_value(request, self.state.config.max_body_bytes)
        if not isinstance(body, list):
            raise ApiError(400, "the request body must be a JSON array of {id, scale}")
        scales = parse_body(LoraScales, body).root
        model = self._loaded().model
        try:  # an empty list sets every adapter to 0, as llama-server's does
            zero = tuple(0.0 for _ in model.lora_scales)
            new = lora_scales(zero, {a.id: a.scale for a in scales})
        except EngineError as e:
            raise ApiError(400, f"'id': {str(e).removeprefix('lora: ')}", param="id") from None
        model.lora_scales = new  # read by each request as it is queued
        return JSONResponse(LoraApplied(success=True).wire())
