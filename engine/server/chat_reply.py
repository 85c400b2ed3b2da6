"""What a chat request asks of its reply, shared by the OpenAI and Ollama routes: the prompt
rendered with its tools, the grammar the reply must follow, and the reading of the reply
into thinking, content and tool calls (streamed or whole).

The model's own template renders the tools when it knows them (its family's format, from
engine.decoding.tool_calls); otherwise the generic format describes them in a system message
and a grammar makes every answer a JSON object of calls or of a response, as llama-server's
generic handler does. A forced call (`required`, a named function) is always decoded under
the grammar of the call, so its arguments are valid against the function's schema.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from engine.decoding import constraints
from engine.decoding.constraints import GrammarError
from engine.decoding.reasoning import (
    ReasoningSplitter,
    ThinkMarkers,
    starts_thinking,
    thinking_markers,
)
from engine.decoding.tool_calls import (
    ToolCall,
    ToolCallStream,
    ToolChoice,
    ToolFormat,
    tool_format_for,
)
from engine.host.stats import GenerationStats
from engine.model.templates import ChatTemplateError
from engine.server.engine_state import LoadedModel
from engine.server.errors import ApiError
from engine.server.protocol import ResponseFormat
from engine.settings import SamplingParams

Part = tuple[Literal["reasoning", "content"], str]


@dataclass
class ChatPlan:
    """A chat request turned into what the loop runs and how its reply is read."""

    prompt: list[int]
    grammar: str | None
    fmt: ToolFormat | None  # tools offered (and their calls parsed), or None
    markers: ThinkMarkers | None  # the reply's thinking is separated, or None
    in_thinking: bool

    def sampling(self, sampling: SamplingParams) -> SamplingParams:
        """The request's sampling with what the reply needs: its grammar, and control tokens
        written out where a tool format's markers may be one."""
        return replace(sampling, grammar=self.grammar,
                       special_text=self.fmt is not None and self.fmt.native)


def plan_chat(loaded: LoadedModel, messages: list[dict[str, Any]], *,
              tools: list[dict[str, Any]], choice: ToolChoice, parallel: bool,
              grammar: str | None, grammar_param: str, think: bool | None,
              separate_reasoning: bool = True) -> ChatPlan:
    """`grammar`: the reply's own format (response_format / Ollama format), if any. `think`:
    Ollama's switch (None: the model's default); with False a thinking model is asked not to
    think where its template lets it (`enable_thinking`)."""
    model = loaded.model
    source = model.template.source
    markers = thinking_markers(source)
    if think and markers is None:
        raise ApiError(400, "'think': this model does not think (its chat template has no "
                       "thinking block)", param="think")
    offered = bool(tools) and choice != "none"
    has_history = any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
    fmt = tool_format_for(source) if offered or has_history else None
    if offered and grammar is not None:
        raise ApiError(400, f"'{grammar_param}' cannot be combined with tools (the reply is "
                       "either a call or text in that format)", param=grammar_param)
    extra: dict[str, Any] = {}
    if think is False or (grammar is not None and markers is not None):
        # Qwen3's switch; a grammar from the first token leaves no room for a thinking block.
        extra["enable_thinking"] = False
    msgs = messages
    if fmt is not None:
        msgs = fmt.template_messages(messages, tools if offered else [])
        if offered:
            extra.update(fmt.template_vars(tools))
    try:
        text = model.render_chat(msgs, **extra)
        prompt = model.chat_prompt_tokens(text)
    except ChatTemplateError as e:
        raise ApiError(400, str(e)) from None
    in_thinking = starts_thinking(text, markers)
    if offered and fmt is not None:
        try:
            specials = {m: t for m in fmt.markers
                        if (t := model.special_token(m)) is not None}
            tool_grammar = fmt.grammar(tools, choice, parallel, special_tokens=specials)
            if tool_grammar is not None:
                grammar = constraints.lark(tool_grammar, what="the tools' call grammar")
        except GrammarError as e:
            raise ApiError(400, f"'tools': {e}", param="tools") from None
    return ChatPlan(prompt, grammar, fmt if offered else None,
                    markers if separate_reasoning else None, in_thinking)


@dataclass
class ReplyResult:
    content: str
    reasoning: str
    calls: list[ToolCall] = field(default_factory=list)


class ReplyReader:
    """Reads a reply piece by piece: thinking apart from the answer, tool calls out of it.
    The same code reads a whole answer (one push, then finish), so streamed and not streamed
    replies are split alike."""

    def __init__(self, plan: ChatPlan) -> None:
        self._split = ReasoningSplitter(plan.markers, in_thinking=plan.in_thinking)
        self._calls: ToolCallStream | None = plan.fmt.stream() if plan.fmt else None
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._t0 = time.perf_counter()
        self._think_end: tuple[int, float] | None = None
        self._thought = False
        self._n = 0

    def push(self, text: str, n_tokens: int = 0) -> list[Part]:
        self._n = max(self._n, n_tokens)
        was = self._split.thinking
        out = self._route(self._split.push(text))
        if was and not self._split.thinking and self._think_end is None:
            self._think_end = (n_tokens, time.perf_counter() - self._t0)
        return out

    def _route(self, parts: Sequence[tuple[str, str]]) -> list[Part]:
        out: list[Part] = []
        for kind, text in parts:
            if not text:
                continue
            if kind == "reasoning":
                self._thought = True
                self._reasoning.append(text)
                out.append(("reasoning", text))
                continue
            shown = self._calls.push(text) if self._calls is not None else text
            if shown:
                self._content.append(shown)
                out.append(("content", shown))
        return out

    def finish(self, stats: GenerationStats | None = None) -> tuple[list[Part], ReplyResult]:
        """The parts still held back, and the whole reply."""
        tail = self._route(self._split.flush())
        calls: list[ToolCall] = []
        if self._calls is not None:
            rest, calls = self._calls.finish()
            if rest:
                self._content.append(rest)
                tail.append(("content", rest))
        if stats is not None and self._thought:
            n, s = self._think_end or (stats.gen_tokens, time.perf_counter() - self._t0)
            stats.thinking_tokens, stats.thinking_s = n, s
        return tail, ReplyResult("".join(self._content), "".join(self._reasoning), calls)


def read_whole(plan: ChatPlan, text: str, stats: GenerationStats) -> ReplyResult:
    reader = ReplyReader(plan)
    reader.push(text, stats.gen_tokens)
    return reader.finish(stats)[1]


def _compiled(make: Any, param: str) -> str:
    try:
        return str(make())
    except GrammarError as e:
        raise ApiError(400, f"'{param}': {e}", param=param) from None


def openai_grammar(response_format: ResponseFormat | None, gbnf: str | None
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
        return _compiled(lambda: constraints.json_schema(schema, what="the schema"),
                         "response_format"), "response_format"
    return None, "response_format"


def ollama_grammar(fmt: str | dict[str, Any] | None) -> str | None:
    """Ollama's `format`: "json" or a JSON schema ("" or absent: free text)."""
    if fmt == "json":
        return constraints.any_json_object()
    if isinstance(fmt, dict):
        return _compiled(lambda: constraints.json_schema(fmt, what="the schema"), "format")
    return None
