"""Context overflow policies on the real SmolLM2 tokenizer and chat template."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from engine.host.chat_plan import plan_chat
from engine.host.context_policy import CONTEXT_POLICIES, ContextFullError, fit_messages
from engine.host.context_summary import NOTE_TOKENS, summary_room
from engine.host.runtime import Model


def _conversation(turns: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Question {i}: " + "tell me more " * 20})
        msgs.append({"role": "assistant", "content": f"Answer {i}: " + "here is more " * 20})
    msgs.append({"role": "user", "content": "Final question?"})
    return msgs


def _counter(model: Model) -> Callable[[Sequence[Mapping[str, Any]]], int]:
    return lambda m: len(model.chat_tokens(m))


def test_fits_unchanged(smollm2: Model) -> None:
    msgs = _conversation(1)
    r = fit_messages(msgs, lambda m: len(smollm2.chat_tokens(m)), 2048, reserve=256)
    assert r.dropped == 0 and r.messages == msgs
    assert r.prompt_tokens == len(smollm2.chat_tokens(msgs))


def test_drop_oldest_keeps_system_and_latest(smollm2: Model) -> None:
    msgs = _conversation(20)
    count = _counter(smollm2)
    assert count(msgs) > 1024
    r = fit_messages(msgs, count, 1024, reserve=200)
    assert r.prompt_tokens <= 1024 - 200 and r.prompt_tokens == count(r.messages)
    assert r.messages[0] == msgs[0]  # the system prompt stays
    assert r.messages[-1] == msgs[-1]  # the question stays
    assert r.messages[1]["role"] == "user"  # the kept part starts at a turn boundary
    assert r.dropped > 0 and len(r.messages) == len(msgs) - r.dropped
    # The fewest turns were dropped: keeping one more message would not fit.
    bigger = [msgs[0], *msgs[len(msgs) - len(r.messages) - 1 :]]
    assert count(bigger) > 1024 - 200


def test_stop_policy_says_why(smollm2: Model) -> None:
    with pytest.raises(ContextFullError, match=r"the context holds 1024 \(200 kept"):
        fit_messages(
            _conversation(20),
            lambda m: len(smollm2.chat_tokens(m)),
            1024,
            reserve=200,
            policy="stop",
        )


def test_single_huge_message_is_refused(smollm2: Model) -> None:
    msgs = [{"role": "user", "content": "word " * 3000}]
    with pytest.raises(ContextFullError, match="even the last message"):
        fit_messages(msgs, lambda m: len(smollm2.chat_tokens(m)), 1024, reserve=100)


def test_left_out_names_the_dropped_indices(smollm2: Model) -> None:
    msgs = _conversation(20)
    count = _counter(smollm2)
    r = fit_messages(msgs, count, 1024, reserve=200)
    assert r.left_out == tuple(range(1, 1 + r.dropped))
    assert r.messages == [m for i, m in enumerate(msgs) if i not in r.left_out]


def test_truncate_middle_keeps_the_first_exchange_and_the_latest_turns(smollm2: Model) -> None:
    msgs = _conversation(20)
    count = _counter(smollm2)
    budget = 1024 - 200
    r = fit_messages(msgs, count, 1024, reserve=200, policy="truncate_middle")
    assert r.prompt_tokens <= budget and r.prompt_tokens == count(r.messages)
    # Exactly the turns it names are gone: one contiguous gap after the first exchange,
    # ending before a user message.
    assert r.messages == [m for i, m in enumerate(msgs) if i not in r.left_out]
    gap = r.left_out
    assert gap == tuple(range(gap[0], gap[-1] + 1))
    assert gap[0] == 3 and msgs[gap[-1] + 1]["role"] == "user"
    assert r.messages[:3] == msgs[:3] and r.messages[-1] == msgs[-1]
    # The fewest: ending the gap one turn (two messages) earlier would not fit.
    bigger = [m for i, m in enumerate(msgs) if i not in gap[:-2]]
    assert count(bigger) > budget


def test_truncate_middle_falls_back_to_drop_oldest_when_the_first_exchange_cannot_stay(
    smollm2: Model,
) -> None:
    msgs = _conversation(3)
    msgs[1] = {"role": "user", "content": "Question 0: " + "tell me more " * 200}
    count = _counter(smollm2)
    r = fit_messages(msgs, count, 1024, reserve=500, policy="truncate_middle")
    assert r.prompt_tokens <= 1024 - 500
    assert r.left_out[0] == 1 and r.messages[0] == msgs[0] and r.messages[-1] == msgs[-1]
    assert r.left_out == tuple(range(1, 1 + r.dropped))


def test_summarise_leaves_out_what_drop_oldest_does(smollm2: Model) -> None:
    msgs = _conversation(20)
    count = _counter(smollm2)
    a = fit_messages(msgs, count, 1024, reserve=200, policy="summarise")
    b = fit_messages(msgs, count, 1024, reserve=200, policy="drop_oldest")
    assert a == b and a.left_out


@pytest.mark.parametrize("policy", ["drop_oldest", "truncate_middle", "summarise"])
def test_the_plan_sends_exactly_what_the_fit_announced(smollm2: Model, policy: str) -> None:
    msgs = _conversation(20)
    plan = plan_chat(smollm2, msgs, policy=policy, reserve=200)  # type: ignore[arg-type]
    kept = [m for i, m in enumerate(msgs) if i not in plan.left_out]
    assert plan.left_out and plan.dropped == len(plan.left_out)
    assert list(plan.messages) == kept
    assert plan.prompt == smollm2.chat_tokens(kept)
    room = 200 + (summary_room(smollm2.n_ctx_seq) + NOTE_TOKENS if policy == "summarise" else 0)
    assert len(plan.prompt) <= smollm2.n_ctx_seq - room


def test_a_conversation_that_fits_is_sent_whole_by_every_policy(smollm2: Model) -> None:
    msgs = _conversation(2)
    for policy in CONTEXT_POLICIES:
        plan = plan_chat(smollm2, msgs, policy=policy, reserve=200)
        assert plan.left_out == () and plan.prompt == smollm2.chat_tokens(msgs)
