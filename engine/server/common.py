"""Pieces shared by the OpenAI and Ollama routes: start a generation, watch for disconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any

from starlette.requests import Request

from engine.decoding.thinking_budget import ThinkingBudget
from engine.errors import EngineError
from engine.host.requests import Event, QueueFull, SchedulerClosed
from engine.media.prompt import MediaPrompt
from engine.model.templates import ChatTemplateError
from engine.server.engine_state import AsyncGeneration, ServedModel, ServerState
from engine.server.errors import ApiError
from engine.settings import SamplingParams


def tokens_for(loaded: ServedModel, make: Callable[[], list[int]]) -> list[int]:
    try:
        return make()
    except (ChatTemplateError, EngineError) as e:
        raise ApiError(400, str(e)) from None


def start(
    state: ServerState,
    loaded: ServedModel,
    prompt: list[int],
    sampling: SamplingParams,
    *,
    stream: bool,
    media: MediaPrompt | None = None,
    logprobs: int | None = None,
    lora: dict[int, float] | None = None,
    thinking: ThinkingBudget | None = None,
) -> AsyncGeneration:
    """The request on the model's loop (`media`: the prompt's images and audio; `logprobs`:
    each token's log probability and this many alternatives; `lora`: its adapters' scales
    by id, the others 0; an unknown id is a 400; `thinking`: the reply's reasoning
    budget)."""
    try:
        return AsyncGeneration(
            loaded,
            prompt,
            sampling,
            stream=stream,
            media=media,
            logprobs=logprobs,
            lora=lora,
            thinking=thinking,
            timeout_s=state.config.request_timeout_s,
            metrics=state.metrics,
        )
    except QueueFull as e:
        raise ApiError(
            429, f"the server is busy: {e}; retry shortly", headers={"Retry-After": "1"}
        ) from None
    except SchedulerClosed as e:
        raise ApiError(503, str(e)) from None
    except EngineError as e:
        raise ApiError(400, str(e)) from None


def cap_tokens(state: ServerState, requested: int | None) -> int:
    """Requests asking for more than the server's cap get the cap (documented)."""
    cfg = state.config
    return min(requested or cfg.default_max_tokens, cfg.max_tokens_cap)


async def until_disconnect(request: Request) -> None:
    """Returns when the client goes away (after the body has been read)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def events_until_disconnect(
    request: Request, gen: AsyncGeneration
) -> AsyncGenerator[Event, None]:
    """The generation's events; stops (and cancels the request) if the client disconnects.

    Used for non-streaming answers, where nothing is written until the end and a vanished
    client would otherwise keep a slot busy."""
    watcher = asyncio.ensure_future(until_disconnect(request))
    it = gen.events().__aiter__()
    try:
        while True:
            nxt = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({nxt, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if nxt not in done:
                nxt.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await nxt
                gen.cancel()
                return
            try:
                yield nxt.result()
            except StopAsyncIteration:
                return
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        with contextlib.suppress(Exception):
            await it.aclose()  # type: ignore[attr-defined]
        if not gen.request.done.is_set():
            gen.cancel()


# A request that sets no repeat penalty gets none (OpenAI's API has none, llama-server's
# default is 1.0); SamplingParams' 1.1 is the desktop chat's default, shown in its settings.
API_REPEAT_PENALTY = 1.0
OLLAMA_REPEAT_PENALTY = 1.1  # Ollama's api.DefaultOptions


def sampling_from(
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    min_p: float | None,
    repeat_penalty: float | None,
    seed: int | None,
    max_tokens: int,
    stop: tuple[str, ...],
    *,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    default_repeat_penalty: float = API_REPEAT_PENALTY,
) -> SamplingParams:
    """A request's sampling: what it sets, the API's defaults for the rest. A field left
    out means what the dialect's own server does: OpenAI, Anthropic and llama-server apply no
    repeat penalty; Ollama's default is 1.1 (its routes pass that)."""
    d: dict[str, Any] = {
        "max_tokens": max_tokens,
        "stop": stop,
        "seed": seed,
        "repeat_penalty": default_repeat_penalty,
    }
    if frequency_penalty is not None:
        d["frequency_penalty"] = frequency_penalty
    if presence_penalty is not None:
        d["presence_penalty"] = presence_penalty
    if temperature is not None:
        d["temperature"] = temperature
    if top_p is not None:
        d["top_p"] = top_p
    if top_k is not None:
        d["top_k"] = top_k
    if min_p is not None:
        d["min_p"] = min_p
    if repeat_penalty is not None:
        d["repeat_penalty"] = repeat_penalty
    sp = SamplingParams(**d)
    try:
        sp.validate()
    except EngineError as e:
        raise ApiError(400, str(e)) from None
    return sp
