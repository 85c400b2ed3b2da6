"""Chat templates run sandboxed: hostile templates fail with a message, never run code."""

from __future__ import annotations

import pytest

from engine.model.templates import ChatTemplate, ChatTemplateError

MSGS = [{"role": "user", "content": "hi"}]


def test_fallback_is_chatml() -> None:
    t = ChatTemplate(None)
    assert t.is_fallback
    assert t.render(MSGS) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_special_tokens_and_generation_prompt() -> None:
    t = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}"
        "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
        bos_token="<s>",
    )
    assert t.render(MSGS) == "<s>[user]hi[assistant]"
    assert t.render(MSGS, add_generation_prompt=False) == "<s>[user]hi"


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{% set x = cycler.__init__.__globals__.os.system('echo pwned') %}",
    ],
)
def test_sandbox_blocks_python_internals(source: str) -> None:
    t = ChatTemplate(source)
    with pytest.raises(ChatTemplateError) as exc:
        t.render(MSGS)
    assert "\n" not in str(exc.value)


def test_runaway_output_is_bounded() -> None:
    t = ChatTemplate("{% for i in range(99999) %}{{ 'x' * 99999 }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="absurdly long"):
        t.render(MSGS)


def test_raise_exception_from_template() -> None:
    t = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        t.render(MSGS)


def test_invalid_template_syntax() -> None:
    with pytest.raises(ChatTemplateError, match="invalid"):
        ChatTemplate("{% for %}")


def test_bad_roles_and_content() -> None:
    t = ChatTemplate(None)
    with pytest.raises(ChatTemplateError, match="role"):
        t.render([{"role": "wizard", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="text"):
        t.render([{"role": "user", "content": 42}])
