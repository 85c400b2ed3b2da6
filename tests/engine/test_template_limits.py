"""Hostile chat templates are stopped in bounded time and memory with a one-line message, and
real templates render exactly as plain Jinja renders them."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.model import template_sandbox
from engine.model.gguf import read_gguf
from engine.model.templates import ChatTemplate, ChatTemplateError

MSGS = [{"role": "user", "content": "hi"}]
P = "the model's chat template "
TOO_LONG = P + "tried to build a text of 1,000,000,000 characters (the limit is 8,000,000)"
STEPS = P + "ran more than 50,500 steps"  # the base budget plus one message's share


def _unsafe(attr: str, kind: str) -> str:
    return P + f"failed: access to attribute '{attr}' of '{kind}' object is unsafe"


HOSTILE: dict[str, tuple[str, str]] = {
    "nested range() loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        STEPS,
    ),
    "a huge range()": (
        "{% for i in range(10**10) %}{% endfor %}",
        P + "tried to build a range() of 10,000,000,000 items (the limit is 100,000)",
    ),
    "|join of a huge range()": (
        "{{ range(10**9)|join(',') }}",
        P + "tried to build a range() of 1,000,000,000 items (the limit is 100,000)",
    ),
    "a recursive macro": (
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
        P + "recursed too deeply",
    ),
    "a macro calling itself twice": (
        "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(60) }}",
        STEPS,
    ),
    "a recursive loop": (
        "{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}",
        P + "recursed too deeply",
    ),
    "'x' * 10**9": ("{{ 'x' * 10**9 }}", TOO_LONG),
    "|center(10**9)": ("{{ 'x'|center(1000000000) }}", TOO_LONG),
    ".ljust(10**9)": ("{{ 'x'.ljust(1000000000) }}", TOO_LONG),
    "a printf width": (
        "{{ '%0999999999d' % 1 }}",
        P + "tried to build a formatted field of 999,999,999 characters (the limit is 8,000,000)",
    ),
    "a format width": (
        "{{ '{:>999999999}'.format('x') }}",
        P + "tried to build a formatted field of 999,999,999 characters (the limit is 8,000,000)",
    ),
    "doubling with +": (
        "{% set ns = namespace(s='x') %}{% for i in range(100) %}"
        "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
        P + "tried to build a text of 8,388,608 characters (the limit is 8,000,000)",
    ),
    "doubling with ~": (
        "{% set ns = namespace(s='x') %}{% for i in range(100) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        P + "tried to build a text of 8,388,608 characters (the limit is 8,000,000)",
    ),
    "a list nesting itself": (
        "{% set ns = namespace(l=['x']) %}{% for i in range(100) %}"
        "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
        P + "tried to build a text of 13,107,840 characters (the limit is 8,000,000)",
    ),
    "a list times 10**5": (
        "{{ (range(100000)|list) * 100000 }}",
        P + "tried to build a list of 10,000,000,000 items (the limit is 100,000)",
    ),
    "many large texts joined": (
        "{{ range(100000)|map('string')|map('center', 100000)|join }}",
        P + "tried to build a text of 8,100,000 characters (the limit is 8,000,000)",
    ),
    "|replace growing the text": (
        "{{ ('x' * 100000)|replace('x', 'x' * 100000) }}",
        P + "tried to build a text of 10,000,000,000 characters (the limit is 8,000,000)",
    ),
    "|batch filling 10**9 items": (
        "{{ [1]|batch(10**9, 0)|list }}",
        P + "tried to build a batch of 1,000,000,000 items (the limit is 100,000)",
    ),
    "a huge number": ("{{ 2**100000 }}", P + "tried to build a number of more than 4096 bits"),
    "text repeated inside {% set %}": (
        "{% set x %}{% for i in range(100000) %}" + "a" * 1000 + "{% endfor %}{% endset %}",
        P + "built more than 32,000,032 characters",
    ),
    "|urlize of a long text": (
        "{{ ('x ' * 1000000)|urlize }}",
        P + "gave |urlize a text of 2,000,000 characters (the limit is 100,000)",
    ),
    "().__class__.__mro__": ("{{ ().__class__.__mro__ }}", _unsafe("__class__", "tuple")),
    "cycler.__init__.__globals__": (
        "{{ cycler.__init__.__globals__ }}",
        _unsafe("__init__", "type"),
    ),
    "self._TemplateReference__context": (
        "{{ self._TemplateReference__context }}",
        _unsafe("_TemplateReference__context", "TemplateReference"),
    ),
    "a format field reaching __class__": (
        "{{ '{0.__class__}'.format(1) }}",
        _unsafe("__class__", "int"),
    ),
    "lipsum(10**6)": ("{{ lipsum(10**6) }}", P + "failed: 'lipsum' is undefined"),
}


def _render(source: str) -> str:
    with pytest.raises(ChatTemplateError) as exc:
        ChatTemplate(source).render(MSGS)
    return str(exc.value)


@pytest.mark.parametrize(("source", "message"), HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_template_is_stopped_with_its_message(
    source: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The deadline is a backstop whose reason depends on the machine's speed; here each case
    # must be stopped by the bound it tests.
    # The message names the bound that stopped it (a wall-clock check would flake when busy).
    monkeypatch.setattr(template_sandbox, "MAX_SECONDS", 30.0)
    assert _render(source) == message


@pytest.mark.parametrize("source", [s for s, _ in HOSTILE.values()], ids=HOSTILE.keys())
def test_hostile_template_stays_small(source: str) -> None:
    tracemalloc.start()
    try:
        message = _render(source)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message.startswith(P) and "\n" not in message
    assert peak < 16_000_000


def test_deadline_stops_a_slow_template(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_sandbox, "MAX_SECONDS", 0.05)
    monkeypatch.setattr(template_sandbox, "STEPS_BASE", 10**9)
    assert _render(HOSTILE["nested range() loops"][0]) == P + "ran longer than 0.05 s"


# Gemma-3's published chat template (its tokenizer_config); the Gemma-3-270M test file
# carries none, so it falls back to ChatML there.
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# What real templates use beyond the two above: namespaces, loop state, macros, tojson,
# filters over attributes, ~, % formatting, str methods, slicing, recursive loops.
FEATURES = """{%- set ns = namespace(sys='', n=0) -%}
{%- macro wrap(role, text) -%}<|{{ role }}|>{{ text }}</|{{ role }}|>{%- endmacro -%}
{%- for m in messages if m.role != 'tool' -%}
{%- set ns.n = ns.n + 1 -%}
{{ wrap(m.role, m.content.split('</think>')[-1].lstrip('\\n') ~ '#' ~ loop.index) }}
{%- if loop.last %} last of {{ loop.length }}, {{ '%03d|%-4s|' % (ns.n, m.role) }}{% endif %}
{%- endfor -%}
{{ tools|tojson }}{{ tools|map(attribute='name')|join(', ') }}
{{ tools|selectattr('name', 'equalto', 'b')|list|length }}{{ '{:>6}'.format('r') }}
{%- for t in tree recursive %}[{{ t.name }}{{ loop(t.kids) if t.kids }}]{%- endfor -%}
{{ (messages|length * 2) ** 2 }}{{ range(3)|list }}{{ 'ab' * 3 }}{{ [1, 2] + [3] }}
{{ 'x'|center(9) }}{{ 'a\\nb'|indent(2) }}{{ [1, 2, 3]|sum }}{{ ' p '|trim|upper }}
{%- if add_generation_prompt %}<|assistant|>{% endif -%}
"""
TOOLS = [{"name": "a", "parameters": {"x": "é"}}, {"name": "b", "parameters": {}}]
TREE = [{"name": "r", "kids": [{"name": "c", "kids": []}]}]
CONVERSATIONS: list[list[dict[str, Any]]] = [
    MSGS,
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>hm</think>\n\nHello!"},
        {"role": "user", "content": " a\nb  " + "é" * 50},
    ],
    [
        {"role": "user", "content": "x" * 200_000},
        {"role": "assistant", "content": "y"},
        {"role": "user", "content": "z"},
    ],
]


def _plain_jinja(source: str, messages: list[dict[str, Any]], generation: bool) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    return env.from_string(source).render(
        messages=messages,
        add_generation_prompt=generation,
        bos_token="<s>",
        eos_token="</s>",
        tools=TOOLS,
        tree=TREE,
    )


def _same_as_jinja(source: str) -> None:
    t = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    for messages in CONVERSATIONS:
        for generation in (True, False):
            expected = _plain_jinja(source, messages, generation)
            assert (
                t.render(messages, add_generation_prompt=generation, tools=TOOLS, tree=TREE)
                == expected
            )


def test_smollm2_template_renders_as_jinja_does(smollm2_path: Path) -> None:
    source = read_gguf(smollm2_path).metadata["tokenizer.chat_template"]
    assert isinstance(source, str)
    _same_as_jinja(source)


def test_gemma3_template_renders_as_jinja_does() -> None:
    _same_as_jinja(GEMMA3)


def test_template_features_render_as_jinja_does() -> None:
    _same_as_jinja(FEATURES)
    assert "last of 4, 004|user|" in ChatTemplate(FEATURES).render(
        CONVERSATIONS[1], tools=TOOLS, tree=TREE
    )


def test_long_conversation_stays_inside_the_budgets() -> None:
    messages = [
        {"role": ("user", "assistant")[i % 2], "content": f"turn {i} " * 20} for i in range(5000)
    ]
    # Past the deadline or a budget the render raises, so rendering at all is the check.
    text = ChatTemplate(GEMMA3, bos_token="<s>").render(messages)
    assert text.count("<start_of_turn>") == 5001
