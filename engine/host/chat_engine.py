"""One interface for whatever answers a chat: the embedded llama.cpp runtime or a remote server.

The desktop worker, the chat controller and the performance panel talk to a `ChatEngine` and
read a `ReplyStream`; they never need to know which kind of engine is behind it:

    engine.name, engine.kind ("embedded"|"remote"), engine.n_ctx (None: remote),
    engine.can_continue, engine.close()
    engine.reply(messages, sampling, cancel, continue_text="", policy=None) -> ReplyStream
    for piece in stream: ...             # text pieces as they arrive
    stream.prompt_tokens                 # int, or None while (or when) unknown
    stream.generated_tokens              # running count
    stream.dropped_messages              # old messages left out to fit the context
    stream.stats                         # GenerationStats, complete once iteration ends

Errors are `EngineError`s (remote ones are `engine.remote.RemoteError` subclasses, which keep
the partial answer). `reply()` may raise before any text (a context that cannot hold the
conversation, an unknown template); iteration may raise part-way.

`EmbeddedEngine` adapts `engine.host.runtime.Model`: its replies are requests to the model's
one decode loop, marked interactive so that they go before queued API requests. It fits the
conversation to a slot's context with the chosen policy and continues a cut-off answer by
ending the prompt with it. A remote engine does no fitting: the server owns its context.

A reasoning model (its template has think markers: Qwen3, QwQ, the DeepSeek-R1 distills)
writes a thinking block before its answer. An embedded reply knows the markers and whether
its prompt already opened the block; `EmbeddedReply.thinking_reader()` gives a
`ThinkingReader` that splits the streamed text into ("reasoning" | "content", text) parts
(engine.decoding.reasoning) and times the block into `GenerationStats.thinking_tokens` and
`thinking_s`.

An embedded reply may offer tools (`reply(..., tools=[...], tool_choice=...)`): the prompt
and the call grammar are planned as the HTTP server plans them (engine.host.chat_plan), the
reply yields only the text to show, and `EmbeddedReply.tool_calls` holds the parsed calls
once iteration has ended. Remote engines take no tools.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from engine.decoding.reasoning import (
    PieceKind,
    ReasoningSplitter,
    ThinkMarkers,
    thinking_markers,
)
from engine.decoding.tool_calls import ToolCall, ToolCallStream, ToolChoice
from engine.errors import EngineError
from engine.host.chat_plan import plan_chat
from engine.host.context_policy import ContextPolicy
from engine.host.generation import Generation
from engine.host.runtime import Model
from engine.host.stats import GenerationStats
from engine.settings import SamplingParams

EngineKind = Literal["embedded", "remote"]
Messages = Sequence[Mapping[str, Any]]


@runtime_checkable
class ReplyStream(Protocol):
    """An answer being produced. Iterate for text pieces; `stats` is final after the loop."""

    @property
    def prompt_tokens(self) -> int | None:
        """Tokens in the prompt as sent; None when not (yet) known (a remote server that
        reports no usage, or before its usage report arrives at the end of the stream)."""

    @property
    def generated_tokens(self) -> int:
        """Tokens generated so far (remote without usage: chunks received)."""

    @property
    def dropped_messages(self) -> int:
        """Old messages left out so the conversation fits the context (embedded only)."""

    @property
    def text(self) -> str:
        """The answer so far."""

    @property
    def stats(self) -> GenerationStats:
        """Figures for this reply; complete once iteration has ended."""

    def __iter__(self) -> Iterator[str]: ...


@runtime_checkable
class ChatEngine(Protocol):
    """Something that answers chats: a loaded local model or a remote endpoint."""

    @property
    def name(self) -> str:
        """What to call it in the window: a model name, or "connection · model"."""

    @property
    def kind(self) -> EngineKind: ...

    @property
    def n_ctx(self) -> int | None:
        """Context length in tokens; None when the engine does not say (remote)."""

    @property
    def can_continue(self) -> bool:
        """Whether `reply(continue_text=...)` works (remote chat APIs cannot continue an
        assistant message portably)."""

    def reply(
        self,
        messages: Messages,
        sampling: SamplingParams,
        cancel: threading.Event | None = None,
        *,
        continue_text: str = "",
        policy: ContextPolicy | None = None,
    ) -> ReplyStream:
        """Start an answer. `continue_text`: a cut-off answer to continue (the reply holds
        only the new text). `policy`: how to fit a conversation that outgrows the context
        (embedded engines; None = send as is)."""

    def close(self) -> None:
        """Free what the engine holds (the model, or nothing for a remote engine)."""


class ThinkingReader:
    """Reads a streamed reply as thinking and answer. `push(text, n_tokens)` returns the
    parts ready to show, ("reasoning" | "content", text); `closed` is (tokens generated,
    seconds since the first piece) from the moment the block closed; `finish(stats)` returns
    what was held back and fills `stats.thinking_tokens`/`thinking_s` (a block that never
    closed counts the whole reply). `prefix`: the raw text of an answer being continued,
    already shown: it only sets where the reader stands."""

    def __init__(
        self,
        markers: ThinkMarkers | None,
        *,
        in_thinking: bool = False,
        prefix: str = "",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._split = ReasoningSplitter(markers, in_thinking=in_thinking)
        self._clock = clock
        self._t0: float | None = None
        self._thought = False  # the block opened in this reply
        self.closed: tuple[int, float] | None = None
        if prefix:
            self._split.push(prefix)  # its parts are on screen already

    @property
    def thinking(self) -> bool:
        return self._split.thinking

    def push(self, text: str, n_tokens: int) -> list[tuple[PieceKind, str]]:
        now = self._clock()
        if self._t0 is None:
            self._t0 = now
        was = self._split.thinking
        parts = self._split.push(text)
        self._thought = self._thought or was or self._split.thinking
        if was and not self._split.thinking and self.closed is None:
            self.closed = (n_tokens, now - self._t0)
        return parts

    def finish(self, stats: GenerationStats | None = None) -> list[tuple[PieceKind, str]]:
        parts = self._split.flush()
        if stats is not None and self._thought:
            t0 = self._t0 if self._t0 is not None else self._clock()
            stats.thinking_tokens, stats.thinking_s = self.closed or (
                stats.gen_tokens,
                self._clock() - t0,
            )
        return parts


class EmbeddedReply:
    """A `ReplyStream` over `engine.host.runtime.Generation`. `markers`: the model's think
    markers (None: it does not think, or was asked not to); `in_thinking`: the prompt opened
    the block; `prefix`: the raw text of an answer being continued. `calls`: the tools were
    offered: iteration yields the text shown (call markup and the generic format's JSON
    taken out, the thinking kept for `thinking_reader()`), and `tool_calls` holds the calls
    once it has ended."""

    def __init__(
        self,
        gen: Generation,
        dropped: int = 0,
        *,
        markers: ThinkMarkers | None = None,
        in_thinking: bool = False,
        prefix: str = "",
        calls: ToolCallStream | None = None,
    ) -> None:
        self.generation = gen
        self._dropped = dropped
        self.markers = markers
        self.in_thinking = in_thinking
        self.prefix = prefix
        self._calls = calls
        self._shown: list[str] = []
        self.tool_calls: list[ToolCall] = []

    def thinking_reader(self) -> ThinkingReader | None:
        """A reader that splits this reply's thinking from its answer; None when the model
        has no thinking block."""
        if self.markers is None:
            return None
        return ThinkingReader(self.markers, in_thinking=self.in_thinking, prefix=self.prefix)

    @property
    def prompt_tokens(self) -> int:
        return len(self.generation.prompt)

    @property
    def generated_tokens(self) -> int:
        return len(self.generation.tokens)

    @property
    def dropped_messages(self) -> int:
        return self._dropped

    @property
    def text(self) -> str:
        """What iteration has yielded so far (with tools: without the calls)."""
        return self.generation.text if self._calls is None else "".join(self._shown)

    @property
    def stats(self) -> GenerationStats:
        return self.generation.stats

    def __iter__(self) -> Iterator[str]:
        return iter(self.generation) if self._calls is None else self._read(self._calls)

    def _read(self, calls: ToolCallStream) -> Iterator[str]:
        for piece in self.generation:
            if shown := calls.push(piece):
                self._shown.append(shown)
                yield shown
        # A cancelled or cut-off reply still gives what it wrote: an unfinished call stays
        # text (the format's parse keeps what it cannot read).
        rest, self.tool_calls = calls.finish()
        if rest:
            self._shown.append(rest)
            yield rest


def _tool_name(choice: ToolChoice | Mapping[str, Any]) -> ToolChoice:
    """OpenAI's `{"type": "function", "function": {"name": ...}}` as the function's name."""
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str) or not name:
            raise EngineError("tool_choice names no function")
        return name
    return choice


def continued_text(markers: ThinkMarkers, in_thinking: bool, thinking: str, answer: str) -> str:
    """The raw text of a cut-off answer with its thinking, as the model wrote it: the block
    (opened here unless the prompt opened it), closed when the answer had begun. The model
    goes on from there, inside the block or in the answer."""
    raw = ("" if in_thinking else markers.open + "\n") + thinking
    if answer:
        raw += "\n" + markers.close + "\n\n" + answer
    return raw


class EmbeddedEngine:
    """The `ChatEngine` for a model loaded in this process. It owns the model: `close()`
    frees it."""

    kind: EngineKind = "embedded"
    can_continue: bool = True

    def __init__(self, model: Model, name: str | None = None) -> None:
        self.model = model
        self._closed = False
        self.name = name or str(model.gguf.metadata.get("general.name") or model.path.stem)

    @property
    def n_ctx(self) -> int:
        """What one conversation may hold: a slot of the model's context."""
        return self.model.n_ctx_seq

    def reply(
        self,
        messages: Messages,
        sampling: SamplingParams,
        cancel: threading.Event | None = None,
        *,
        continue_text: str = "",
        policy: ContextPolicy | None = None,
        thinking: bool = True,
        continue_thinking: str = "",
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice | Mapping[str, Any] = "auto",
    ) -> EmbeddedReply:
        """`thinking` (a reasoning model): whether it may think first. False asks it not to
        where its template has the switch (`enable_thinking`) and reads the whole reply as
        the answer: a grammar that shapes the answer from its first token (structured
        output) leaves no room for a block. `continue_thinking`: the thinking of the answer
        being continued (`continue_text` is its answer text). `tools`: OpenAI function
        tools offered to the model (`tool_choice` as OpenAI's: "auto", "none", "required"
        or a function's name or `{"type": "function", "function": {"name": ...}}`); the
        reply then yields only the text shown, and its `tool_calls` once it has ended.
        `sampling.grammar` (structured output) cannot be combined with tools."""
        if self._closed:
            raise EngineError("the model has been unloaded; load it again")
        model = self.model
        has_markers = thinking_markers(model.template.source) is not None
        if not thinking or not has_markers:
            continue_thinking = ""
        cut = continue_thinking + continue_text
        # The continued text (its markers, when it has thinking, are a few more tokens).
        more = (
            len(model.tokenize(cut, add_special=False)) + 8 * bool(continue_thinking)
            if cut and policy is not None
            else 0
        )
        choice = _tool_name(tool_choice)
        if not tools and choice not in ("auto", "none"):
            raise EngineError(f"tool_choice {choice!r} needs tools")
        # `thinking` alone decides the block (a grammar may be written to pass through it);
        # the plan sees the grammar only to refuse it beside tools.
        offered = bool(tools) and choice != "none"
        plan = plan_chat(
            model,
            messages,
            tools=tools or (),
            choice=choice,
            grammar=sampling.grammar if offered else None,
            grammar_param="grammar",
            think=thinking if has_markers else None,
            separate_reasoning=thinking,
            policy=policy,
            reserve=min(sampling.max_tokens, model.n_ctx_seq // 2),
            more_tokens=more,
        )
        markers = plan.markers
        in_thinking = plan.in_thinking and markers is not None
        raw_continue = continue_text
        if markers is not None and cut and (continue_thinking or in_thinking):
            raw_continue = continued_text(markers, in_thinking, continue_thinking, continue_text)
        prompt = plan.prompt
        if raw_continue:
            prompt = prompt + model.tokenize(raw_continue, add_special=False, parse_special=False)
        calls = None
        if plan.fmt is not None:
            calls = plan.fmt.stream()
            # Where the answer stands: inside a block the prompt opened, past the continued
            # text. Both are on screen (or never shown), so what they make visible is not sent.
            calls.push((plan.fmt.think.open if plan.in_thinking else "") + raw_continue)
            sampling = plan.sampling(sampling)  # the call grammar, control tokens as text
        gen = model.submit(prompt, sampling, cancel=cancel)
        return EmbeddedReply(
            gen,
            plan.dropped,
            markers=markers,
            in_thinking=in_thinking,
            prefix=raw_continue if markers is not None else "",
            calls=calls,
        )

    def close(self) -> None:
        self._closed = True  # llama.cpp crashes on a freed model: refuse before reaching it
        self.model.close()
