"""Policy "summarise", the engine's half: the request for a summary of the left-out turns,
and the conversation sent with the summary in their place (SmolLM2's template, and one that
refuses a second system message and demands alternating roles)."""

from __future__ import annotations

import pytest

from engine.host.chat_plan import PlanError, plan_chat
from engine.host.context_summary import (
    INSTRUCTION,
    NOTE,
    SUMMARY_ORIGIN,
    Summary,
    summary_request,
    summary_room,
    with_summary,
)
from engine.host.runtime import Model
from engine.model.templates import ChatTemplate
from engine.settings import SamplingParams

# Like Mistral's and Gemma's: one leading system message at most, then user/assistant turns.
STRICT = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('a system message after the first') }}{% endif %}"
    "{% set k = loop.index0 - (1 if messages[0]['role'] == 'system' else 0) %}"
    "{% if m['role'] != 'system' and (m['role'] == 'user') != (k % 2 == 0) %}"
    "{{ raise_exception('roles must alternate') }}{% endif %}"
    "[{{ m['role'] }}]{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


def _conversation(turns: int, system: bool = True) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "You are terse."}] if system else []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Question {i}: " + "tell me more " * 20})
        msgs.append({"role": "assistant", "content": f"Answer {i}: " + "here is more " * 20})
    msgs.append({"role": "user", "content": "Final question?"})
    return msgs


def test_the_request_holds_the_left_out_turns_and_a_neutral_instruction() -> None:
    msgs = _conversation(3)
    msgs.insert(3, {"role": "tool", "content": "42"})
    req = summary_request(msgs, (1, 2, 3))
    assert [m["role"] for m in req] == ["user"]
    text = req[0]["content"]
    assert text.startswith(INSTRUCTION)
    assert "User: Question 0" in text and "Assistant: Answer 0" in text
    assert "Tool result: 42" in text and "Question 1" not in text


@pytest.mark.parametrize("system", [True, False])
def test_the_summary_renders_with_strict_templates_and_smollm2(
    smollm2: Model, system: bool
) -> None:
    msgs = _conversation(4, system)
    first = 1 if system else 0
    covers = tuple(range(first, first + 4))  # two whole turns
    sent = with_summary(msgs, Summary("They talked about more.", covers))
    kept = [m for i, m in enumerate(msgs) if i not in covers]
    assert len(sent.messages) == len(kept) + (0 if system else 2)
    assert sent.folded is system
    if system:  # folded into the one system message
        assert sent.messages[0]["content"].startswith("You are terse.")
        assert NOTE in sent.messages[0]["content"] and sent.origin[0] == 0
    else:  # a user message and a reply, before the kept turns
        assert [m["role"] for m in sent.messages[:3]] == ["user", "assistant", "user"]
        assert sent.origin[:2] == (SUMMARY_ORIGIN, SUMMARY_ORIGIN)
    assert [o for o in sent.origin if o >= 0] == [i for i in range(len(msgs)) if i not in covers]
    strict = ChatTemplate(STRICT)
    with pytest.raises(Exception, match="after the first"):
        strict.render([*msgs[:1], {"role": "system", "content": "x"}, *msgs[1:]])
    assert "They talked" in strict.render(sent.messages)
    assert "They talked" in smollm2.render_chat(sent.messages)
    assert strict.render(summary_request(msgs, covers))


def test_a_summary_made_by_the_model_is_sent_in_place_of_the_turns(smollm2: Model) -> None:
    msgs = _conversation(20)
    first = plan_chat(smollm2, msgs, policy="summarise", reserve=200)
    assert first.left_out and first.summary is None
    ask = plan_chat(
        smollm2, summary_request(msgs, first.left_out), policy="drop_oldest", reserve=64
    )
    # A short one keeps the test quick; the room kept is for the longest asked for.
    limit = min(summary_room(smollm2.n_ctx_seq), 32)
    gen = smollm2.submit(ask.prompt, SamplingParams(temperature=0.0, max_tokens=limit, seed=1))
    text = gen.consume().strip() or "(empty)"
    summary = Summary(text, first.left_out)
    plan = plan_chat(smollm2, msgs, policy="summarise", reserve=200, summary=summary)
    assert plan.summary == summary and plan.folded
    assert plan.left_out == first.left_out  # the room kept for it was enough
    expected = with_summary(msgs, summary).messages
    assert list(plan.messages) == expected and plan.prompt == smollm2.chat_tokens(expected)
    assert text in plan.text and len(plan.prompt) <= smollm2.n_ctx_seq - 200


def test_a_summary_needs_the_summarise_policy(smollm2: Model) -> None:
    with pytest.raises(PlanError) as e:
        plan_chat(smollm2, _conversation(1), policy="drop_oldest", summary=Summary("x", (1,)))
    assert e.value.param == "context_policy"
