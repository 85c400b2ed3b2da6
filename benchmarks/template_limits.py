"""How fast and how small the bounded template sandbox stops each hostile chat template of
tests/engine/test_template_limits.py, and what it costs a real template.

    .venv/bin/python benchmarks/template_limits.py

Time is measured without tracemalloc (it slows Python down two- to threefold); memory is the
tracemalloc peak of a second run.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.model.templates import ChatTemplate, ChatTemplateError
from tests.engine.test_template_limits import GEMMA3, HOSTILE, MSGS


def _stop(source: str) -> str:
    try:
        ChatTemplate(source).render(MSGS)
    except ChatTemplateError as e:
        return str(e)
    return "rendered"


def main() -> None:
    print("| template | stopped after | tracemalloc peak | message |\n|---|---|---|---|")
    for name, (source, _) in HOSTILE.items():
        t0 = time.perf_counter()
        message = _stop(source)
        elapsed = time.perf_counter() - t0
        tracemalloc.start()
        _stop(source)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"| {name} | {elapsed * 1000:.1f} ms | {peak / 1e6:.2f} MB | `{message}` |")

    messages = [
        {"role": ("user", "assistant")[i % 2], "content": f"m{i} " * 20} for i in range(1000)
    ]
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    before = plain.from_string(GEMMA3)
    bounded = ChatTemplate(GEMMA3, bos_token="<s>")
    for label, render in (
        (
            "plain sandbox",
            lambda: before.render(messages=messages, bos_token="<s>", add_generation_prompt=True),
        ),
        ("bounded sandbox", lambda: bounded.render(messages)),
    ):
        best = min(_timed(render) for _ in range(5))
        print(f"Gemma-3 template, 1000 messages, {label}: {best * 1000:.1f} ms")


def _timed(render: object) -> float:
    assert callable(render)
    t0 = time.perf_counter()
    render()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
