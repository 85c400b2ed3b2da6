"""`/infill`: code fill-in-the-middle in llama-server's shapes, for editor plugins (llama.vim,
llama.vscode). The prompt is the one llama-server builds (engine.decoding.fim) from the
model's FIM tokens as llama.cpp reads them; a model without them is a 400 saying which are
missing. The request then runs on the model's one loop like any completion: streamed as
server-sent events of llama-server's partial results, the last one the whole answer's fields
(no `[DONE]`: llama-server sends none on its native routes), or answered whole."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.decoding.fim import InfillInput, infill_prompt
from engine.host.requests import Finished, Piece
from engine.server.common import (
    cap_tokens,
    events_until_disconnect,
    sampling_from,
    start,
    tokens_for,
)
from engine.server.engine_state import AsyncGeneration, ServedModel, ServerState
from engine.server.errors import ApiError, llama_error_body
from engine.server.parsing import read_json
from engine.server.protocol.base import HOLE, Template
from engine.server.protocol.infill import InfillAnswer, InfillChunkEvent, InfillRequest, StopType
from engine.server.protocol.llama import Timings
from engine.server.protocol.llama_utility import SamplingDefaults
from engine.server.protocol.parse import parse_body
from engine.settings import SamplingParams

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_STOP_TYPES: dict[str, StopType] = {
    "stop": "eos",
    "stop_string": "word",
    "length": "limit",
    "context_full": "limit",
}


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def fim_prompt(state: ServerState, loaded: ServedModel, req: InfillRequest) -> list[int]:
    """The request's prompt tokens, llama-server's layout; a 400 when the model has no FIM
    tokens."""
    model = loaded.model
    fim = model.fim_tokens()
    missing = fim.missing()
    if missing:
        raise ApiError(
            400,
            f"infill is not supported by model {loaded.model_id!r}: {', '.join(missing)}",
            code="model_not_supported",
            param="model",
        )
    special = model.special_tokens()
    data = InfillInput(
        prefix=req.input_prefix,
        suffix=req.input_suffix,
        extra=[(c.filename, c.text) for c in req.input_extra],
        prompt=req.prompt,
    )

    def build() -> list[int]:
        return infill_prompt(
            lambda text, parse: model.tokenize(text, add_special=False, parse_special=parse),
            fim,
            data,
            n_batch=loaded.scheduler.n_batch,
            n_ctx=loaded.scheduler.n_ctx_seq,
            n_predict=cap_tokens(state, None),  # the default answer, where llama-server has -n
            bos=special.bos if special.add_bos else None,
            spm=state.config.spm_infill,
        )

    return tokens_for(loaded, build)


class InfillRoutes:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def routes(self) -> list[Route]:
        return [Route("/infill", self.infill, methods=["POST"])]

    def _sampling(self, req: InfillRequest) -> SamplingParams:
        return sampling_from(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            repeat_penalty=req.repeat_penalty,
            seed=req.seed,
            max_tokens=cap_tokens(self.state, None if req.n_predict == -1 else req.n_predict),
            stop=req.stop,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
        )

    async def infill(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(InfillRequest, body)
        sampling = self._sampling(req)
        loaded = await self.state.acquire(req.model)
        prompt = fim_prompt(self.state, loaded, req)
        stream = bool(req.stream)
        gen = start(self.state, loaded, prompt, sampling, stream=stream)
        model = loaded.model
        prompt_text = b"".join(model.token_bytes(t, special=True) for t in prompt).decode(
            "utf-8", errors="replace"
        )

        def answer(done: Finished, content: str) -> InfillAnswer:
            st = done.stats
            stop_type = _STOP_TYPES.get(st.stop_reason, "none")
            return InfillAnswer(
                index=0,
                content=content,
                tokens=[],
                stop=True,
                model=loaded.model_id,
                tokens_predicted=st.gen_tokens,
                tokens_evaluated=st.prompt_tokens,
                generation_settings=SamplingDefaults.of(sampling, stream=stream),
                prompt=prompt_text,
                has_new_line="\n" in done.text,
                truncated=False,  # a prompt longer than a slot is refused, never shifted
                stop_type=stop_type,
                # Which of several stop strings matched is not kept; one is that one.
                stopping_word=sampling.stop[0]
                if stop_type == "word" and len(sampling.stop) == 1
                else "",
                tokens_cached=st.prompt_tokens + st.gen_tokens,
                timings=Timings.of(st),
            )

        if not stream:
            async for ev in events_until_disconnect(request, gen):
                if isinstance(ev, Finished):
                    if ev.stats.stop_reason == "error":
                        raise ApiError(500, ev.stats.error or "generation failed")
                    return JSONResponse(answer(ev, ev.text).wire())
            raise ApiError(499, "client closed the request")
        return StreamingResponse(
            self._events(gen, len(prompt), answer),
            media_type="text/event-stream",
            headers=_SSE_HEADERS,
        )

    async def _events(
        self,
        gen: AsyncGeneration,
        n_prompt: int,
        answer: Callable[[Finished, str], InfillAnswer],
    ) -> AsyncIterator[str]:
        piece = Template(
            InfillChunkEvent(
                index=0,
                content=HOLE,
                tokens=[],
                stop=False,
                tokens_predicted=0,
                tokens_evaluated=n_prompt,
            ),
            _dumps,
            keys=("tokens_predicted",),
        )
        async for ev in gen.events():
            if isinstance(ev, Piece):
                yield f"data: {piece.fill(ev.text, ev.n_tokens)}\n\n"
            elif isinstance(ev, Finished):
                if ev.stats.stop_reason == "error":
                    body = llama_error_body(500, ev.stats.error or "generation failed")
                    yield f"data: {_dumps(body)}\n\n"
                    return
                # The content was streamed: the last event carries the rest, as llama-server's.
                yield f"data: {_dumps(answer(ev, '').wire())}\n\n"
