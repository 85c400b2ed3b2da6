"""What a chat request asks of its reply, as the OpenAI, Ollama, Anthropic and Responses
routes see it. The planning lives in engine.host.chat_plan and the reading in
engine.decoding.reply_reader (the desktop chat uses both too); here the plan takes the served
model and answers a bad request with a 400 naming the field. The reply formats that are
protocol fields (`response_format`, Ollama's `format`) are compiled here.

A request's `context_policy` (Candlewick's extension, in every chat dialect) fits the
conversation to a slot's context, keeping the answer's tokens (its max_tokens, at most half
the context); without it the conversation is sent whole, as before. Policy "summarise" asks
the same model, through the same loop, for a summary of the turns that do not fit, then
sends it in their place (`fitted_plan`). The answer's `X-Context-Left-Out` header says how
many messages were left out (`left_out_headers`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request

from engine.decoding import constraints
from engine.decoding.constraints import GrammarError
from engine.decoding.tool_calls import ToolChoice
from engine.host import chat_plan
from engine.host.chat_plan import ChatPlan, PlanError
from engine.host.context_policy import ContextFullError, ContextPolicy
from engine.host.context_summary import Summary, fitted_summary_request, summary_room
from engine.host.requests import Finished, Piece
from engine.native.projector import Media, marker
from engine.server.common import events_until_disconnect, start
from engine.server.engine_state import ServedModel, ServerState
from engine.server.errors import ApiError
from engine.server.protocol.openai import ResponseFormat
from engine.settings import SamplingParams

LEFT_OUT_HEADER = "X-Context-Left-Out"


def plan_chat(
    loaded: ServedModel,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]],
    choice: ToolChoice,
    parallel: bool,
    grammar: str | None,
    grammar_param: str,
    think: bool | None,
    separate_reasoning: bool = True,
    media: Sequence[Media] = (),
    media_param: str = "messages",
    policy: ContextPolicy | None = None,
    reserve: int = 0,
    summary: Summary | None = None,
    budget: int | None = None,
    template_kwargs: dict[str, Any] | None = None,
    effort: str | None = None,
    budget_message: str = "",
    default_budget: int | None = None,
) -> ChatPlan:
    """`engine.host.chat_plan.plan_chat` for a served model; what it refuses is a 400.
    `media`: the messages' images and audio, one marker each in their text, in order
    (`media_param`: the field that holds them). `policy`: the request's context_policy,
    `reserve` the answer's tokens."""
    try:
        plan = chat_plan.plan_chat(
            loaded.model,
            messages,
            tools=tools,
            choice=choice,
            parallel=parallel,
            grammar=grammar,
            grammar_param=grammar_param,
            think=think,
            separate_reasoning=separate_reasoning,
            media=media,
            policy=policy,
            reserve=reserve,
            summary=summary,
            budget=budget,
            template_kwargs=template_kwargs,
            effort=effort,
            budget_message=budget_message,
            default_budget=default_budget,
        )
    except PlanError as e:
        param = media_param if media and e.param == "messages" else e.param
        raise ApiError(400, str(e), param=param) from None
    except ContextFullError as e:
        raise ApiError(400, str(e), param="messages", code="context_length_exceeded") from None
    n_ctx = loaded.model.n_ctx_seq
    if policy is not None and media and len(plan.prompt) + reserve > n_ctx:
        # A conversation with media is not fitted: its rows are known once it is split.
        raise ApiError(
            400,
            f"'context_policy': a conversation with images or audio is not fitted; it is "
            f"{len(plan.prompt)} tokens and the context holds {n_ctx} ({reserve} kept for "
            "the answer)",
            param="context_policy",
        )
    return plan


def answer_reserve(loaded: ServedModel, max_tokens: int) -> int:
    """The tokens kept for the answer when a conversation is fitted (as the desktop chat
    keeps them): its max_tokens, at most half a slot's context."""
    return min(max_tokens, loaded.model.n_ctx_seq // 2)


async def fitted_plan(
    request: Request,
    state: ServerState,
    loaded: ServedModel,
    messages: list[dict[str, Any]],
    *,
    policy: ContextPolicy | None,
    reserve: int,
    **kw: Any,
) -> ChatPlan:
    """`plan_chat` with the request's context policy. Policy "summarise": when turns are
    left out, the model is asked for their summary first (greedy, on the same loop), and
    the conversation is planned again with the summary in their place. A request without
    a reasoning budget has the server's (--reasoning-budget)."""
    kw.setdefault("default_budget", state.config.reasoning_budget)
    plan = plan_chat(loaded, messages, policy=policy, reserve=reserve, **kw)
    if policy != "summarise" or not plan.left_out or kw.get("media"):
        return plan
    model = loaded.model
    room = min(summary_room(model.n_ctx_seq), state.config.max_tokens_cap)  # the server's cap
    marks = marker() if model.projector is not None else ""
    # A transcript too long for the context: the summary is of its latest turns.
    request_messages, _ = fitted_summary_request(
        messages,
        plan.left_out,
        lambda ms: len(model.chat_tokens(ms, enable_thinking=False)),
        model.n_ctx_seq - room,
        marker=marks,
    )
    if not request_messages:
        return plan
    ask = plan_chat(
        loaded,
        request_messages,
        tools=[],
        choice="none",
        parallel=False,
        grammar=None,
        grammar_param="context_policy",
        think=False,
    )
    sampling = ask.sampling(SamplingParams(temperature=0.0, max_tokens=room, seed=0))
    gen = start(state, loaded, ask.prompt, sampling, stream=True)
    reader = ask.reader()
    text: str | None = None
    # Closed at once: its watcher must stop reading the request before the answer's turn.
    async with contextlib.aclosing(events_until_disconnect(request, gen)) as events:
        async for ev in events:
            if isinstance(ev, Piece):
                reader.push(ev.text, ev.n_tokens)
            elif isinstance(ev, Finished):
                if ev.stats.stop_reason == "error":
                    error = ev.stats.error or "no reason given"
                    raise ApiError(500, f"the summary failed: {error}")
                text = reader.finish(ev.stats)[1].content.strip()
                break
    if text is None:
        raise ApiError(499, "client closed the request")
    if not text:  # nothing to put in their place: they are left out as they are
        return plan
    return plan_chat(
        loaded, messages, policy=policy, reserve=reserve, summary=Summary(text, plan.left_out), **kw
    )


def left_out_headers(
    plan: ChatPlan, policy: ContextPolicy | None, headers: dict[str, str] | None = None
) -> dict[str, str]:
    """`headers` with the count of messages left out, when the request set a policy."""
    out = dict(headers or {})
    if policy is not None:
        out[LEFT_OUT_HEADER] = str(len(plan.left_out))
    return out


def _compiled(make: Any, param: str) -> str:
    try:
        return str(make())
    except GrammarError as e:
        raise ApiError(400, f"'{param}': {e}", param=param) from None


def openai_grammar(
    response_format: ResponseFormat | None, gbnf: str | None
) -> tuple[str | None, str]:
    """The reply's format from `response_format` or llama-server's `grammar` (GBNF), and
    the field it came from. The request model has refused the two together."""
    if gbnf is not None:
        return _compiled(lambda: constraints.gbnf(gbnf), "grammar"), "grammar"
    kind = response_format.type if response_format else None
    if kind == "json_object":
        return constraints.any_json_object(), "response_format"
    if kind == "json_schema" and response_format and response_format.json_schema:
        schema = response_format.json_schema.schema_
        return _compiled(
            lambda: constraints.json_schema(schema, what="the schema"), "response_format"
        ), "response_format"
    return None, "response_format"


def ollama_grammar(fmt: str | dict[str, Any] | None) -> str | None:
    """Ollama's `format`: "json" or a JSON schema ("" or absent: free text)."""
    if fmt == "json":
        return constraints.any_json_object()
    if isinstance(fmt, dict):
        return _compiled(lambda: constraints.json_schema(fmt, what="the schema"), "format")
    return None


__all__ = [
    "LEFT_OUT_HEADER",
    "answer_reserve",
    "fitted_plan",
    "left_out_headers",
    "ollama_grammar",
    "openai_grammar",
    "plan_chat",
]
