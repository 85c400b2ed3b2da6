"""What every family's format does (`ToolFormat`), and the streaming split of an answer into
the content shown so far and, at its end, the calls (`ToolCallStream`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.decoding.tool_calls.calls import Json, ToolCall, ToolChoice
from engine.decoding.tool_calls.history import history_message
from engine.decoding.tool_calls.reading import Start
from engine.decoding.tool_calls.schema import any_of, call_object, chosen_functions


class ToolFormat(ABC):
    """One family's tool-call format. The base is what native formats share."""

    name: str = ""
    native: bool = True  # the model's template renders `tools` itself
    markers: tuple[str, ...] = ()  # text that opens or closes a call: often special tokens

    def template_messages(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
    ) -> list[Json]:
        """Messages ready for the chat template: OpenAI-shaped history (assistant messages
        with `tool_calls` whose `function.arguments` is a JSON string; `tool` messages with
        `tool_call_id`/content) converted to what this family's templates expect (arguments
        parsed into a dict, as llama-server does)."""
        return [history_message(m) for m in messages]

    def template_vars(self, tools: Sequence[Mapping[str, Any]]) -> Json:
        """Extra render() variables. No `tools` at all when there are none: Llama 3.x reads
        an empty list as "tools are on" and asks the model for a call."""
        return {"tools": [dict(t) for t in tools]} if tools else {}

    def call_schema(
        self, tools: Sequence[Mapping[str, Any]], choice: ToolChoice, parallel: bool
    ) -> Json | None:
        """JSON schema of the JSON inside one call's markers when a call is forced (choice
        'required' or a function name); None otherwise. Arguments follow each function's
        `parameters`, names are consts."""
        if choice in ("auto", "none"):
            return None
        return any_of([call_object(fn, "arguments") for fn in chosen_functions(tools, choice)])

    def grammar(
        self,
        tools: Sequence[Mapping[str, Any]],
        choice: ToolChoice,
        parallel: bool,
        *,
        special_tokens: Mapping[str, int] | None = None,
    ) -> str | None:
        """The decoding constraint as llguidance Lark text, None when nothing is forced.

        `special_tokens` maps the family's `markers` that are single special tokens in the
        loaded vocabulary to their ids: a grammar literal only matches plain text, so a
        model that writes `<tool_call>` as one token needs it named by id.

        The grammar holds from the answer's first token: a reasoning model gets no think
        block under it, so start it after the block closes or render with thinking off.
        """
        schema = self.call_schema(tools, choice, parallel)
        if schema is None:
            return None
        return self._grammar(schema, parallel, special_tokens)

    @abstractmethod
    def _grammar(
        self, schema: Json, parallel: bool, special_tokens: Mapping[str, int] | None
    ) -> str: ...

    @abstractmethod
    def parse(self, text: str, start: int = 0) -> tuple[str, list[ToolCall]]:
        """Split a complete answer into (content, calls). A malformed call (bad JSON, unknown
        shape) is never an exception: it stays in content and yields no call. `start`: where
        the answer begins after a think block left in the text (kept as content, never read
        for calls)."""

    @abstractmethod
    def visible(self, text: str, start: int = 0) -> str:
        """Of an unfinished answer, the content that `parse` of any continuation starts with."""

    def cut_calls(self, text: str, start: int = 0) -> list[ToolCall]:
        """The calls of an answer decoded under the forced-call grammar and cut short (the
        token limit, a stop string): the ones it finished, then the one it was writing,
        marked incomplete, if its name is whole. Under that grammar nothing is content."""
        content, calls = self.parse(text + self._closing, start)
        if calls and not content.strip():  # it ended right after a whole call
            return calls
        return self._cut_calls(text, start)

    _closing = ""  # what ends a forced answer after its last call

    @abstractmethod
    def _cut_calls(self, text: str, start: int) -> list[ToolCall]: ...

    def stream(self, start: Start | None = None) -> ToolCallStream:
        """`start`: where the answer begins in the text so far (after a think block left in
        it); 0 when not given."""
        return ToolCallStream(self, start=start)


class ToolCallStream:
    """Incremental: push(text) returns the content that can be shown now (text before any
    possible start of a call; hold back a partial marker prefix); finish() returns
    (remaining_content, calls) at the end of the answer."""

    def __init__(
        self,
        fmt: ToolFormat,
        visible: Callable[[str, int], str] | None = None,
        start: Start | None = None,
    ) -> None:
        self._format = fmt
        self._visible = visible or fmt.visible  # a format may keep state across pushes
        self._start = start or _no_block
        self._text = ""
        self._shown = ""

    def push(self, text: str) -> str:
        self._text += text
        visible = self._visible(self._text, self._start(self._text))
        if len(visible) <= len(self._shown) or not visible.startswith(self._shown):
            return ""
        new, self._shown = visible[len(self._shown) :], visible
        return new

    def finish(self, *, forced: bool = False) -> tuple[str, list[ToolCall]]:
        """`forced`: the answer was decoded under the forced-call grammar, so it is calls
        only, even when it was cut short."""
        start = self._start(self._text)
        content, calls = self._format.parse(self._text, start)
        if forced and (content.strip() or not calls):
            content, calls = "", self._format.cut_calls(self._text, start)
        # `visible` promises a prefix of the content; should it fail, nothing is sent twice.
        return content[_common_prefix(content, self._shown) :], calls


def _no_block(text: str) -> int:
    return 0


def _common_prefix(a: str, b: str) -> int:
    if a.startswith(b):
        return len(b)
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
