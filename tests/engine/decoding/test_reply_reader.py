"""The one reply reader: thinking first, then calls out of the answer; the same parts streamed
or whole, with the thinking separated or left in the content."""

from __future__ import annotations

import json

import pytest

from engine.decoding.reasoning import ThinkMarkers
from engine.decoding.reply_reader import ReplyReader
from engine.decoding.tool_calls import HermesFormat, Llama3JsonFormat
from engine.host.stats import GenerationStats

ANSWER = (
    '<think>\nMaybe <tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n</think>\n\n'
    'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


def joined(parts: list[tuple[str, str]], kind: str) -> str:
    return "".join(t for k, t in parts if k == kind)


@pytest.mark.parametrize("cut", [1, 5, 17, 60, 90, len(ANSWER)])
def test_separated_thinking_then_calls_streamed_as_whole(cut: int) -> None:
    reader = ReplyReader(ThinkMarkers(), calls=HermesFormat())
    parts = reader.push(ANSWER[:cut], 1) + reader.push(ANSWER[cut:], 2)
    tail, result = reader.finish()
    parts += tail
    assert joined(parts, "reasoning") == result.reasoning
    assert result.reasoning.startswith("Maybe <tool_call>")
    assert joined(parts, "content") == result.content == "Sure."
    assert [(c.name, json.loads(c.arguments)) for c in result.calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_thinking_left_in_the_content_holds_no_calls() -> None:
    reader = ReplyReader(None, think=ThinkMarkers(), calls=HermesFormat())
    parts = [p for ch in ANSWER for p in reader.push(ch)]
    tail, result = reader.finish()
    assert joined(parts + tail, "content") == result.content
    assert result.content.startswith("<think>\nMaybe <tool_call>")
    assert result.content.endswith("</think>\n\nSure.")
    assert [c.name for c in result.calls] == ["get_weather"]


def test_a_block_the_prompt_opened_is_no_place_for_calls_either_way() -> None:
    text = 'Hmm {"name": "a", "parameters": {}}</think>{"name": "b", "parameters": {}}'
    for markers in (ThinkMarkers(), None):
        reader = ReplyReader(markers, in_thinking=True, calls=Llama3JsonFormat())
        reader.push(text)
        assert [c.name for c in reader.finish()[1].calls] == ["b"]


def test_the_block_is_timed_and_a_prefix_only_sets_where_it_stands() -> None:
    ticks = iter([10.0, 11.0, 12.0, 13.0])
    reader = ReplyReader(ThinkMarkers(), prefix="<think>\nSo far", clock=lambda: next(ticks))
    assert reader.thinking
    assert reader.push(" more", 1) == [("reasoning", " more")]
    assert reader.push("</think>Done", 2) == [("content", "Done")]
    stats = GenerationStats(gen_tokens=2)
    tail, result = reader.finish(stats)
    assert tail == [] and result.reasoning == " more" and result.content == "Done"
    assert (stats.thinking_tokens, stats.thinking_s) == reader.closed == (2, 1.0)


def test_forced_calls_are_calls_and_one_without_parallel() -> None:
    two = '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b"'
    reader = ReplyReader(None, calls=HermesFormat(), forced=True, parallel=False)
    reader.push(two)
    result = reader.finish()[1]
    assert result.content == "" and [c.name for c in result.calls] == ["a"]
