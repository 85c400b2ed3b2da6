"""How the chat view cuts Markdown into blocks it can re-render one at a time."""

from __future__ import annotations

from app.ui.chat_view import Segment, format_stats, split_markdown
from engine.host.stats import GenerationStats


def test_paragraphs_and_code_blocks() -> None:
    text = "One\nline two\n\nTwo\n\n```python\nx = 1\n\ny = 2\n```\n\nEnd"
    assert split_markdown(text) == [
        Segment("text", "One\nline two"),
        Segment("text", "Two"),
        Segment("code", "x = 1\n\ny = 2", "python"),  # blank lines inside code stay inside
        Segment("text", "End"),
    ]


def test_unclosed_fence_is_code_to_the_end() -> None:
    # A reply still streaming: the code block is shown as code before its fence closes.
    assert split_markdown("See:\n\n```\nprint(1)") == [
        Segment("text", "See:"),
        Segment("code", "print(1)", ""),
    ]


def test_loose_list_stays_one_block() -> None:
    # Cut at its blank lines, a numbered list would restart its numbering in each block.
    segs = split_markdown("1. a\n\n2. b\n\n3. c")
    assert len(segs) == 1 and segs[0].kind == "text"
    assert segs[0].text.startswith("1. a") and segs[0].text.rstrip().endswith("3. c")


def test_tilde_fence_and_nested_backticks() -> None:
    assert split_markdown("~~~\n```\ninner\n```\n~~~") == [Segment("code", "```\ninner\n```", "")]


def test_stats_footer_text() -> None:
    st = GenerationStats(ttft_s=0.1234, gen_tps=118.04, gen_tokens=87, stop_reason="cancelled")
    assert format_stats(st) == "TTFT 0.12 s · 118.0 tok/s · 87 tokens · stopped"
    st.stop_reason = "stop"
    assert format_stats(st) == "TTFT 0.12 s · 118.0 tok/s · 87 tokens"
