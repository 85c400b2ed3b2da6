"""llama-server's utility routes over the host's models, in its shapes (its README,
tools/server/server-context.cpp): /tokenize, /detokenize, /apply-template and GET /props.
POST /props, which llama-server started without `--props` refuses with a 501, is a 405 here:
the properties are set when the server starts, and a 5xx would read as a fault. A request's
`model` (GET /props: `?model=`) picks a model as every route does; llama-server's
`?autoload=false` answers only from a model already loaded. Errors come in llama-server's
shape (`errors.llama_error_body`). /tools and /cors-proxy, features of llama-server this
server does not have, answer its 403 for a feature it was started without."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import engine
from engine.host.host import ModelNotFound
from engine.native.projector import marker
from engine.server.chat_reply import plan_chat
from engine.server.common import sampling_from
from engine.server.engine_state import ServedModel, ServerState
from engine.server.errors import ApiError
from engine.server.media_parts import decode_media
from engine.server.parsing import read_json
from engine.server.protocol.llama import LlamaError, LlamaErrorDetail
from engine.server.protocol.llama_utility import (
    ApplyTemplateAnswer,
    ApplyTemplateRequest,
    DetokenizeAnswer,
    DetokenizeRequest,
    GenerationSettings,
    Modalities,
    Props,
    SamplingDefaults,
    TokenizeAnswer,
    TokenizeRequest,
    TokenPiece,
)
from engine.server.protocol.parse import parse_body

PROPS_QUERY = ("model", "autoload")
# llama-server's features this server does not have, which llama-server started without them
# answers with a 403 (`res_403`): tools it runs itself, and the web UI's proxy for MCP servers.
DISABLED = {
    "/tools": "this server runs no tools of its own (a client's tools go in a chat's 'tools')",
    "/cors-proxy": "this server proxies nothing",
}


def build_info() -> str:
    """What /props reports as `build_info`: this server and the llama.cpp binding it runs."""
    try:
        binding = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        binding = "unknown"
    return f"candlewick {engine.__version__} (llama-cpp-python {binding})"


class LlamaRoutes:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._build_info = build_info()

    def routes(self) -> list[Route]:
        return [
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/apply-template", self.apply_template, methods=["POST"]),
            Route("/props", self.props, methods=["GET"]),
            *(Route(p, self.disabled, methods=["GET", "POST"]) for p in DISABLED),
        ]

    async def _model(self, name: str | None, *, autoload: bool = True) -> ServedModel:
        """The model `name` names (absent: the default), held until the answer is sent;
        without `autoload`, only one already loaded (a 400 otherwise, as llama-server's)."""
        if not autoload:
            wanted = name or self.state.config.model_id
            lease = self.state.host.acquire_ready(wanted)
            if lease is None:
                try:
                    wanted = self.state.host.resolve(wanted)
                except ModelNotFound as e:
                    if not e.names:
                        raise self.state.unavailable() from None
                    raise ApiError(404, str(e), param="model") from None
                raise ApiError(
                    400, f"model {wanted!r} is not loaded (autoload=false)", param="model"
                )
            lease.release()  # held again below, as every route holds its model
        return await self.state.acquire(name, generate=False)

    async def tokenize(self, request: Request) -> Response:
        req = parse_body(
            TokenizeRequest, await read_json(request, self.state.config.max_body_bytes)
        )
        model = (await self._model(req.model)).model
        # On the event loop, as a chat's prompt is tokenized: llama.cpp's tokenizer is fast.
        tokens: list[int] = []
        if isinstance(req.content, str):
            tokens = model.tokenize(
                req.content, add_special=req.add_special, parse_special=req.parse_special
            )
        else:
            # llama-server's tokenize_mixed: ids kept; BOS only before a leading string.
            for i, part in enumerate(req.content):
                if isinstance(part, int):
                    tokens.append(part)
                else:
                    tokens += model.tokenize(
                        part,
                        add_special=req.add_special and i == 0,
                        parse_special=req.parse_special,
                    )
        _check_ids(tokens, model.n_vocab, "content")
        if not req.with_pieces:
            return JSONResponse(TokenizeAnswer(tokens=tokens).wire())
        pieces = [_piece(t, model.token_bytes(t, special=True)) for t in tokens]
        return JSONResponse(TokenizeAnswer(tokens=pieces).wire())

    async def detokenize(self, request: Request) -> Response:
        req = parse_body(
            DetokenizeRequest, await read_json(request, self.state.config.max_body_bytes)
        )
        model = (await self._model(req.model)).model
        _check_ids(req.tokens, model.n_vocab, "tokens")
        # As llama-server's tokens_to_str: every piece, special tokens' text included.
        raw = b"".join(model.token_bytes(t, special=True) for t in req.tokens)
        content = raw.decode("utf-8", errors="replace")
        return JSONResponse(DetokenizeAnswer(content=content).wire())

    async def apply_template(self, request: Request) -> Response:
        """The prompt a chat request with these messages and tools is sent as."""
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(ApplyTemplateRequest, body)
        loaded = await self.state.acquire(req.model)
        media = await decode_media(loaded, req.chat_media())
        plan = plan_chat(
            loaded,
            req.chat_messages(),
            tools=req.chat_tools(),
            choice=req.chosen_tool(),
            parallel=req.parallel_tool_calls is not False,
            grammar=None,
            grammar_param="response_format",
            think=None,
            media=media,
            default_budget=self.state.config.reasoning_budget,
            template_kwargs=req.chat_template_kwargs,
        )
        return JSONResponse(ApplyTemplateAnswer(prompt=plan.text).wire())

    async def props(self, request: Request) -> Response:
        query = request.query_params
        for key in query:
            if key not in PROPS_QUERY:
                raise ApiError(
                    400,
                    f"'{key}' is not a parameter of GET /props (it takes model and autoload)",
                    param=key,
                )
        autoload = query.get("autoload", "true")
        if autoload not in ("true", "false", "1", "0"):
            raise ApiError(400, "'autoload' must be true or false", param="autoload")
        loaded = await self._model(query.get("model"), autoload=autoload in ("true", "1"))
        return JSONResponse(self._props(loaded).wire())

    def _props(self, loaded: ServedModel) -> Props:
        model, cfg = loaded.model, self.state.config
        # What a chat request that sets nothing gets (the API's defaults).
        s = sampling_from(None, None, None, None, None, None, cfg.default_max_tokens, ())
        proj = getattr(model, "projector", None)
        out = Props(
            default_generation_settings=GenerationSettings(
                n_ctx=model.n_ctx_seq,
                params=SamplingDefaults.of(s, stream=False),
            ),
            total_slots=loaded.scheduler.n_slots,
            model_alias=loaded.model_id,
            model_path=str(model.path),
            modalities=Modalities(
                vision=bool(proj is not None and proj.vision),
                audio=bool(proj is not None and proj.audio),
                video=False,
            ),
            endpoint_slots=True,
            endpoint_props=False,
            endpoint_metrics=True,
            chat_template=model.template.source,
            bos_token=model.template.bos_token,
            eos_token=model.template.eos_token,
            build_info=self._build_info,
            is_sleeping=False,
        )
        if proj is not None:
            out.media_marker = marker()
        return out

    async def disabled(self, request: Request) -> Response:
        """llama-server's answer for a feature it was started without, which its web UI
        reads as "off for the life of the server" and stops asking."""
        return JSONResponse(_disabled_answer(request.url.path).wire(), status_code=403)


def _disabled_answer(path: str) -> LlamaError:
    what = DISABLED[path]
    return LlamaError(
        error=LlamaErrorDetail(
            code=403, message=f"this feature is disabled: {what}", type="feature_disabled"
        )
    )


def _check_ids(tokens: Sequence[int], n_vocab: int, param: str) -> None:
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise ApiError(
            400,
            f"'{param}' holds {bad}, which is not a token of this model "
            f"(its vocabulary has {n_vocab})",
            param=param,
        )


def _piece(token: int, raw: bytes) -> TokenPiece:
    """A token and its piece; a piece that is not whole UTF-8 (a byte of a character) as
    its bytes, as llama-server sends it."""
    try:
        return TokenPiece(id=token, piece=raw.decode("utf-8"))
    except UnicodeDecodeError:
        return TokenPiece(id=token, piece=list(raw))


__all__ = ["LlamaRoutes", "build_info"]
