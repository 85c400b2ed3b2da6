"""Tools offered through the embedded engine: on the real SmolLM2 (the generic format: its
template knows no tools, so a grammar keeps every answer JSON) and, for the families with
call markup and thinking, on scripted replies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from engine.decoding.reasoning import ThinkMarkers
from engine.decoding.reply_reader import ReplyReader
from engine.decoding.tool_calls import HermesFormat
from engine.errors import EngineError
from engine.host.chat_engine import ChatRequest, EmbeddedEngine, EmbeddedReply
from engine.host.chat_plan import PlanError
from engine.host.runtime import Model
from engine.host.stats import GenerationStats
from engine.settings import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=80)
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What is 2 plus 3? Use the add tool."}]
FORCE_ADD = {"type": "function", "function": {"name": "add"}}


def test_a_forced_call_comes_back_parsed_and_hidden(smollm2: Model) -> None:
    engine = EmbeddedEngine(smollm2)
    smollm2.reset_cache()
    reply = engine.reply(ChatRequest(ASK, GREEDY, tools=[ADD, WEATHER], tool_choice=FORCE_ADD))
    shown = "".join(reply)
    assert reply.stats.stop_reason == "stop"
    assert reply.tool_calls  # parallel calls are allowed: each one is to `add`
    for call in reply.tool_calls:
        assert call.name == "add" and call.id.startswith("call_")
        args = json.loads(call.arguments)
        assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
    assert len({c.id for c in reply.tool_calls}) == len(reply.tool_calls)
    # The model wrote the generic format's JSON; none of it is shown.
    assert "tool_calls" in reply.generation.text
    assert shown == reply.text == ""
    # The tools were described to the model.
    assert "Add two integers." in smollm2.detokenize(reply.generation.prompt)


def test_required_calls_one_of_the_tools(smollm2: Model) -> None:
    engine = EmbeddedEngine(smollm2)
    smollm2.reset_cache()
    reply = engine.reply(ChatRequest(ASK, GREEDY, tools=[ADD, WEATHER], tool_choice="required"))
    assert "".join(reply) == ""
    assert reply.tool_calls and {c.name for c in reply.tool_calls} <= {"add", "weather"}
    for c in reply.tool_calls:
        assert isinstance(json.loads(c.arguments), dict)


def test_a_second_turn_reads_the_call_and_its_result(smollm2: Model) -> None:
    engine = EmbeddedEngine(smollm2)
    history: list[dict[str, Any]] = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    for choice in ("auto", "none"):
        smollm2.reset_cache()
        reply = engine.reply(ChatRequest(history, GREEDY, tools=[ADD], tool_choice=choice))
        shown = "".join(reply)
        prompt = smollm2.detokenize(reply.generation.prompt)
        assert "call_1" in prompt and '"add"' in prompt and "tool_response" in prompt
        assert reply.stats.gen_tokens > 0
        if choice == "none":  # no grammar, no parsing: the text as the model wrote it
            assert shown == reply.generation.text and reply.tool_calls == []
        elif not reply.tool_calls:  # auto: JSON either way; a response is shown decoded
            assert shown and not shown.lstrip().startswith("{")


def test_without_tools_nothing_changes(smollm2: Model) -> None:
    engine = EmbeddedEngine(smollm2)
    smollm2.reset_cache()
    plain = engine.reply(ChatRequest(ASK, GREEDY))
    text = "".join(plain)
    smollm2.reset_cache()
    assert text == smollm2.generate(ASK, GREEDY).consume() == plain.text
    assert plain.tool_calls == []
    assert plain.prompt_tokens == len(smollm2.chat_tokens(ASK))


def test_bad_tool_requests_are_engine_errors(smollm2: Model) -> None:
    engine = EmbeddedEngine(smollm2)
    with pytest.raises(EngineError, match="not among the tools"):
        engine.reply(ChatRequest(ASK, GREEDY, tools=[ADD], tool_choice="nope"))
    with pytest.raises(EngineError, match="needs tools"):
        engine.reply(ChatRequest(ASK, GREEDY, tool_choice="required"))
    with pytest.raises(PlanError, match="cannot be combined with tools") as e:
        engine.reply(ChatRequest(ASK, SamplingParams(grammar="%json {}"), tools=[ADD]))
    assert e.value.param == "grammar"


# --- call markup and thinking, on scripted replies ---------------------------------------------


class ScriptedGeneration:
    """What `EmbeddedReply` reads of a `Generation`: pieces, one token each."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces
        self.prompt = [1, 2, 3]
        self.tokens: list[int] = []
        self.text = ""
        self.stats = GenerationStats(prompt_tokens=3)

    def __iter__(self) -> Iterator[str]:
        for p in self.pieces:
            self.tokens.append(len(self.tokens))
            self.text += p
            yield p
        self.stats.gen_tokens = len(self.tokens)


def scripted(pieces: list[str], *, in_thinking: bool = False) -> EmbeddedReply:
    reader = ReplyReader(ThinkMarkers(), in_thinking=in_thinking, calls=HermesFormat())
    gen: Any = ScriptedGeneration(pieces)
    return EmbeddedReply(gen, reader)


def read(reply: EmbeddedReply) -> list[tuple[str, str]]:
    parts: list[tuple[str, str]] = []
    for ready in reply.parts():
        parts.extend(ready)
    return parts


def joined(parts: list[tuple[str, str]], kind: str) -> str:
    return "".join(t for k, t in parts if k == kind)


CALL = ["<tool_call>", '\n{"name": "add", ', '"arguments": {"a": 2, "b": 3}}', "\n", "</tool_call>"]


def test_thinking_is_kept_and_the_markup_taken_out() -> None:
    reply = scripted(
        [
            "<think>",
            "\nA draft: <tool_call>",
            " maybe.\n",
            "</think>",
            "\n\n",
            "Adding.",
            "\n",
            *CALL,
        ]
    )
    parts = read(reply)
    # A marker inside the thinking is no call.
    assert joined(parts, "reasoning") == "A draft: <tool_call> maybe."
    assert joined(parts, "content") == "Adding."
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [
        ("add", {"a": 2, "b": 3})
    ]
    assert reply.stats.thinking_tokens == 4


def test_a_block_the_prompt_opened_holds_no_calls() -> None:
    reply = scripted(["Let me <tool_call> think.", "</think>", "\n", *CALL], in_thinking=True)
    parts = read(reply)
    assert joined(parts, "reasoning") == "Let me <tool_call> think."
    assert joined(parts, "content") == ""
    assert [c.name for c in reply.tool_calls] == ["add"]


def test_an_unreadable_call_stays_text() -> None:
    reply = scripted(["Sure. ", "<tool_call>", "\n{not json"])
    assert joined(read(reply), "content") == "Sure. <tool_call>\n{not json"
    assert reply.tool_calls == []
