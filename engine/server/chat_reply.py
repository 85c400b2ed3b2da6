"""What a chat request asks of its reply, as the OpenAI, Ollama, Anthropic and Responses
routes see it. The planning lives in engine.host.chat_plan and the reading in
engine.decoding.reply_reader (the desktop chat uses both too); here the plan takes the served
model and answers a bad request with a 400 naming the field. The reply formats that are
protocol fields (`response_format`, Ollama's `format`) are compiled here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.decoding import constraints
from engine.decoding.constraints import GrammarError
from engine.decoding.tool_calls import ToolChoice
from engine.host import chat_plan
from engine.host.chat_plan import ChatPlan, PlanError
from engine.native.projector import Media
from engine.server.engine_state import ServedModel
from engine.server.errors import ApiError
from engine.server.protocol.openai import ResponseFormat


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
) -> ChatPlan:
    """`engine.host.chat_plan.plan_chat` for a served model; what it refuses is a 400.
    `media`: the messages' images and audio, one marker each in their text, in order
    (`media_param`: the field that holds them)."""
    try:
        return chat_plan.plan_chat(
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
        )
    except PlanError as e:
        param = media_param if media and e.param == "messages" else e.param
        raise ApiError(400, str(e), param=param) from None


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


__all__ = ["ollama_grammar", "openai_grammar", "plan_chat"]
