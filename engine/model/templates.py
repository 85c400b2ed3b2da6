"""Chat templates: the model's own Jinja template from its GGUF metadata, rendered safely.

A chat template is code shipped inside a downloaded file, so it runs in a bounded Jinja
sandbox (`engine/model/template_sandbox.py`): no attribute access to Python internals, no mutation
of our objects, and bounds on time, recursion and the size of what it builds. Models without
a template fall back to ChatML, which most instruction-tuned models of the last years
understand.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import TemplateError

from engine.model.template_sandbox import BoundedSandbox, TemplateLimitError, bounded_render

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MAX_RENDERED_CHARS = 8_000_000
VALID_ROLES = frozenset({"system", "user", "assistant", "tool"})


class ChatTemplateError(ValueError):
    """The template could not be rendered; `str()` is a one-line message."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"the model's chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template with the model's special tokens bound in."""

    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.is_fallback = not source
        self.source = source or CHATML_TEMPLATE
        env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(self.source)
        except TemplateError as e:
            raise ChatTemplateError(f"the model's chat template is invalid: {e}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        for m in messages:
            if m.get("role") not in VALID_ROLES:
                raise ChatTemplateError(f"unknown message role {m.get('role')!r}")
            content = m.get("content")
            if not isinstance(content, str) and not (content is None and m.get("tool_calls")):
                raise ChatTemplateError("message content must be text")
        # A tool-calling turn may have no text; templates test and concatenate `content`, so
        # it reaches them as "", as llama-server passes it.
        rendered = [{**m, "content": m.get("content") or ""} for m in messages]
        try:
            parts: list[str] = []
            total = 0
            # Stream the output so a hostile template cannot build gigabytes before we look.
            chars = sum(len(m["content"]) + len(str(m.get("tool_calls") or "")) for m in rendered)
            with bounded_render(len(messages), chars):
                for chunk in self._template.generate(
                    messages=rendered,
                    add_generation_prompt=add_generation_prompt,
                    bos_token=self.bos_token,
                    eos_token=self.eos_token,
                    **extra,
                ):
                    total += len(chunk)
                    if total > MAX_RENDERED_CHARS:
                        raise ChatTemplateError(
                            "the model's chat template produced an absurdly long prompt"
                        )
                    parts.append(chunk)
        except ChatTemplateError:
            raise
        except TemplateLimitError as e:
            raise ChatTemplateError(f"the model's chat template {e}") from None
        except RecursionError:
            raise ChatTemplateError("the model's chat template recursed too deeply") from None
        except Exception as e:  # sandbox violations, type errors inside the template
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ChatTemplateError(f"the model's chat template failed: {msg}") from None
        return "".join(parts)
