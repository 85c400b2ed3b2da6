"""What a request says about a model's thinking, on the real SmolLM2 behind a Qwen3-style
template (its `enable_thinking` switch; thinking on, its generation prompt opens the block, so
SmolLM2 "thinks" until something closes it): `chat_template_kwargs` reach the template, and
a reasoning budget (the server's --reasoning-budget, OpenAI's reasoning_effort) ends the
thinking after its tokens with the answer following, through the official clients."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from engine.host.runtime import Model
from engine.model.templates import ChatTemplate
from engine.server import ServedModel, ServerConfig, ServerState, ServerThread
from engine.server.anthropic_routes import _plan_args
from engine.server.protocol.anthropic import AnthropicMessagesRequest
from engine.server.protocol.parse import parse_body
from engine.settings import LoadParams
from tests.engine.server.conftest import assert_no_leak

# Qwen3's switch, as its template writes it (thinking off: an empty block before the answer);
# thinking on, the block is opened for the model, as DeepSeek-R1 distills' templates do. A
# `persona`, when given, becomes a system line: any variable reaches the template.
QWEN3_STYLE = (
    "{% if persona is defined %}{{ '<|im_start|>system\\nYou are ' + persona + '.<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)
BUDGET = 10  # the server's --reasoning-budget
MAX = 40
STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def thinker(smollm2_path: Path) -> Iterator[tuple[ServedModel, ServerThread]]:
    model = Model(smollm2_path, LoadParams(n_ctx=1024, n_threads=2))
    model.template = ChatTemplate(
        QWEN3_STYLE, bos_token=model.template.bos_token, eos_token=model.template.eos_token
    )
    loaded = ServedModel.build(model, "thinker", max_queue=4, embeddings=False)
    config = ServerConfig(port=0, model_id="thinker", max_tokens_cap=64, reasoning_budget=BUDGET)
    state = ServerState(config)
    state.set_loaded(loaded)
    with ServerThread(state) as srv:
        yield loaded, srv
    loaded.close()
    model.close()


@pytest.fixture(scope="module")
def client(thinker: tuple[ServedModel, ServerThread]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=thinker[1].url + "/v1", api_key="none", timeout=120, max_retries=0
    ) as c:
        yield c


@contextlib.contextmanager
def swapped(model: Model, source: str) -> Iterator[None]:
    """The model behind another chat template for a while (this module's own model)."""
    plain = model.template
    model.template = ChatTemplate(source, bos_token=plain.bos_token, eos_token=plain.eos_token)
    try:
        yield
    finally:
        model.template = plain


def ask(client: openai.OpenAI, **extra: Any) -> tuple[str, str, int, int]:
    """(reasoning, content, completion tokens, reasoning tokens) of a greedy story."""
    r = client.chat.completions.create(
        model="thinker",
        messages=STORY,
        temperature=0,
        max_tokens=MAX,
        extra_body=extra,  # type: ignore[arg-type]
    )
    m = r.choices[0].message
    assert r.usage is not None and r.usage.completion_tokens_details is not None
    reasoning = getattr(m, "reasoning_content", None) or ""
    return (
        reasoning,
        m.content or "",
        r.usage.completion_tokens,
        r.usage.completion_tokens_details.reasoning_tokens or 0,
    )


def forced_tokens(srv: ServerThread, message: str = "") -> int:
    """The tokens the budget forces: its message, the close marker on its line and a blank
    line."""
    text = message + "\n</think>\n\n"
    r = httpx.post(srv.url + "/tokenize", json={"content": text}, timeout=30)
    return len(r.json()["tokens"])


def test_the_budget_ends_the_thinking_and_the_answer_follows(
    thinker: tuple[ServedModel, ServerThread], client: openai.OpenAI
) -> None:
    # No limit: SmolLM2 never closes the block, every token is thinking.
    reasoning, content, n, thought = ask(client, reasoning_effort="xhigh")
    assert reasoning and not content and thought == n == MAX
    # The server's budget: the block closes after BUDGET tokens (its close forced), and the
    # model goes on with an answer.
    reasoning, content, n, thought = ask(client)
    assert reasoning and content.strip()
    assert BUDGET < thought <= BUDGET + forced_tokens(thinker[1]) and n == MAX
    assert "</think>" not in content
    # The same, streamed, through the model's own tokens: the thinking comes first, whole.
    parts: list[tuple[str, str]] = []
    for chunk in client.chat.completions.create(
        model="thinker",
        messages=STORY,
        temperature=0,
        max_tokens=MAX,
        stream=True,  # type: ignore[arg-type]
    ):
        if chunk.choices:
            d = chunk.choices[0].delta
            if getattr(d, "reasoning_content", None):
                parts.append(("reasoning", d.reasoning_content))  # type: ignore[attr-defined]
            if d.content:
                parts.append(("content", d.content))
    kinds = [k for k, _ in parts]
    assert kinds[0] == "reasoning" and "content" in kinds
    assert "reasoning" not in kinds[kinds.index("content") :]
    assert "".join(t for k, t in parts if k == "reasoning") == reasoning
    assert "".join(t for k, t in parts if k == "content") == content
    assert_no_leak(thinker[0])


def test_llama_servers_per_request_budget(
    thinker: tuple[ServedModel, ServerThread], client: openai.OpenAI
) -> None:
    srv = thinker[1]
    reasoning, content, _, thought = ask(
        client, reasoning_budget_tokens=4, reasoning_budget_message=" Enough."
    )
    assert reasoning.endswith("Enough.") and content.strip()
    assert 4 < thought <= 4 + forced_tokens(srv, " Enough.")
    # llama-server's other name; -1 is the server's budget.
    assert ask(client, thinking_budget_tokens=4)[3] <= 4 + forced_tokens(srv)
    assert ask(client, reasoning_budget_tokens=-1) == ask(client)
    # 0 is no thinking: the template's switch, as llama-server's --reasoning-budget 0.
    off = ask(client, chat_template_kwargs={"enable_thinking": False})
    assert ask(client, reasoning_budget_tokens=0) == off


def test_budget_zero_closes_a_block_the_template_always_opens(
    thinker: tuple[ServedModel, ServerThread], client: openai.OpenAI
) -> None:
    """A template without the switch (DeepSeek-R1 distills') opens the block anyway: budget
    0 closes it at once, and everything after is the answer."""
    always = QWEN3_STYLE.replace("enable_thinking is defined and enable_thinking is false", "0")
    with swapped(thinker[0].model, always):
        reasoning, content, _, thought = ask(client, reasoning_budget_tokens=0)
    assert not reasoning and content.strip() and 0 < thought <= forced_tokens(thinker[1])


def test_effort_goes_to_a_template_that_reads_it(
    thinker: tuple[ServedModel, ServerThread], client: openai.OpenAI
) -> None:
    """As llama-server does: gpt-oss's template reads `reasoning_effort` itself; the
    server's budget still holds."""
    reads = (
        "{% if reasoning_effort is defined %}{{ '<|im_start|>system\\nReasoning: ' + "
        "reasoning_effort + '<|im_end|>\\n' }}{% endif %}" + QWEN3_STYLE
    )
    with swapped(thinker[0].model, reads):

        def prompt_tokens(**extra: Any) -> tuple[int, int]:
            r = client.chat.completions.create(
                model="thinker",
                messages=STORY,  # type: ignore[arg-type]
                temperature=0,
                max_tokens=MAX,
                extra_body=extra,
            )
            assert r.usage is not None and r.usage.completion_tokens_details is not None
            return r.usage.prompt_tokens, r.usage.completion_tokens_details.reasoning_tokens or 0

        without, _ = prompt_tokens()
        with_effort, thought = prompt_tokens(reasoning_effort="high")
        assert with_effort > without
        assert BUDGET < thought <= BUDGET + forced_tokens(thinker[1])


def test_effort_none_and_enable_thinking_false_ask_for_no_thinking(client: openai.OpenAI) -> None:
    off = ask(client, chat_template_kwargs={"enable_thinking": False})
    assert off[0] == "" and off[1].strip() and off[3] == 0
    # reasoning_effort "none" is a budget of 0: the template is asked not to think, as
    # llama-server does with --reasoning-budget 0, so the same prompt and the same answer.
    assert ask(client, reasoning_effort="none") == off


def test_ollama_answers_within_the_servers_budget(
    thinker: tuple[ServedModel, ServerThread],
) -> None:
    with ollama.Client(host=thinker[1].url, timeout=120) as oc:
        r = oc.chat(
            model="thinker",
            messages=STORY,
            stream=False,
            options={"temperature": 0, "num_predict": MAX},
        )
    assert r.message.thinking and r.message.content and r.message.content.strip()


def test_template_kwargs_reach_the_template(thinker: tuple[ServedModel, ServerThread]) -> None:
    url = thinker[1].url + "/apply-template"
    body: dict[str, Any] = {"messages": STORY}
    plain = httpx.post(url, json=body, timeout=30).json()["prompt"]
    # The server's budget would not turn thinking off; its template opens the block.
    assert plain.endswith("<|im_start|>assistant\n<think>\n")
    kw = {"enable_thinking": False, "persona": "a pirate"}
    prompt = httpx.post(url, json={**body, "chat_template_kwargs": kw}, timeout=30).json()
    assert prompt["prompt"].startswith("<|im_start|>system\nYou are a pirate.<|im_end|>")
    assert prompt["prompt"].endswith("<think>\n\n</think>\n\n")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ("no", "'chat_template_kwargs' must be an object"),
        ({"enable_thinking": "no"}, "'enable_thinking' must be true or false"),
        ({"messages": []}, "cannot set 'messages'"),
        ({"add_generation_prompt": False}, "cannot set 'add_generation_prompt'"),
        ({"not a name": 1}, "not a template variable's name"),
    ],
)
def test_bad_template_kwargs_are_refused_by_name(
    client: openai.OpenAI, thinker: tuple[ServedModel, ServerThread], kwargs: Any, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, chat_template_kwargs=kwargs)
    assert says in str(e.value) and "chat_template_kwargs" in str(e.value)
    r = httpx.post(
        thinker[1].url + "/apply-template",
        json={"messages": STORY, "chat_template_kwargs": kwargs},
        timeout=30,
    )
    assert r.status_code == 400 and says in r.text


def test_bad_reasoning_effort_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        ask(client, reasoning_effort="extreme")


def test_anthropic_budget_is_the_plans() -> None:
    """Anthropic's budget_tokens is the reply's budget (its figures need 1024 tokens of
    thinking at least: the decode is the same as above)."""
    req = parse_body(
        AnthropicMessagesRequest,
        {
            "max_tokens": 2048,
            "messages": STORY,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        },
    )
    assert _plan_args(req, ())["budget"] == 1024
