"""Reasoning separation: think blocks split from the answer, whole and streamed, and what the
real Qwen3 and DeepSeek-R1 templates do with thinking."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from engine.decoding.reasoning import (
    ReasoningSplitter,
    ThinkMarkers,
    split_reasoning,
    starts_thinking,
    thinking_markers,
)
from engine.model.templates import ChatTemplate

TEMPLATES = Path(__file__).resolve().parents[2] / "data" / "chat_templates"
THINK = ThinkMarkers()


def source(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("name", "markers"),
    [
        ("Qwen-Qwen3-0.6B.jinja", THINK),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", THINK),
        ("Qwen-Qwen2.5-7B-Instruct.jinja", None),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", None),
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", None),
        ("HuggingFaceTB-SmolLM2-135M-Instruct.jinja", None),
    ],
)
def test_markers_of_real_templates(name: str, markers: ThinkMarkers | None) -> None:
    assert thinking_markers(source(name)) == markers


def test_markers_of_no_template() -> None:
    assert thinking_markers(None) is None
    assert thinking_markers("") is None
    mistral = ThinkMarkers("[THINK]", "[/THINK]")
    assert thinking_markers("{{ '[THINK]' }}{{ '[/THINK]' }}") == mistral


# (answer, starts inside the block, reasoning, content)
ANSWERS: list[tuple[str, bool, str, str]] = [
    ("<think>\nThe user greets me.\n</think>\n\nHello!", False, "The user greets me.", "Hello!"),
    ("  \n<think>a</think>b", False, "a", "b"),
    ("<think>\n\n</think>\n\nHello!", False, "", "Hello!"),  # Qwen3 with thinking off
    ("Hello! <think>not reasoning</think>", False, "", "Hello! <think>not reasoning</think>"),
    ("\n\nHello!", False, "", "\n\nHello!"),
    (
        "<think>\nStill thinking when max_tokens hit  \n",
        False,
        "Still thinking when max_tokens hit",
        "",
    ),
    ("<thi", False, "", "<thi"),
    ("Okay, 2 + 2 = 4.\n</think>\n\nIt is 4.", True, "Okay, 2 + 2 = 4.", "It is 4."),
    ("Thinking \n\n more\n</think>It is 4.\n", True, "Thinking \n\n more", "It is 4.\n"),
    ("No close marker at all", True, "No close marker at all", ""),
    ("a </th", True, "a </th", ""),
    ("x<\\think> y</think>z", True, "x<\\think> y", "z"),
    ("", False, "", ""),
    ("", True, "", ""),
]
IDS = [f"{i}-{'inside' if a[1] else 'start'}" for i, a in enumerate(ANSWERS)]


@pytest.mark.parametrize(("text", "inside", "reasoning", "content"), ANSWERS, ids=IDS)
def test_split_reasoning(text: str, inside: bool, reasoning: str, content: str) -> None:
    assert split_reasoning(text, THINK, in_thinking=inside) == (reasoning, content)


def joined(pieces: Sequence[tuple[str, str]]) -> tuple[str, str]:
    assert all(text for _, text in pieces)
    return (
        "".join(t for k, t in pieces if k == "reasoning"),
        "".join(t for k, t in pieces if k == "content"),
    )


@pytest.mark.parametrize(("text", "inside", "reasoning", "content"), ANSWERS, ids=IDS)
def test_streaming_split_anywhere_equals_the_whole(
    text: str, inside: bool, reasoning: str, content: str
) -> None:
    for cut in range(len(text) + 1):
        splitter = ReasoningSplitter(THINK, in_thinking=inside)
        pieces = [*splitter.push(text[:cut]), *splitter.push(text[cut:]), *splitter.flush()]
        assert joined(pieces) == (reasoning, content), cut
    splitter = ReasoningSplitter(THINK, in_thinking=inside)
    pieces = [p for ch in text for p in splitter.push(ch)] + splitter.flush()
    assert joined(pieces) == (reasoning, content)
    # Reasoning never comes after content: the block is at the start.
    kinds = [k for k, _ in pieces]
    assert kinds == sorted(kinds, key=lambda k: k == "content")


def test_streaming_holds_only_a_partial_marker() -> None:
    splitter = ReasoningSplitter(THINK)
    assert splitter.push("<thi") == []
    assert splitter.push("nk>\nStep one") == [("reasoning", "Step one")]
    assert splitter.thinking
    assert splitter.push(". </thi") == [("reasoning", ".")]
    assert splitter.push("nk>\n\nDone") == [("content", "Done")]
    assert not splitter.thinking
    assert splitter.flush() == []


def test_without_markers_everything_is_content() -> None:
    assert split_reasoning("<think>x</think>y", None) == ("", "<think>x</think>y")
    splitter = ReasoningSplitter(None, in_thinking=True)
    assert not splitter.thinking
    assert splitter.push("<think>x") == [("content", "<think>x")]
    assert splitter.flush() == []


def test_other_markers() -> None:
    seed = ThinkMarkers("<seed:think>", "</seed:think>")
    assert split_reasoning("<seed:think>hm</seed:think>ok", seed) == ("hm", "ok")


# --- the real templates ----------------------------------------------------------------------

CHAT: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 2?"}]


def test_r1_prompt_opens_the_block() -> None:
    tmpl = source("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    prompt = ChatTemplate(tmpl).render(CHAT, enable_thinking=True)
    assert prompt.endswith("<\uff5cAssistant\uff5c><think>\n")  # fullwidth bars
    assert starts_thinking(prompt, thinking_markers(tmpl))
    # llama.cpp's copy closes the block unless thinking is asked for.
    closed = ChatTemplate(tmpl).render(CHAT)
    assert closed.endswith("<think>\n</think>")
    assert not starts_thinking(closed, THINK)


def test_starts_thinking_needs_markers_and_the_open_marker_last() -> None:
    assert starts_thinking("<|im_start|>assistant\n<think>\n\n", THINK)
    assert not starts_thinking("<|im_start|>assistant\n<think>\n", None)
    assert not starts_thinking("<|im_start|>assistant\n", THINK)


def test_qwen3_thinking_off_renders_an_empty_block() -> None:
    tmpl = ChatTemplate(source("Qwen-Qwen3-0.6B.jinja"))
    off = tmpl.render(CHAT, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not starts_thinking(off, THINK)
    on = tmpl.render(CHAT, enable_thinking=True)
    assert on.endswith("<|im_start|>assistant\n")
    assert tmpl.render(CHAT) == on  # thinking is on unless turned off


def test_qwen3_keeps_reasoning_only_after_the_last_question() -> None:
    tmpl = ChatTemplate(source("Qwen-Qwen3-0.6B.jinja"))
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "A greeting."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I need the tool.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": "Sunny"},
    ]
    prompt = tmpl.render(history)
    # An earlier turn loses its reasoning; the tool-calling turn after the question keeps it.
    assert "<|im_start|>assistant\nHello!<|im_end|>" in prompt
    assert "A greeting." not in prompt
    assert (
        "<|im_start|>assistant\n<think>\nI need the tool.\n</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    ) in prompt
    # Reasoning left in the content of an old turn is cut out by the template itself.
    inline = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello!"},
        {"role": "user", "content": "Bye"},
    ]
    assert "A greeting." not in tmpl.render(inline)
