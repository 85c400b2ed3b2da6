"""The context meter on the real SmolLM2 tokenizer and template: its kinds add up to exactly
the prompt that plan_chat sends, whatever the conversation holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.host.chat_plan import plan_chat
from engine.host.context_meter import KINDS, measure
from engine.host.context_summary import Summary
from engine.host.runtime import Model
from engine.media.images import decode_image
from engine.native.projector import marker
from engine.settings import LoadParams
from tests.media_files import png
from tests.projector_gguf import TOKENS_PER_IMAGE, test_image

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def _conversation(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Question {i}: " + "tell me more " * 20})
        msgs.append({"role": "assistant", "content": f"Answer {i}: " + "here is more " * 20})
    msgs.append({"role": "user", "content": "Final question?"})
    return msgs


def test_each_kind_is_counted_and_the_kinds_sum_to_the_prompt(smollm2: Model) -> None:
    msgs = _conversation(2)
    msgs.insert(1, {"role": "system", "content": "Passage: the lighthouse is 40 m tall."})
    plan = plan_chat(smollm2, msgs, policy="drop_oldest", reserve=100)
    meter = measure(smollm2, plan, kinds={1: "documents"})
    assert set(meter.kinds) == set(KINDS)
    assert sum(meter.kinds.values()) == meter.prompt_tokens == len(plan.prompt)
    for kind in ("system", "documents", "history", "question", "template"):
        assert meter.kinds[kind] > 0, kind
    assert meter.kinds["attachments"] == meter.kinds["tool_results"] == 0
    # The system prompt is charged what it renders to alone; the question and the
    # generation prompt what they add.
    assert meter.kinds["system"] == len(smollm2.chat_prompt_tokens(_alone(smollm2, msgs[:1])))
    assert meter.kinds["template"] == len(plan.prompt) - len(
        smollm2.chat_prompt_tokens(_alone(smollm2, msgs))
    )
    assert meter.reserve == 100 and meter.n_ctx == smollm2.n_ctx_seq
    assert meter.free == smollm2.n_ctx_seq - len(plan.prompt) - 100 and meter.left_out == ()


def _alone(model: Model, msgs: list[dict[str, Any]]) -> str:
    return model.template.render(msgs, add_generation_prompt=False)


def test_tool_results_and_tool_definitions_are_counted(smollm2: Model) -> None:
    msgs = _conversation(1)
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    msgs[-1:] = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 3, "sky": "snow"}'},
    ]
    plan = plan_chat(smollm2, msgs, tools=TOOLS, policy="drop_oldest", reserve=100)
    meter = measure(smollm2, plan)
    assert sum(meter.kinds.values()) == len(plan.prompt)
    assert meter.kinds["tool_results"] > 0 and meter.kinds["question"] == 0


@pytest.mark.parametrize("policy", ["drop_oldest", "truncate_middle"])
def test_left_out_turns_are_named_and_not_counted(smollm2: Model, policy: str) -> None:
    msgs = _conversation(20)
    plan = plan_chat(smollm2, msgs, policy=policy, reserve=200)  # type: ignore[arg-type]
    meter = measure(smollm2, plan)
    assert meter.left_out == plan.left_out and meter.left_out
    assert sum(meter.kinds.values()) == len(plan.prompt)
    assert meter.prompt_tokens + meter.reserve <= meter.n_ctx


@pytest.mark.parametrize("system", [True, False])
def test_a_summary_is_its_own_kind(smollm2: Model, system: bool) -> None:
    msgs = _conversation(20)
    if not system:
        msgs = msgs[1:]
    first = plan_chat(smollm2, msgs, policy="summarise", reserve=200)
    summary = Summary("They asked for more, again and again.", first.left_out)
    plan = plan_chat(smollm2, msgs, policy="summarise", reserve=200, summary=summary)
    meter = measure(smollm2, plan)
    assert sum(meter.kinds.values()) == len(plan.prompt)
    assert meter.kinds["summary"] > len(smollm2.tokenize(summary.text, add_special=False))
    assert (meter.kinds["system"] > 0) is system


@pytest.fixture(scope="module")
def vision(smollm2_path: Path, vision_projector_path: Path) -> Iterator[Model]:
    m = Model(
        smollm2_path,
        LoadParams(n_ctx=2048, n_threads=2, mmproj=str(vision_projector_path)),
    )
    yield m
    m.close()


def test_an_image_is_counted_as_the_projectors_rows(vision: Model) -> None:
    msgs = _conversation(1)
    msgs[-1] = {"role": "user", "content": marker() + "\nWhat is in this picture?"}
    media = [decode_image(png(test_image()))]
    plan = plan_chat(vision, msgs, media=media)
    assert plan.media is not None
    meter = measure(vision, plan)
    assert sum(meter.kinds.values()) == len(plan.prompt)
    rows = plan.media.media_tokens
    assert rows == 2 * TOKENS_PER_IMAGE
    # The rows and the few tokens the projector wraps each chunk in.
    assert rows <= meter.kinds["attachments"] < rows + 32
    assert meter.kinds["question"] > 0
    plan.media.close()
