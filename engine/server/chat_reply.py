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

import re
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
from engine.settings import SamplingParams

Part = tuple[Literal["reasoning", "content"], str]
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_TOOLS = 128


def check_tools(tools: Any, *, param: str = "tools") -> list[dict[str, Any]]:
    """OpenAI-shaped tools ({"type": "function", "function": {...}}), checked."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ApiError(400, f"'{param}' must be a list of tools", param=param)
    if len(tools) > MAX_TOOLS:
        raise ApiError(400, f"'{param}' takes at most {MAX_TOOLS} tools", param=param)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise ApiError(400, f"{param}[{i}] must be a function tool "
                           '({"type": "function", "function": {...}})', param=param)
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise ApiError(400, f"{param}[{i}].function must be an object", param=param)
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ApiError(400, f"{param}[{i}].function.name must be 1-64 letters, digits, "
                           "'_', '.' or '-'", param=param)
        if name in seen:
            raise ApiError(400, f"{param}: the function name '{name}' appears twice",
                           param=param)
        seen.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ApiError(400, f"{param}[{i}].function.parameters must be a JSON schema "
                           "object", param=param)
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ApiError(400, f"{param}[{i}].function.description must be a string",
                           param=param)
        entry: dict[str, Any] = {"name": name, "parameters": params}
        if desc:
            entry["description"] = desc
        out.append({"type": "function", "function": entry})
    return out


def check_tool_choice(choice: Any, tools: list[dict[str, Any]]) -> ToolChoice:
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise ApiError(400, "'tool_choice' must be 'auto', 'none', 'required' or "
                           '{"type": "function", "function": {"name": ...}}',
                           param="tool_choice")
        name = None
    elif (isinstance(choice, dict) and choice.get("type") == "function"
          and isinstance(choice.get("function"), dict)
          and isinstance(choice["function"].get("name"), str)):
        name = choice["function"]["name"]
    else:
        raise ApiError(400, "'tool_choice' must be 'auto', 'none', 'required' or "
                       '{"type": "function", "function": {"name": ...}}', param="tool_choice")
    if (choice != "none") and not tools:
        raise ApiError(400, "'tool_choice' needs 'tools'", param="tool_choice")
    if name is not None:
        if name not in {t["function"]["name"] for t in tools}:
            raise ApiError(400, f"'tool_choice' names '{name}', which is not in 'tools'",
                           param="tool_choice")
        return str(name)
    return choice  # type: ignore[no-any-return]


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


def openai_grammar(body: dict[str, Any]) -> tuple[str | None, str]:
    """The reply's format from `response_format` or llama-server's `grammar` (GBNF), and
    the field it came from."""
    rf = body.get("response_format")
    gbnf = body.get("grammar")
    kind = None
    if rf is not None:
        if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
            raise ApiError(400, "'response_format' must be an object with a 'type'",
                           param="response_format")
        kind = rf["type"]
        if kind not in ("text", "json_object", "json_schema"):
            raise ApiError(400, "'response_format.type' must be 'text', 'json_object' or "
                           "'json_schema'", param="response_format")
    if gbnf is not None:
        if not isinstance(gbnf, str):
            raise ApiError(400, "'grammar' must be a GBNF grammar (a string)", param="grammar")
        if kind not in (None, "text"):
            raise ApiError(400, "'grammar' and a JSON 'response_format' exclude each other",
                           param="grammar")
        return _compiled(lambda: constraints.gbnf(gbnf), "grammar"), "grammar"
    if kind == "json_object":
        return constraints.any_json_object(), "response_format"
    if kind == "json_schema":
        spec = rf.get("json_schema") if rf else None
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ApiError(400, "'response_format.json_schema' must be an object with a "
                           "'schema'", param="response_format")
        schema = spec["schema"]
        return _compiled(lambda: constraints.json_schema(schema, what="the schema"),
                         "response_format"), "response_format"
    return None, "response_format"


def ollama_grammar(body: dict[str, Any]) -> str | None:
    """Ollama's `format`: "json" or a JSON schema."""
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return constraints.any_json_object()
    if isinstance(fmt, dict):
        return _compiled(lambda: constraints.json_schema(fmt, what="the schema"), "format")
    raise ApiError(400, "'format' must be \"json\" or a JSON schema object", param="format")
