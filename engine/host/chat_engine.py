"""One interface for whatever answers a chat: the embedded llama.cpp runtime or a remote server.

The desktop worker, the chat controller and the performance panel talk to a `ChatEngine` and
read a `ReplyStream`; they never need to know which kind of engine is behind it:

    engine.name, engine.kind ("embedded"|"remote"), engine.n_ctx (None: remote),
    engine.can_continue, engine.close()
    engine.reply(ChatRequest(messages, sampling, ...), cancel) -> ReplyStream
    for piece in stream: ...             # the answer's text pieces as they arrive
    for parts in stream.parts(): ...     # or the reply read: ("reasoning"|"content", text)
    stream.thought                       # (tokens, seconds) once the thinking block closed
    stream.tool_calls                    # the calls it made, once iteration has ended
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
writes a thinking block before its answer. An embedded reply is read by the one reply reader
(engine.decoding.reply_reader), as the HTTP routes read theirs: `parts()` gives the thinking
apart from the answer, and the block is timed into `GenerationStats.thinking_tokens` and
`thinking_s`.

A request (`ChatRequest`, one typed value: what the desktop's engine thread is handed) may
offer tools (`tools=[...]`, `tool_choice=...`): the prompt and the call grammar are planned as
the HTTP server plans them (engine.host.chat_plan), the reply shows only the answer's text,
and `tool_calls` holds the parsed calls once iteration has ended. Remote engines refuse tools
and read no thinking apart: their text is all answer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from engine.decoding.reasoning import ThinkMarkers, thinking_markers
from engine.decoding.reply_reader import Part, ReplyReader
from engine.decoding.tool_calls import ToolCall, ToolChoice
from engine.errors import EngineError
from engine.host.chat_plan import ChatPlan, plan_chat
from engine.host.context_meter import ContextMeter, Kind, measure
from engine.host.context_policy import ContextPolicy
from engine.host.context_summary import NOTE, Summary, fitted_summary_request, summary_room
from engine.host.generation import Generation
from engine.host.runtime import Model
from engine.host.stats import GenerationStats
from engine.native.projector import Media
from engine.settings import SamplingParams

EngineKind = Literal["embedded", "remote"]
Messages = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class ChatRequest:
    """What a chat asks of its engine. `policy`: how to fit a conversation that outgrows the
    context (embedded engines; None = send as is). `continue_text`: a cut-off answer to
    continue (the reply holds only the new text), `continue_thinking` its thinking.
    `thinking` (a reasoning model): whether it may think first; False asks it not to where its
    template has the switch and reads the whole reply as the answer (structured output: a
    grammar from the first token leaves no room for a block). `tools`: OpenAI function tools
    offered, `tool_choice` as OpenAI's: "auto", "none", "required", a function's name or
    `{"type": "function", "function": {"name": ...}}`. `sampling.grammar` cannot be combined
    with tools. `media`: images and audio, one `marker()` each in the messages' text, in
    order (an embedded engine loaded with a projector). `summary` (policy "summarise"): sent
    in place of the turns it covers. `kinds` and `tails`: what the context meter calls the
    messages (engine.host.context_meter.measure)."""

    messages: Messages
    sampling: SamplingParams
    policy: ContextPolicy | None = None
    continue_text: str = ""
    continue_thinking: str = ""
    thinking: bool = True
    tools: Sequence[Mapping[str, Any]] = ()
    tool_choice: ToolChoice | Mapping[str, Any] = "auto"
    media: Sequence[Media] = ()
    summary: Summary | None = None
    kinds: Mapping[int, Kind] = field(default_factory=dict)
    tails: Mapping[int, tuple[Kind, str]] = field(default_factory=dict)


@runtime_checkable
class ReplyStream(Protocol):
    """An answer being produced. Iterate for the answer's text pieces, or `parts()` for the
    reply read into thinking and answer (one of the two, once); `stats` is final after the
    loop."""

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

    @property
    def thought(self) -> tuple[int, float] | None:
        """The thinking block closed: (tokens generated by then, seconds from the first
        piece); None while it is open, or without one."""

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tool calls the reply made; complete once iteration has ended."""

    def parts(self) -> Iterator[list[Part]]:
        """The reply read: for each piece, the parts ready to show, ("reasoning" | "content",
        text); the last list holds what was held back."""

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
        """Whether a request's `continue_text` works (remote chat APIs cannot continue an
        assistant message portably)."""

    def reply(self, request: ChatRequest, cancel: threading.Event | None = None) -> ReplyStream:
        """Start an answer; `cancel` stops it before the next token. An engine that cannot
        do what the request asks (tools, continuing) raises an `EngineError` saying so."""

    def close(self) -> None:
        """Free what the engine holds (the model, or nothing for a remote engine)."""


class EmbeddedReply:
    """A `ReplyStream` over `engine.host.runtime.Generation`, read by `reader` (the plan's: the
    model's think markers, the tools' format)."""

    def __init__(
        self,
        gen: Generation,
        reader: ReplyReader,
        dropped: int = 0,
        plan: tuple[Model, ChatPlan] | None = None,
    ) -> None:
        self.generation = gen
        self._reader = reader
        self._dropped = dropped
        self._plan = plan
        self._shown: list[str] = []
        self.tool_calls: list[ToolCall] = []

    @property
    def prompt_tokens(self) -> int:
        return len(self.generation.prompt)

    @property
    def generated_tokens(self) -> int:
        return len(self.generation.tokens)

    @property
    def dropped_messages(self) -> int:
        return self._dropped

    def meter(
        self,
        kinds: Mapping[int, Kind] | None = None,
        tails: Mapping[int, tuple[Kind, str]] | None = None,
    ) -> ContextMeter | None:
        """Where the prompt sent went, by kind (it tokenizes every prefix: not on a GUI
        thread); None without a plan."""
        if self._plan is None:
            return None
        meter = measure(*self._plan, kinds, tails)
        # A continued answer's text ends the prompt after the plan's: earlier words of the
        # conversation, so that the kinds still add up to the prompt sent.
        more = len(self.generation.prompt) - meter.prompt_tokens
        if more <= 0:
            return meter
        counts = dict(meter.kinds)
        counts["history"] += more
        return replace(meter, kinds=counts, prompt_tokens=meter.prompt_tokens + more)

    @property
    def text(self) -> str:
        """The answer shown so far (without its thinking and its calls)."""
        return "".join(self._shown)

    @property
    def stats(self) -> GenerationStats:
        return self.generation.stats

    @property
    def thought(self) -> tuple[int, float] | None:
        return self._reader.closed

    def parts(self) -> Iterator[list[Part]]:
        failure: Exception | None = None
        try:
            for piece in self.generation:
                yield self._kept(self._reader.push(piece, self.generated_tokens))
        except Exception as e:  # what was held back is still shown, then the error
            failure = e
        # A cancelled or cut-off reply still gives what it wrote: an unfinished call stays
        # text (the format's parse keeps what it cannot read).
        tail, result = self._reader.finish(None if failure else self.stats)
        if failure is None:
            self.tool_calls = result.calls
        yield self._kept(tail)
        if failure is not None:
            raise failure

    def _kept(self, parts: list[Part]) -> list[Part]:
        self._shown.extend(text for kind, text in parts if kind == "content")
        return parts

    def __iter__(self) -> Iterator[str]:
        for parts in self.parts():
            yield from (text for kind, text in parts if kind == "content")


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

    def plan(self, request: ChatRequest) -> tuple[ChatPlan, str]:
        """The prompt as the server plans it (engine.host.chat_plan): fitted to a slot's
        context with the request's policy, its tools in the family's format; and the
        continued answer's text, which the prompt will end with."""
        if self._closed:
            raise EngineError("the model has been unloaded; load it again")
        model = self.model
        sampling, policy, thinking = request.sampling, request.policy, request.thinking
        continue_text, tools = request.continue_text, request.tools
        has_markers = thinking_markers(model.template.source) is not None
        continue_thinking = request.continue_thinking if thinking and has_markers else ""
        cut = continue_thinking + continue_text
        # The continued text (its markers, when it has thinking, are a few more tokens).
        more = (
            len(model.tokenize(cut, add_special=False)) + 8 * bool(continue_thinking)
            if cut and policy is not None
            else 0
        )
        choice = _tool_name(request.tool_choice)
        if not tools and choice not in ("auto", "none"):
            raise EngineError(f"tool_choice {choice!r} needs tools")
        # The plan sees the grammar only to refuse it beside tools.
        offered = bool(tools) and choice != "none"
        plan = plan_chat(
            model,
            request.messages,
            tools=tools,
            choice=choice,
            grammar=sampling.grammar if offered else None,
            grammar_param="grammar",
            think=thinking if has_markers else None,
            separate_reasoning=thinking,
            policy=policy,
            reserve=min(sampling.max_tokens, model.n_ctx_seq // 2),
            more_tokens=more,
            media=request.media,
            summary=request.summary if policy == "summarise" else None,
        )
        markers = plan.markers
        in_thinking = plan.in_thinking and markers is not None
        raw_continue = continue_text
        if markers is not None and cut and (continue_thinking or in_thinking):
            raw_continue = continued_text(markers, in_thinking, continue_thinking, continue_text)
        return plan, raw_continue

    def summary_for(
        self, request: ChatRequest, cancel: threading.Event | None = None
    ) -> Summary | None:
        """Policy "summarise": a summary of the turns the request's plan leaves out that its
        own `summary` does not cover yet (the old summary and the newly left-out turns,
        summarised again), asked of this model as any chat is; None when there is nothing
        new to summarise (a stored summary still covers what is left out)."""
        if request.policy != "summarise" or request.media:
            return None
        plan, _ = self.plan(request)
        old = request.summary
        covered = set(old.covers) if old is not None else set()
        new = [i for i in plan.left_out if i not in covered]
        if not new:
            return None
        source: list[Mapping[str, Any]] = list(request.messages)
        turns: list[int] = new
        if old is not None and old.text.strip():
            source = [{"role": "system", "content": f"{NOTE}\n{old.text.strip()}"}]
            source += [request.messages[i] for i in new]
            turns = list(range(len(source)))
        model = self.model
        room = summary_room(model.n_ctx_seq)
        ask, _ = fitted_summary_request(
            source,
            turns,
            lambda ms: len(model.chat_tokens(ms, enable_thinking=False)),
            model.n_ctx_seq - room,
        )
        if not ask:
            return None
        greedy = SamplingParams(temperature=0.0, max_tokens=room, seed=0)
        reply = self.reply(ChatRequest(ask, greedy, thinking=False), cancel)
        text = "".join(reply).strip()
        if not text or reply.stats.stop_reason in ("cancelled", "error"):
            return None
        return Summary(text, tuple(sorted(covered | set(plan.left_out))))

    def reply(self, request: ChatRequest, cancel: threading.Event | None = None) -> EmbeddedReply:
        """The request's plan (`plan`); a continued answer at its end; the reply is read by
        the plan's reader. `thinking` alone decides the block (a grammar may be written to
        pass through it)."""
        plan, raw_continue = self.plan(request)
        model = self.model
        sampling = request.sampling
        prompt = plan.prompt
        if raw_continue:
            prompt = prompt + model.tokenize(raw_continue, add_special=False, parse_special=False)
        if plan.fmt is not None:
            sampling = plan.sampling(sampling)  # the call grammar, control tokens as text
        # The reader starts past the continued text, which is on screen already. A forced call
        # that the token limit cut is shown as the text it is: the chat's tools would run it
        # with cut arguments.
        reader = replace(plan, forced=False).reader(raw_continue)
        media = plan.media
        if media is not None:
            media.tokens = prompt  # the continued text after its chunks
        gen = model.submit(prompt, sampling, cancel=cancel, media=media)
        return EmbeddedReply(gen, reader, plan.dropped, (model, plan))

    def close(self) -> None:
        self._closed = True  # llama.cpp crashes on a freed model: refuse before reaching it
        self.model.close()
