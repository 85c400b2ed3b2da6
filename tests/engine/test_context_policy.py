"""Context overflow policies on the real SmolLM2 tokenizer and chat template."""

from __future__ import annotations

import pytest

from engine.host.context_policy import ContextFullError, fit_messages
from engine.host.runtime import Model


def _conversation(turns: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Question {i}: " + "tell me more " * 20})
        msgs.append({"role": "assistant", "content": f"Answer {i}: " + "here is more " * 20})
    msgs.append({"role": "user", "content": "Final question?"})
    return msgs


def test_fits_unchanged(smollm2: Model) -> None:
    msgs = _conversation(1)
    r = fit_messages(msgs, lambda m: len(smollm2.chat_tokens(m)), 2048, reserve=256)
    assert r.dropped == 0 and r.messages == msgs
    assert r.prompt_tokens == len(smollm2.chat_tokens(msgs))


def test_drop_oldest_keeps_system_and_latest(smollm2: Model) -> None:
    msgs = _conversation(20)
    count = lambda m: len(smollm2.chat_tokens(m))  # noqa: E731
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
