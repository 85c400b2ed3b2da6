"""What a chat asks of the model, whoever asks (the desktop chat, the HTTP routes): the prompt
rendered with its tools, the grammar the reply must follow, and the reader of its reply
(engine.decoding.reply_reader: thinking, content and tool calls, streamed or whole).

The model's own template renders the tools when it knows them (its family's format, from
engine.decoding.tool_calls); otherwise the generic format describes them in a system message
and a grammar makes every answer a JSON object of calls or of a response, as llama-server's
generic handler does. A forced call (`required`, a named function) is always decoded under
the grammar of the call, so its arguments are valid against the function's schema, and its
reply is calls only: cut short by the token limit, the call being written comes back marked
incomplete, never as text. Without parallel calls, a reply is read for one call at most.

A conversation fitted by a context policy (engine.host.context_policy) keeps what it sent
and what it left out (`messages`, `origin`, `left_out`), and the render it used, so that
engine.host.context_meter can say where the prompt's tokens went. Policy "summarise" with a
`Summary` sends the summary in place of the turns it covers (engine.host.context_summary);
without one it leaves out what the summary would cover, keeping room for it.

Requests that cannot be planned raise `PlanError`, which names the request field at fault;
the HTTP layer turns it into its 400 answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.decoding import constraints
from engine.decoding.constraints import GrammarError
from engine.decoding.reasoning import ThinkMarkers, starts_thinking, thinking_markers
from engine.decoding.reply_reader import ReplyReader
from engine.decoding.thinking_budget import EFFORT_BUDGET, ThinkingBudget
from engine.decoding.tool_calls import ToolChoice, ToolFormat, tool_format_for
from engine.errors import EngineError
from engine.host.context_policy import ContextPolicy, fit_messages
from engine.host.context_summary import (
    NOTE_TOKENS,
    SUMMARY_ORIGIN,
    Summary,
    summary_room,
    with_summary,
)
from engine.host.runtime import Model
from engine.media.prompt import MediaPrompt
from engine.model.templates import ChatTemplateError
from engine.native.projector import Media
from engine.settings import SamplingParams

Messages = Sequence[Mapping[str, Any]]


class PlanError(EngineError):
    """A chat that cannot be put to the model as asked. `param`: the request field it is
    about (None: the messages themselves, e.g. a template that refuses them)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class ChatPlan:
    """A chat turned into what the loop runs and how its reply is read."""

    prompt: list[int]
    grammar: str | None
    fmt: ToolFormat | None  # tools offered (and their calls parsed), or None
    markers: ThinkMarkers | None  # the reply's thinking is separated, or None
    in_thinking: bool  # the prompt opened the thinking block (whatever `markers` says)
    text: str = ""  # the rendered prompt
    dropped: int = 0  # old messages left out to fit the context
    forced: bool = False  # a call is forced (tool_choice required or a named function)
    parallel: bool = True  # several calls may come at once
    think: ThinkMarkers | None = None  # the template's think markers, separated or not
    media: MediaPrompt | None = None  # its images and audio (`prompt` is its tokens)
    thinking: ThinkingBudget | None = None  # the reply's reasoning budget, if any
    # The conversation as given, the messages sent (before the tool format's rewrite) and,
    # for each, its index in the conversation (context_summary.SUMMARY_ORIGIN: the summary).
    conversation: Sequence[Mapping[str, Any]] = ()
    messages: Sequence[Mapping[str, Any]] = ()
    origin: tuple[int, ...] = ()
    left_out: tuple[int, ...] = ()  # indices into `conversation` not sent as themselves
    reserve: int = 0  # tokens kept for the answer when fitting
    summary: Summary | None = None  # sent in place of the turns it covers
    folded: bool = False  # the summary was appended to the system message
    # The render the prompt came from: (messages, add_generation_prompt) -> text.
    render: Callable[[Messages, bool], str] | None = field(default=None, repr=False)

    def sampling(self, sampling: SamplingParams) -> SamplingParams:
        """The request's sampling with what the reply needs: its grammar, and control tokens
        written out where a tool format's markers may be one."""
        return replace(
            sampling, grammar=self.grammar, special_text=self.fmt is not None and self.fmt.native
        )

    def reader(self, prefix: str = "") -> ReplyReader:
        """The reader of this chat's reply. `prefix`: the raw text of an answer being
        continued (already shown; the prompt ends with it)."""
        return ReplyReader(
            self.markers,
            think=self.think,
            in_thinking=self.in_thinking,
            calls=self.fmt,
            forced=self.forced,
            parallel=self.parallel,
            prefix=prefix,
        )


def plan_chat(
    model: Model,
    messages: Messages,
    *,
    tools: Sequence[Mapping[str, Any]] = (),
    choice: ToolChoice = "auto",
    parallel: bool = True,
    grammar: str | None = None,
    grammar_param: str = "grammar",
    think: bool | None = None,
    separate_reasoning: bool = True,
    policy: ContextPolicy | None = None,
    reserve: int = 0,
    more_tokens: int = 0,
    media: Sequence[Media] = (),
    summary: Summary | None = None,
    budget: int | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    effort: str | None = None,
    budget_message: str = "",
    default_budget: int | None = None,
) -> ChatPlan:
    """`grammar`: the reply's own format (a compiled constraint: response_format, Ollama's
    format), if any; `grammar_param` names its field in errors. `think`: None leaves the
    template's default; True/False set `enable_thinking` where the template has the switch.
    `policy`: fit the conversation to a slot's context, keeping `reserve` tokens for the
    answer and `more_tokens` for text the caller appends to the prompt. `media`: images
    and audio, one `marker()` each in the messages' text, in order; the conversation is
    then not fitted (its media rows are counted only once the projector has split it).
    `summary` (policy "summarise"): sent in place of the turns it covers. `budget`: the
    thinking's tokens at most (None or negative: no limit; 0 asks the template not to think
    and closes a block it opens anyway; engine.decoding.thinking_budget). `template_kwargs`:
    more variables for the template (llama-server's `chat_template_kwargs`); its
    `enable_thinking` counts as `think` where `think` is None. `effort`: OpenAI's reasoning
    effort: "none" asks for no thinking; another is given to a template that reads
    `reasoning_effort` (gpt-oss), as llama-server gives it, and is otherwise the budget of
    `EFFORT_BUDGET` where `budget` is None. `budget_message`: written before the forced
    close. `default_budget`: the budget of a request that sets none (the server's)."""
    source = model.template.source
    markers = thinking_markers(source)
    kwargs = dict(template_kwargs or {})
    if markers is not None and think is None and isinstance(kwargs.get("enable_thinking"), bool):
        think = kwargs.pop("enable_thinking")
    if effort == "none" and think is None:
        think = False
    elif effort is not None and "reasoning_effort" in source:
        kwargs["reasoning_effort"] = effort
    elif effort is not None and budget is None:
        budget = EFFORT_BUDGET[effort]
    if budget is None:
        budget = default_budget
    if budget is not None and budget < 0:
        budget = None
    if budget == 0 and think is None:
        think = False  # as llama-server reads --reasoning-budget 0
    if think and markers is None:
        raise PlanError(
            "'think': this model does not think (its chat template has no thinking block)",
            param="think",
        )
    offered = bool(tools) and choice != "none"
    has_history = any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
    fmt = tool_format_for(source) if offered or has_history else None
    if offered and grammar is not None:
        raise PlanError(
            f"'{grammar_param}' cannot be combined with tools (the reply is "
            "either a call or text in that format)",
            param=grammar_param,
        )
    extra: dict[str, Any] = kwargs
    if think is False or (grammar is not None and markers is not None):
        # Qwen3's switch; a grammar from the first token leaves no room for a thinking block.
        extra["enable_thinking"] = False
    elif think and markers is not None:
        # Said explicitly: some templates test `not enable_thinking`, reading unset as "no".
        extra["enable_thinking"] = True
    shown_tools = list(tools) if offered else []
    if fmt is not None and offered:
        extra.update(fmt.template_vars(shown_tools))

    def render(msgs: Messages, generation: bool = True) -> str:
        if fmt is not None:
            msgs = fmt.template_messages(msgs, shown_tools)
        if generation:
            return model.render_chat(msgs, **extra)
        return model.template.render(msgs, add_generation_prompt=False, **extra)

    conversation = messages
    origin = tuple(range(len(messages)))
    left_out: tuple[int, ...] = ()
    folded = False
    if summary is not None and policy != "summarise":
        raise PlanError("a summary is sent with policy 'summarise' only", param="context_policy")
    if media and model.projector is None:
        raise PlanError(
            f"{model.path.name} reads text only: it was loaded without a projector (mmproj)",
            param="messages",
        )
    try:
        if policy is not None and not media:

            def count(ms: Messages) -> int:
                return len(model.chat_prompt_tokens(render(ms))) + more_tokens

            room, fit_policy = reserve, policy
            if summary is not None:
                sent = with_summary(messages, summary)
                messages, origin, folded = sent.messages, sent.origin, sent.folded
                left_out = tuple(sorted(set(summary.covers)))
                fit_policy = "drop_oldest"  # a summary that does not fit: older turns go too
            elif policy == "summarise" and count(messages) + reserve > model.n_ctx_seq:
                room = reserve + summary_room(model.n_ctx_seq) + NOTE_TOKENS  # the summary's
            fit = fit_messages(messages, count, model.n_ctx_seq, reserve=room, policy=fit_policy)
            gone = set(fit.left_out)
            left_out = tuple(sorted({*left_out, *(origin[i] for i in gone if origin[i] >= 0)}))
            origin = tuple(o for i, o in enumerate(origin) if i not in gone)
            messages = fit.messages
            if summary is not None and SUMMARY_ORIGIN not in origin and not folded:
                summary = None  # its own messages were left out too
        text = render(messages)
    except ChatTemplateError as e:
        raise PlanError(str(e)) from None
    mp: MediaPrompt | None = None
    if media:
        try:
            mp = model.media_prompt(text, media)
        except EngineError as e:  # the projector's refusal: markers, a clip it cannot read
            raise PlanError(str(e), param="messages") from None
    prompt = mp.tokens if mp is not None else model.chat_prompt_tokens(text)
    in_thinking = starts_thinking(text, markers)
    if offered and fmt is not None:
        try:
            specials = {m: t for m in fmt.markers if (t := model.special_token(m)) is not None}
            tool_grammar = fmt.grammar(shown_tools, choice, parallel, special_tokens=specials)
            if tool_grammar is not None:
                grammar = constraints.lark(tool_grammar, what="the tools' call grammar")
        except GrammarError as e:
            raise PlanError(f"'tools': {e}", param="tools") from None
    thinking = None
    if budget is not None and markers is not None and grammar is None:
        # (A grammar holds from the first token: no block opens, no token may be forced.)
        thinking = ThinkingBudget(budget, markers, in_thinking, budget_message)
    return ChatPlan(
        prompt,
        grammar,
        fmt if offered else None,
        markers if separate_reasoning else None,
        in_thinking,
        text,
        len(left_out),
        forced=offered and choice not in ("auto", "none"),
        parallel=parallel,
        think=markers,
        media=mp,
        thinking=thinking,
        conversation=conversation,
        messages=list(messages),
        origin=origin,
        left_out=left_out,
        reserve=reserve,
        summary=summary,
        folded=folded,
        render=render,
    )


__all__ = ["ChatPlan", "PlanError", "plan_chat"]
