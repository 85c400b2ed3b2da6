"""The embedded engine behind the `ChatEngine` interface, on the real SmolLM2."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.host.chat_engine import ChatEngine, ChatRequest, EmbeddedEngine, ReplyStream
from engine.host.context_policy import ContextFullError
from engine.host.runtime import Model
from engine.settings import LoadParams, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
QUESTION = [{"role": "user", "content": "Name three colours."}]


def long_chat(turns: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Question {i}: " + "tell me more " * 60})
        msgs.append({"role": "assistant", "content": "Here is more. " * 40})
    msgs.append({"role": "user", "content": "And finally?"})
    return msgs


def test_interface(smollm2: Model) -> None:
    engine = EmbeddedEngine(smollm2)
    assert isinstance(engine, ChatEngine)
    assert engine.kind == "embedded" and engine.can_continue
    assert engine.n_ctx == smollm2.n_ctx == 2048
    assert engine.name == smollm2.gguf.metadata.get("general.name")
    smollm2.reset_cache()
    reply = engine.reply(ChatRequest(QUESTION, GREEDY))
    assert isinstance(reply, ReplyStream)
    assert reply.prompt_tokens == len(smollm2.chat_tokens(QUESTION))
    counts: list[int] = []
    pieces = []
    for p in reply:
        pieces.append(p)
        counts.append(reply.generated_tokens)
    assert "".join(pieces) == reply.text and counts == sorted(counts)
    st = reply.stats
    assert st.measured_on == "engine" and st.server_usage == ()
    assert st.gen_tokens == reply.generated_tokens and st.prompt_tokens == reply.prompt_tokens
    assert reply.dropped_messages == 0
    # The same question straight through the model: the adapter changes nothing.
    smollm2.reset_cache()
    assert smollm2.generate(QUESTION, GREEDY).consume() == reply.text


def test_the_conversation_is_fitted_to_the_context(smollm2: Model) -> None:
    msgs = long_chat(8)
    assert len(smollm2.chat_tokens(msgs)) > smollm2.n_ctx
    engine = EmbeddedEngine(smollm2)
    sampling = SamplingParams(temperature=0.0, max_tokens=600)
    reply = engine.reply(ChatRequest(msgs, sampling, policy="drop_oldest"))
    assert reply.dropped_messages > 0
    assert reply.prompt_tokens is not None
    assert reply.prompt_tokens <= smollm2.n_ctx - 600
    kept = msgs[:1] + msgs[1 + reply.dropped_messages :]
    assert reply.prompt_tokens == len(smollm2.chat_tokens(kept))
    with pytest.raises(ContextFullError, match=r"the conversation is .* tokens"):
        engine.reply(ChatRequest(msgs, sampling, policy="stop"))
    # Without a policy the prompt goes as it is, and the model refuses it.
    with pytest.raises(EngineError, match="the context holds 2048"):
        engine.reply(ChatRequest(msgs, sampling))


def test_continue_text_ends_the_prompt(smollm2: Model) -> None:
    engine = EmbeddedEngine(smollm2)
    partial = "Red, green"
    smollm2.reset_cache()
    reply = engine.reply(ChatRequest(QUESTION, GREEDY, continue_text=partial))
    expected = smollm2.chat_tokens(QUESTION) + smollm2.tokenize(
        partial, add_special=False, parse_special=False
    )
    assert reply.prompt_tokens == len(expected)
    text = "".join(reply)
    assert text and not text.startswith(partial)  # only the new text comes back
    assert reply.stats.gen_tokens >= 1


def test_cancel_and_close(smollm2_path: Path) -> None:
    model = Model(smollm2_path, LoadParams(n_ctx=256, n_threads=2))
    engine = EmbeddedEngine(model, name="tiny")
    assert engine.name == "tiny" and engine.n_ctx == 256
    cancel = threading.Event()
    reply = engine.reply(ChatRequest(QUESTION, SamplingParams(max_tokens=100)), cancel)
    for _ in reply:
        cancel.set()
    assert reply.stats.stop_reason == "cancelled"
    engine.close()
    with pytest.raises(EngineError, match="unloaded"):
        engine.reply(ChatRequest(QUESTION, GREEDY))
