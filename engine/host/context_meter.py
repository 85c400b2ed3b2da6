"""Where a chat's prompt tokens go: the context made visible.

`measure(model, plan)` takes a planned chat (engine.host.chat_plan) and splits its prompt
into kinds of content, counted with the model's tokenizer on the model's own chat template,
so that the kinds add up to exactly `len(plan.prompt)`:

- each message is charged what it adds to the rendered prompt: the tokens of the
  conversation rendered up to it, less those rendered up to the one before (its template
  markup comes with it; a template's default system prompt comes with the first message);
- the generation prompt that ends the prompt is "template";
- a summary in place of left-out turns is "summary" (folded into the system message: what
  it adds to it);
- images and audio are "attachments": the rows the projector makes for each media chunk and
  the tokens it wraps them in, in place of the marker's text in their message.

A prefix that the template refuses to render on its own is charged to the next message.
The reply's reserve and the messages the policy left out are given beside the sum.

A message may end with text of another kind (`tails`: the desktop appends the retrieved
passages to its system prompt, since many templates take one system message only): its
prefix is rendered once without that text, and the difference is charged to the tail's kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from engine.host.chat_plan import ChatPlan
from engine.host.context_summary import SUMMARY_ORIGIN
from engine.host.runtime import Model
from engine.model.templates import ChatTemplateError
from engine.native.projector import marker

Kind = Literal[
    "system",
    "summary",
    "history",
    "documents",  # retrieved passages
    "tool_results",
    "attachments",  # images and audio
    "question",
    "template",  # the generation prompt
]
KINDS: tuple[Kind, ...] = get_args(Kind)


@dataclass(frozen=True)
class ContextMeter:
    """A prompt's tokens by kind (every kind present, zero or not; their sum is
    `prompt_tokens`), the tokens kept for the reply, and the context's size."""

    kinds: Mapping[Kind, int]
    prompt_tokens: int
    reserve: int
    n_ctx: int
    left_out: tuple[int, ...] = field(default=())  # indices into the conversation

    @property
    def free(self) -> int:
        """Tokens neither in the prompt nor kept for the reply."""
        return self.n_ctx - self.prompt_tokens - self.reserve


def default_kind(messages: Sequence[Mapping[str, Any]], i: int) -> Kind:
    """A message's kind by its role: the last user message is the question."""
    role = messages[i].get("role")
    if role == "system":
        return "system"
    if role == "tool":
        return "tool_results"
    if role == "user" and i == len(messages) - 1:
        return "question"
    return "history"


def measure(
    model: Model,
    plan: ChatPlan,
    kinds: Mapping[int, Kind] | None = None,
    tails: Mapping[int, tuple[Kind, str]] | None = None,
) -> ContextMeter:
    """`plan`'s prompt by kind. `kinds`: a kind for messages of the conversation (by index
    in `plan.conversation`, e.g. "documents" for retrieved passages); the others by role.
    `tails`: text a message's content ends with, charged to its own kind."""
    conversation, sent, origin = plan.conversation, plan.messages, plan.origin
    tags = dict(kinds or {})

    def kind_of(i: int) -> Kind:
        if i == SUMMARY_ORIGIN:
            return "summary"
        return tags.get(i) or default_kind(conversation, i)

    total: dict[Kind, int] = dict.fromkeys(KINDS, 0)
    n_prompt = len(plan.prompt)
    render = plan.render
    if render is None or not sent:  # a raw prompt: no template, no messages
        total["question"] = n_prompt
        return ContextMeter(total, n_prompt, plan.reserve, model.n_ctx_seq, plan.left_out)

    def tokens(text: str) -> int:
        return len(model.chat_prompt_tokens(text))

    # The prefixes rendered one after another, each charged to the kind it adds.
    indexed: list[tuple[Kind, Sequence[Mapping[str, Any]], int]] = []
    first = 0
    if plan.folded and origin[0] == 0:
        indexed.append((kind_of(0), [conversation[0]], 0))
        indexed.append(("summary", sent[:1], SUMMARY_ORIGIN))
        first = 1
    indexed += [(kind_of(origin[j]), sent[: j + 1], origin[j]) for j in range(first, len(sent))]
    steps = _split_tails(indexed, tags, tails or {})
    before = 0
    for kind, prefix in steps:
        try:
            now = tokens(render(prefix, False))
        except ChatTemplateError:
            continue  # refused alone (alternation, a required user turn): with the next
        total[kind] += now - before
        before = now
    if plan.media is None:
        total["template"] += n_prompt - before
    else:
        total["template"] += tokens(plan.text) - before
        # The markers' text is not sent: their media chunks are, with the tokens around them.
        mark = marker()
        per_marker = len(model.tokenize(mark, add_special=False))
        for j, m in enumerate(sent):
            content = m.get("content")
            n = content.count(mark) if isinstance(content, str) else 0
            total[kind_of(origin[j])] -= n * per_marker
        total["attachments"] = n_prompt - sum(v for k, v in total.items() if k != "attachments")
    return ContextMeter(total, n_prompt, plan.reserve, model.n_ctx_seq, plan.left_out)


def _split_tails(
    steps: list[tuple[Kind, Sequence[Mapping[str, Any]], int]],
    tags: Mapping[int, Kind],
    tails: Mapping[int, tuple[Kind, str]],
) -> list[tuple[Kind, Sequence[Mapping[str, Any]]]]:
    """Each step that adds conversation message `i` ending with its tail, as two: the
    message without the tail (its own kind), then whole (the tail's)."""
    out: list[tuple[Kind, Sequence[Mapping[str, Any]]]] = []
    for kind, prefix, i in steps:
        tail_kind, tail = tails.get(i, ("history", ""))
        content = prefix[-1].get("content")
        if tail and isinstance(content, str) and content.endswith(tail):
            head = content[: -len(tail)].rstrip()
            if head and i not in tags:
                out.append((kind, [*prefix[:-1], {**prefix[-1], "content": head}]))
            kind = tail_kind
        out.append((kind, prefix))
    return out


__all__ = ["KINDS", "ContextMeter", "Kind", "default_kind", "measure"]
