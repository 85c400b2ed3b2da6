"""Tool-call formats: real chat templates render tools and call history, answers split into
content and calls, whole and streamed, and the forcing grammars accept well-formed calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import llguidance as llg
import pytest

from engine.decoding.reasoning import ThinkMarkers, block_end
from engine.decoding.tool_calls import (
    MAX_ARGUMENT_CHARS,
    MAX_PARALLEL_CALLS,
    GenericFormat,
    HermesFormat,
    Llama3JsonFormat,
    MistralFormat,
    ToolCall,
    ToolCallError,
    ToolFormat,
    tool_format_for,
)
from engine.model.templates import ChatTemplate

TEMPLATES = Path(__file__).resolve().parents[2] / "data" / "chat_templates"
QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
HERMES3 = "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"
LLAMA31 = "meta-llama-Llama-3.1-8B-Instruct.jinja"
LLAMA32 = "meta-llama-Llama-3.2-3B-Instruct.jinja"
NEMO = "mistralai-Mistral-Nemo-Instruct-2407.jinja"
QWEN3 = "Qwen-Qwen3-0.6B.jinja"
R1 = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
SMOLLM2 = "HuggingFaceTB-SmolLM2-135M-Instruct.jinja"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "Name of the city"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
RESULT = "Sunny, 21 degrees"

# OpenAI-shaped history: arguments as JSON text, an assistant turn with no text.
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a weather assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_8f2a41c0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_8f2a41c0", "content": RESULT},
]


def source(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


def render(
    name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] = TOOLS, **extra: Any
) -> str:
    fmt = tool_format_for(source(name))
    template = ChatTemplate(source(name), bos_token="<s>", eos_token="</s>")
    return template.render(
        fmt.template_messages(messages, tools), **fmt.template_vars(tools), **extra
    )


# --- choosing the family ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "family"),
    [
        (QWEN25, "hermes"),
        (HERMES3, "hermes"),
        (QWEN3, "hermes"),
        (LLAMA31, "llama3_json"),
        (LLAMA32, "llama3_json"),
        (NEMO, "mistral"),
        (R1, "generic"),
        (SMOLLM2, "generic"),
    ],
)
def test_family_of_real_templates(name: str, family: str) -> None:
    fmt = tool_format_for(source(name))
    assert fmt.name == family
    assert fmt.native == (family != "generic")


def test_no_template_is_generic() -> None:
    assert tool_format_for(None).name == "generic"
    assert tool_format_for("").name == "generic"


def test_other_tool_call_tags_are_not_taken_for_hermes() -> None:
    qwen3_coder = "{% for tool in tools %}{% endfor %}<tool_call>\n<function=x>\n<parameter=y>"
    assert tool_format_for(qwen3_coder).name == "generic"
    apriel = (
        "{{ tools }} within <tool_call></tool_call> XML tags: <tool_calls>"
        '[{"name": <function-name-1>, "arguments": <args-dict-1>}]</tool_calls>'
    )
    assert tool_format_for(apriel).name == "generic"


# --- rendering with the real templates -------------------------------------------------------


def test_hermes_qwen25_renders_tools_call_and_result() -> None:
    prompt = render(QWEN25, HISTORY)
    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are a weather assistant.")
    assert "<tools>" in system and '"name": "get_weather"' in system
    assert "Get the current weather in a city" in system
    # The call is rendered from the parsed arguments, not the JSON text quoted again.
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>'
    ) in prompt
    assert f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_hermes3_renders_tool_role_turn() -> None:
    prompt = render(HERMES3, HISTORY)
    assert prompt.startswith("<s><|im_start|>system\nYou are a function calling AI model.")
    assert "get_weather(city: str) - Get the current weather in a city" in prompt
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        in prompt
    )
    assert f"<|im_start|>tool\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>" in prompt


def test_hermes_content_next_to_a_call_is_kept() -> None:
    history = [*HISTORY[:2], {**HISTORY[2], "content": "Checking."}, HISTORY[3]]
    assert "<|im_start|>assistant\nChecking.\n<tool_call>" in render(QWEN25, history)


@pytest.mark.parametrize("name", [LLAMA31, LLAMA32])
def test_llama3_renders_tools_in_first_user_turn(name: str) -> None:
    prompt = render(name, HISTORY)
    assert "Environment: ipython" in prompt
    user = prompt.split("<|start_header_id|>user<|end_header_id|>\n\n")[1].split("<|eot_id|>")[0]
    assert '"name": "get_weather"' in user and "Get the current weather in a city" in user
    assert user.endswith("What is the weather in Paris?")
    assert (
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", '
        '"parameters": {"city": "Paris"}}<|eot_id|>'
    ) in prompt
    # The template JSON-encodes any text result (a string is iterable to Jinja).
    assert f'<|start_header_id|>ipython<|end_header_id|>\n\n"{RESULT}"<|eot_id|>' in prompt


def test_llama3_parallel_calls_become_one_turn_each() -> None:
    call = HISTORY[2]["tool_calls"][0]
    second = {
        "id": "call_2",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"timezone": "CET"}'},
    }
    history = [
        *HISTORY[:2],
        {"role": "assistant", "content": None, "tool_calls": [call, second]},
        HISTORY[3],
        {"role": "tool", "tool_call_id": "call_2", "content": "10:00"},
    ]
    prompt = render(LLAMA31, history)  # the template refuses two calls in one turn
    assert prompt.count('{"name": "get_weather", "parameters": {"city": "Paris"}}') == 1
    assert prompt.count('{"name": "get_time", "parameters": {"timezone": "CET"}}') == 1


def test_llama3_without_tools_has_no_tool_prompt() -> None:
    prompt = render(LLAMA31, HISTORY[:2], tools=[])
    assert "Environment: ipython" not in prompt and "functions" not in prompt


def test_mistral_renders_tools_and_nine_character_ids() -> None:
    prompt = render(NEMO, HISTORY)
    assert prompt.startswith("<s>[AVAILABLE_TOOLS][")
    assert '"name": "get_weather", "description": "Get the current weather in a city"' in prompt
    calls = prompt.split("[TOOL_CALLS]")[1].split("</s>")[0]
    (call,) = json.loads(calls)
    assert call["name"] == "get_weather" and call["arguments"] == {"city": "Paris"}
    assert len(call["id"]) == 9 and call["id"].isalnum()
    # The result is matched to its call by the same id; the template inserts the text bare.
    assert (
        f'[TOOL_RESULTS]{{"content": {RESULT}, "call_id": "{call["id"]}"}}[/TOOL_RESULTS]' in prompt
    )
    assert render(NEMO, HISTORY) == prompt  # ids derived, not drawn: the prompt cache holds


def test_mistral_keeps_valid_ids() -> None:
    history = [dict(m) for m in HISTORY]
    history[2] = {**history[2], "tool_calls": [{**history[2]["tool_calls"][0], "id": "a1B2c3D4e"}]}
    history[3] = {**history[3], "tool_call_id": "a1B2c3D4e"}
    assert '"id": "a1B2c3D4e"}]' in render(NEMO, history)


def test_qwen3_renders_tools() -> None:
    prompt = render(QWEN3, HISTORY)
    assert "# Tools" in prompt and '"name": "get_weather"' in prompt
    assert f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>" in prompt


@pytest.mark.parametrize("name", [SMOLLM2, R1])
def test_generic_describes_tools_in_the_system_message(name: str) -> None:
    fmt = tool_format_for(source(name))
    messages = fmt.template_messages(HISTORY, TOOLS)
    assert fmt.template_vars(TOOLS) == {}
    system = messages[0]
    assert system["role"] == "system"
    assert system["content"].startswith("You are a weather assistant.\n\n")
    assert '"name": "get_weather"' in system["content"] and "`tool_calls`" in system["content"]
    call_turn = json.loads(messages[2]["content"])
    assert call_turn == {
        "tool_calls": [
            {"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_8f2a41c0"}
        ]
    }
    assert "tool_calls" not in messages[2]
    result = json.loads(messages[3]["content"])
    assert messages[3]["role"] == "user"
    assert result == {
        "tool_response": {"tool": "get_weather", "content": RESULT, "tool_call_id": "call_8f2a41c0"}
    }
    prompt = render(name, HISTORY)
    assert "Get the current weather in a city" in prompt and RESULT in prompt


def test_generic_smollm2_prompt() -> None:
    prompt = render(SMOLLM2, HISTORY)
    assert prompt.startswith(
        "<|im_start|>system\nYou are a weather assistant.\n\n"
        "You can call any of the following tools"
    )
    assert '<|im_start|>assistant\n{\n  "tool_calls": [' in prompt
    assert '<|im_start|>user\n{\n  "tool_response": {' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_generic_adds_a_system_message_and_merges_results() -> None:
    history = [
        HISTORY[1],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                HISTORY[2]["tool_calls"][0],
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": "{}"},
                },
            ],
        },
        HISTORY[3],
        {"role": "tool", "tool_call_id": "c2", "content": "10:00"},
    ]
    messages = GenericFormat().template_messages(history, TOOLS)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("You can call any of the following tools")
    assert '"tool": "get_time"' in messages[3]["content"]  # name found from the call id


def test_generic_puts_tools_in_the_user_turn_when_system_is_refused() -> None:
    gemma_like = (
        "{% if messages[0]['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    )
    fmt = tool_format_for(gemma_like)
    assert isinstance(fmt, GenericFormat) and not fmt.system_role
    messages = fmt.template_messages(HISTORY[1:2], TOOLS)
    assert [m["role"] for m in messages] == ["user"]
    assert messages[0]["content"].startswith("You can call any of the following tools")
    assert messages[0]["content"].endswith("\n\nWhat is the weather in Paris?")
    ChatTemplate(gemma_like).render(messages)
    # The system message goes into the user turn too, ahead of the tools.
    messages = fmt.template_messages(HISTORY, TOOLS)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0]["content"].startswith("You are a weather assistant.\n\nYou can call")
    ChatTemplate(gemma_like).render(messages)


def test_generic_without_tools_keeps_the_history_readable() -> None:
    messages = GenericFormat().template_messages(HISTORY, [])
    assert messages[0] == HISTORY[0]
    assert json.loads(messages[2]["content"])["tool_calls"][0]["name"] == "get_weather"


def test_content_none_is_still_refused_without_tool_calls() -> None:
    with pytest.raises(ValueError, match="text"):
        ChatTemplate(None).render([{"role": "user", "content": None}])


# --- parsing answers -------------------------------------------------------------------------

HERMES_ANSWERS: list[tuple[str, str, list[tuple[str, dict[str, Any]]]]] = [
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}\n'
        "</tool_call>",
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "Europe/Paris"})],
    ),
    (
        "I'll look that up for you.\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "I'll look that up for you.",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        "Anything else?",
        "Anything else?",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>',
        [],
    ),
    (
        '<tool_call>\n{"name": "get_weather"}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather"}\n</tool_call>',
        [],
    ),
    (
        '<think>\nMaybe <tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
        "\n</think>\n\nThe weather is sunny.",
        '<think>\nMaybe <tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
        "\n</think>\n\nThe weather is sunny.",
        [],
    ),
    (
        "<think>\nI need the weather.\n</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "<think>\nI need the weather.\n</think>",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',  # close never came
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    ("The tag <tool_ looks odd", "The tag <tool_ looks odd", []),
    ("Plain answer, no tools.  ", "Plain answer, no tools.  ", []),
]

LLAMA3_ANSWERS: list[tuple[str, str, list[tuple[str, dict[str, Any]]]]] = [
    (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"timezone": "CET"}}',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "CET"})],
    ),
    (
        'Let me check.<|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}}',
        "Let me check.",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '{"name": "get_weather", "parameters": {"city": "Paris"',
        '{"name": "get_weather", "parameters": {"city": "Paris"',
        [],
    ),
    ('{"answer": 42}', '{"answer": 42}', []),
    ("It is sunny in Paris today.", "It is sunny in Paris today.", []),
    (
        "<think>\nI should call it.\n</think>\n\n"
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "<think>\nI should call it.\n</think>",
        [("get_weather", {"city": "Paris"})],
    ),
]

MISTRAL_ANSWERS: list[tuple[str, str, list[tuple[str, dict[str, Any]]]]] = [
    (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1B2c3D4e"}]',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1B2c3D4e"}, '
        '{"name": "get_time", "arguments": {"timezone": "CET"}, "id": "Zz9Yy8Xx7"}]',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "CET"})],
    ),
    (
        'Sure.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "Sure.",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Par',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Par',
        [],
    ),
    ("It is sunny.", "It is sunny.", []),
]

GENERIC_ANSWERS: list[tuple[str, str, list[tuple[str, dict[str, Any]]]]] = [
    (
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '{\n  "tool_calls": [\n    {"name": "get_weather", "arguments": {"city": "Paris"}},\n'
        '    {"name": "get_time", "arguments": {"timezone": "CET"}}\n  ]\n}',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "CET"})],
    ),
    (
        '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        '{"response": "It is sunny in Paris: \\"21 \\u00b0C\\"\\n\\ud83c\\udf1e"}',
        'It is sunny in Paris: "21 °C"\n🌞',
        [],
    ),
    ('{"response": "C:\\\\users\\\\ud83c"}', "C:\\users\\ud83c", []),  # escaped backslashes
    ('{"response": "Cut sho', "Cut sho", []),  # max_tokens hit mid-answer
    (
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": ',
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": ',
        [],
    ),
    ('{"answer": 42}', '{"answer": 42}', []),
    ("Plain text from an unconstrained model.", "Plain text from an unconstrained model.", []),
]

CASES = [
    *((HermesFormat(), *c) for c in HERMES_ANSWERS),
    *((Llama3JsonFormat(), *c) for c in LLAMA3_ANSWERS),
    *((MistralFormat(), *c) for c in MISTRAL_ANSWERS),
    *((GenericFormat(), *c) for c in GENERIC_ANSWERS),
]
IDS = [f"{c[0].name}-{i}" for i, c in enumerate(CASES)]


def after_think(text: str) -> int:
    """Where the answer starts, as the reply reader tells a format when the thinking stays in
    the content: a call drafted in the block is no call."""
    return block_end(text, ThinkMarkers())


def shape(calls: list[ToolCall]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES, ids=IDS)
def test_parse(
    fmt: ToolFormat, text: str, content: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    got_content, got_calls = fmt.parse(text, after_think(text))
    assert got_content == content
    assert shape(got_calls) == calls
    for call in got_calls:
        assert call.id.startswith("call_") or call.id.isalnum()


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES, ids=IDS)
def test_stream_split_anywhere_equals_parse(
    fmt: ToolFormat, text: str, content: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    for cut in range(len(text) + 1):
        stream = fmt.stream(after_think)
        shown = stream.push(text[:cut]) + stream.push(text[cut:])
        rest, got = stream.finish()
        assert shown + rest == content, cut
        assert shape(got) == calls
    stream = fmt.stream(after_think)
    shown = "".join(stream.push(ch) for ch in text)
    rest, got = stream.finish()
    assert shown + rest == content
    assert shape(got) == calls


def test_stream_shows_text_before_a_call_early() -> None:
    stream = HermesFormat().stream()
    assert stream.push("Let me check") == "Let me check"
    assert stream.push(".\n<tool") == "."
    assert stream.push('_call>\n{"name": "get_weather", "arguments": {}}') == ""
    assert stream.push("\n</tool_call>") == ""
    assert stream.finish()[0] == ""


def test_stream_shows_a_generic_response_as_it_comes() -> None:
    stream = GenericFormat().stream()
    assert stream.push('{"response": "Hel') == "Hel"
    assert stream.push("lo \\u00") == "lo "
    assert stream.push('e9"}') == "é"
    assert stream.finish() == ("", [])


def test_model_ids_are_kept_and_missing_ones_made() -> None:
    _, (call,) = MistralFormat().parse(
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {}, "id": "a1B2c3D4e"}]'
    )
    assert call.id == "a1B2c3D4e"
    _, (first, second) = HermesFormat().parse(HERMES_ANSWERS[1][0])
    assert first.id.startswith("call_") and first.id != second.id


def test_string_arguments_are_read_as_json() -> None:
    _, (call,) = HermesFormat().parse(
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}'
        "\n</tool_call>"
    )
    assert json.loads(call.arguments) == {"city": "Paris"}


# --- schemas and grammars --------------------------------------------------------------------

FORMATS = [HermesFormat(), Llama3JsonFormat(), MistralFormat(), GenericFormat()]
FORMAT_IDS = [f.name for f in FORMATS]


def call_json(fmt: ToolFormat, name: str, args: dict[str, Any], calls: int = 1) -> Any:
    """The JSON that `call_schema` describes, for `calls` calls."""
    if isinstance(fmt, Llama3JsonFormat):
        return {"name": name, "parameters": args}
    if isinstance(fmt, MistralFormat):
        return [{"name": name, "arguments": args, "id": "a1B2c3D4e"}] * calls
    if isinstance(fmt, GenericFormat):
        return {"tool_calls": [{"name": name, "arguments": args}] * calls}
    return {"name": name, "arguments": args}


def call_text(fmt: ToolFormat, name: str, args: dict[str, Any], calls: int = 1) -> str:
    """The answer text the grammar must accept."""
    one = json.dumps(call_json(fmt, name, args))
    if isinstance(fmt, HermesFormat):
        return "\n".join([f"<tool_call>\n{one}\n</tool_call>"] * calls)
    if isinstance(fmt, Llama3JsonFormat):
        return "; ".join([one] * calls)
    if isinstance(fmt, MistralFormat):
        return "[TOOL_CALLS]" + json.dumps(call_json(fmt, name, args, calls))
    return json.dumps(call_json(fmt, name, args, calls))


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_call_schema_accepts_valid_calls_and_rejects_others(fmt: ToolFormat) -> None:
    schema = fmt.call_schema(TOOLS, "required", parallel=True)
    assert schema is not None
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(call_json(fmt, "get_weather", {"city": "Paris"}))
    assert validator.is_valid(call_json(fmt, "get_time", {"timezone": "CET"}))
    assert not validator.is_valid(call_json(fmt, "get_stock", {"city": "Paris"}))
    assert not validator.is_valid(call_json(fmt, "get_weather", {"city": 75}))
    assert not validator.is_valid(call_json(fmt, "get_weather", {}))
    named = jsonschema.Draft202012Validator(fmt.call_schema(TOOLS, "get_time", parallel=True))
    assert named.is_valid(call_json(fmt, "get_time", {"timezone": "CET"}))
    assert not named.is_valid(call_json(fmt, "get_weather", {"city": "Paris"}))


@pytest.mark.parametrize("fmt", [MistralFormat(), GenericFormat()], ids=["mistral", "generic"])
def test_one_call_unless_parallel(fmt: ToolFormat) -> None:
    two = call_json(fmt, "get_weather", {"city": "Paris"}, calls=2)
    single = jsonschema.Draft202012Validator(fmt.call_schema(TOOLS, "required", parallel=False))
    assert not single.is_valid(two)
    assert jsonschema.Draft202012Validator(
        fmt.call_schema(TOOLS, "required", parallel=True)
    ).is_valid(two)


def test_generic_auto_allows_a_response() -> None:
    schema = GenericFormat().call_schema(TOOLS, "auto", parallel=True)
    assert schema is not None
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid({"response": "It is sunny."})
    call = {"name": "get_time", "arguments": {"timezone": "X"}}
    assert validator.is_valid({"tool_calls": [call]})
    assert not validator.is_valid({"response": "Hi", "tool_calls": []})
    assert GenericFormat().call_schema(TOOLS, "none", parallel=True) is None


@pytest.mark.parametrize(
    "fmt",
    [HermesFormat(), Llama3JsonFormat(), MistralFormat()],
    ids=["hermes", "llama3_json", "mistral"],
)
def test_native_auto_forces_nothing(fmt: ToolFormat) -> None:
    assert fmt.grammar(TOOLS, "auto", parallel=True) is None
    assert fmt.grammar(TOOLS, "none", parallel=True) is None
    assert fmt.call_schema(TOOLS, "auto", parallel=True) is None


def test_unknown_function_choice_is_an_error() -> None:
    with pytest.raises(ToolCallError, match="get_stock"):
        HermesFormat().grammar(TOOLS, "get_stock", parallel=False)
    with pytest.raises(ToolCallError):
        GenericFormat().call_schema([], "required", parallel=False)


def test_missing_parameters_mean_an_object_without_properties() -> None:
    bare = [{"type": "function", "function": {"name": "ping"}}]
    schema = HermesFormat().call_schema(bare, "required", parallel=False)
    assert schema is not None
    assert jsonschema.Draft202012Validator(schema).is_valid({"name": "ping", "arguments": {}})


class ByteTokenizer:
    """A tokenizer with one token per byte, an EOS and the markers as special tokens: enough
    for llguidance to run a grammar over text without a model."""

    SPECIAL = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]")

    def __init__(self) -> None:
        self.eos_token_id = 256
        self.bos_token_id = None
        self.tokens = (
            [bytes([i]) for i in range(256)]
            + [b"\xff<eos>"]
            + [b"\xff" + s.encode() for s in self.SPECIAL]
        )
        self.special_token_ids = list(range(256, 256 + 1 + len(self.SPECIAL)))

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


@pytest.fixture(scope="module")
def tokenizer() -> llg.LLTokenizer:
    return llg.LLTokenizer(llg.TokenizerWrapper(ByteTokenizer()), slices=[])


def accepts(tokenizer: llg.LLTokenizer, grammar: str, tokens: list[int]) -> bool:
    matcher = llg.LLMatcher(tokenizer, llg.LLMatcher.grammar_from_lark(grammar), log_level=0)
    return matcher.consume_tokens(tokens) and matcher.is_accepting() and not matcher.is_error()


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("parallel", [False, True])
def test_grammar_compiles_and_accepts_a_call(
    fmt: ToolFormat, parallel: bool, tokenizer: llg.LLTokenizer
) -> None:
    for choice in ("required", "get_weather"):
        grammar = fmt.grammar(TOOLS, choice, parallel)
        assert grammar is not None
        assert llg.LLMatcher.validate_grammar(llg.LLMatcher.grammar_from_lark(grammar)) == ""
        assert (
            llg.LLMatcher.validate_grammar(llg.LLMatcher.grammar_from_lark(grammar), tokenizer)
            == ""
        )
        text = call_text(fmt, "get_weather", {"city": "Paris"})
        assert accepts(tokenizer, grammar, list(text.encode()))
        assert fmt.parse(text)[1]  # what the grammar lets through parses as a call
        wrong_name = call_text(fmt, "get_stock", {"city": "Paris"})
        assert not accepts(tokenizer, grammar, list(wrong_name.encode()))
        wrong_type = call_text(fmt, "get_weather", {"city": 7})
        assert not accepts(tokenizer, grammar, list(wrong_type.encode()))
    two = call_text(fmt, "get_weather", {"city": "Paris"}, calls=2)
    assert (
        accepts(tokenizer, fmt.grammar(TOOLS, "required", parallel) or "", list(two.encode()))
        == parallel
    )


def test_generic_auto_grammar_accepts_a_response(tokenizer: llg.LLTokenizer) -> None:
    grammar = GenericFormat().grammar(TOOLS, "auto", parallel=True)
    assert grammar is not None
    assert accepts(tokenizer, grammar, list(b'{"response": "It is sunny."}'))
    assert not accepts(tokenizer, grammar, list(b"It is sunny."))


@pytest.mark.parametrize(
    ("fmt", "marker"),
    [(HermesFormat(), "<tool_call>"), (MistralFormat(), "[TOOL_CALLS]")],
    ids=["hermes", "mistral"],
)
def test_markers_that_are_special_tokens_are_named_by_id(
    fmt: ToolFormat, marker: str, tokenizer: llg.LLTokenizer
) -> None:
    ids = {s: 257 + i for i, s in enumerate(ByteTokenizer.SPECIAL)}
    assert marker in fmt.markers
    grammar = fmt.grammar(TOOLS, "required", parallel=False, special_tokens=ids)
    assert grammar is not None
    text = call_text(fmt, "get_weather", {"city": "Paris"})
    tokens = list(text.encode())
    as_special: list[int] = []
    i = 0
    while i < len(text):  # the markers as their tokens, the rest byte by byte
        hit = next((s for s in ByteTokenizer.SPECIAL if text.startswith(s, i)), None)
        as_special.append(ids[hit] if hit else ord(text[i]))
        i += len(hit) if hit else 1
    assert accepts(tokenizer, grammar, as_special)
    assert not accepts(tokenizer, grammar, tokens)  # spelled out, the marker is not the token


# --- the bounds of a forced call, and a forced answer cut short --------------------------------


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_parallel_calls_are_bounded(fmt: ToolFormat, tokenizer: llg.LLTokenizer) -> None:
    grammar = fmt.grammar(TOOLS, "required", parallel=True)
    assert grammar is not None
    for n, ok in ((MAX_PARALLEL_CALLS, True), (MAX_PARALLEL_CALLS + 1, False)):
        text = call_text(fmt, "get_weather", {"city": "Paris"}, calls=n)
        assert accepts(tokenizer, grammar, list(text.encode())) == ok


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_string_arguments_are_bounded(fmt: ToolFormat, tokenizer: llg.LLTokenizer) -> None:
    grammar = fmt.grammar(TOOLS, "get_weather", parallel=False)
    assert grammar is not None
    for n, ok in ((MAX_ARGUMENT_CHARS, True), (MAX_ARGUMENT_CHARS + 1, False)):
        text = call_text(fmt, "get_weather", {"city": "x" * n})
        assert accepts(tokenizer, grammar, list(text.encode())) == ok


def test_a_schemas_own_string_rules_are_kept() -> None:
    params = {
        "type": "object",
        "properties": {
            "short": {"type": "string", "maxLength": 5},
            "kind": {"type": "string", "enum": ["a", "b"]},
            "tags": {"type": "array", "items": {"type": ["string", "null"]}},
            "any": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        },
    }
    tool = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    schema = HermesFormat().call_schema(tool, "required", parallel=False)
    assert schema is not None
    props = schema["properties"]["arguments"]["properties"]
    assert props["short"] == {"type": "string", "maxLength": 5}
    assert props["kind"] == {"type": "string", "enum": ["a", "b"]}
    assert props["tags"]["items"]["maxLength"] == MAX_ARGUMENT_CHARS
    assert props["any"]["anyOf"][0]["maxLength"] == MAX_ARGUMENT_CHARS
    assert "maxLength" not in params["properties"]["tags"]["items"]  # the tool is not changed


CITY = "London, England"


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_a_forced_answer_cut_anywhere_is_calls_never_text(fmt: ToolFormat) -> None:
    text = call_text(fmt, "get_weather", {"city": CITY}, calls=2)
    for end in range(len(text) + 1):
        stream = fmt.stream()
        assert stream.push(text[:end]) == ""  # nothing of a forced call is shown as text
        content, calls = stream.finish(forced=True)
        assert content == "", end
        assert len(calls) <= 2 and all(c.name == "get_weather" for c in calls)
        assert all(c.complete for c in calls[:-1])
        for c in calls:
            args = json.loads(c.arguments)
            assert args == {} or CITY.startswith(args["city"]), (end, c)
            assert c.complete is False or args == {"city": CITY}
    whole = fmt.stream()
    whole.push(text)
    assert [c.complete for c in whole.finish(forced=True)[1]] == [True, True]


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_a_cut_call_keeps_what_it_wrote(fmt: ToolFormat) -> None:
    text = call_text(fmt, "get_weather", {"city": CITY}, calls=2)
    cut = text[: text.rindex(CITY) + len("London, Eng")]
    calls = fmt.cut_calls(cut)
    assert [(c.name, json.loads(c.arguments), c.complete) for c in calls] == [
        ("get_weather", {"city": CITY}, True),
        ("get_weather", {"city": "London, Eng"}, False),
    ]
    # A name not yet whole is no call.
    assert fmt.cut_calls(text[: text.index("get_wea") + 7]) == []


def test_a_cut_answer_that_was_not_forced_stays_text() -> None:
    stream = GenericFormat().stream()
    cut = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Lon'
    stream.push(cut)
    assert stream.finish() == (cut, [])
