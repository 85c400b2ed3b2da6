"""Which passages go in a grounded prompt: rank order under a token budget (checked on the
whole block), the same chunk used once, numbering, the text the model reads, the figures the
user sees, line numbers from the file, and the stored shape read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.rag.grounding import (
    INSTRUCTIONS,
    Grounding,
    Source,
    approx_tokens,
    budget_for,
    ground,
    grounding_text,
    line_of,
)
from engine.rag.search import Hit
from tests.engine.rag.helpers import word_count


def hit(
    text: str,
    *,
    cid: int = 1,
    path: str = "/docs/guide.txt",
    start: int = 0,
    page: int | None = None,
    heading: str | None = None,
) -> Hit:
    return Hit(cid, Path(path), page, heading, start, start + len(text), text, 1.0)


HITS = [
    hit("alpha beta gamma", cid=1, path="/d/a.txt", start=0),
    hit("delta epsilon", cid=2, path="/d/b.pdf", start=10, page=4),
    hit("zeta eta theta iota", cid=3, path="/d/c.md", start=5, heading="Install"),
]


def test_everything_fits_numbered_in_rank_order() -> None:
    g = ground(HITS, word_count, 1000, collections=["docs"], line_numbers=False)
    assert [s.number for s in g.sources] == [1, 2, 3]
    assert [s.text for s in g.sources] == [h.text for h in HITS]
    assert g.text == (
        f"{INSTRUCTIONS}\n\n[1] a.txt\nalpha beta gamma\n\n[2] b.pdf, p. 4\ndelta epsilon"
        "\n\n[3] c.md, § Install\nzeta eta theta iota"
    )
    assert g.tokens == word_count(g.text) <= g.budget == 1000
    assert g.offered == 3 and g.collections == ("docs",)
    assert g.summary == f"Retrieval adds {g.tokens:,} tokens from 3 passages (budget 1,000)"
    assert [s.label for s in g.sources] == ["[1] a.txt", "[2] b.pdf, p. 4", "[3] c.md, § Install"]


def test_a_passage_that_does_not_fit_is_passed_over_for_a_shorter_one() -> None:
    base = word_count(INSTRUCTIONS)
    long = hit(" ".join(["word"] * 50), cid=9, path="/d/long.txt")
    short = hit("just three words", cid=8, path="/d/short.txt")
    budget = base + 10  # "[1] short.txt" + its text: 5 words
    g = ground([long, short], word_count, budget, line_numbers=False)
    assert [s.path for s in g.sources] == ["/d/short.txt"]
    assert g.sources[0].number == 1  # numbered as used, not as ranked
    assert g.tokens == base + 5 and g.offered == 2
    assert g.summary.endswith("(budget " + f"{budget:,}" + "); 1 more did not fit")


def test_budget_edges_exactly_full_and_one_short() -> None:
    one = [HITS[0]]
    need = word_count(grounding_text(ground(one, word_count, 10**6, line_numbers=False).sources))
    assert len(ground(one, word_count, need, line_numbers=False).sources) == 1
    short = ground(one, word_count, need - 1, line_numbers=False)
    assert short.sources == () and short.text == "" and short.tokens == 0
    assert "fits the budget" in short.summary and "not grounded" in short.summary
    assert ground(one, word_count, 0, line_numbers=False).sources == ()


def test_the_whole_block_is_counted_not_the_sum_of_its_parts() -> None:
    # A counter that charges for the joins between passages: a sum of the parts would
    # overrun the budget.
    def count(text: str) -> int:
        return word_count(text) + text.count("\n\n") * 3

    g = ground(HITS, count, 40, line_numbers=False)
    assert g.tokens == count(g.text) <= 40
    assert 0 < len(g.sources) < 3


def test_the_same_chunk_is_used_once() -> None:
    twice = [HITS[0], HITS[0], HITS[1]]
    # The same span of the same file from another collection (another chunk id).
    again = hit(HITS[1].text, cid=77, path="/d/b.pdf", start=10, page=4)
    g = ground([*twice, again], word_count, 1000, line_numbers=False)
    assert [s.path for s in g.sources] == ["/d/a.txt", "/d/b.pdf"]
    assert g.offered == 2


def test_no_hits_no_block() -> None:
    g = ground([], word_count, 500, collections=["notes"])
    assert g.sources == () and g.text == "" and g.tokens == 0 and g.offered == 0
    assert g.summary == "Nothing in notes matches the question: this answer is not grounded"
    blank = ground([hit("   ")], word_count, 500)
    assert blank.sources == ()


def test_budget_for_keeps_room_for_the_conversation_and_the_answer() -> None:
    assert budget_for(8192, 512, 100) == 2048  # a quarter of the context
    assert budget_for(8192, 512, 100, 0.5) == 4096
    assert budget_for(2048, 1024, 800) == 224  # what is left
    assert budget_for(2048, 1024, 1500) == 0  # no room at all: never negative


def test_approx_tokens_rounds_up() -> None:
    assert approx_tokens("") == 0
    assert approx_tokens("abc") == 1
    assert approx_tokens("x" * 35) == 10


def test_line_numbers_come_from_the_file_when_it_still_holds_the_passage(
    tmp_path: Path,
) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("first line\nsecond line\nthe passage is here\nlast\n", encoding="utf-8")
    start = f.read_text().index("the passage")
    assert line_of(f, start, "the passage is here") == 3
    assert line_of(f, 0, "first line") == 1
    assert line_of(f, start, "something else") is None  # the file changed since
    assert line_of(tmp_path / "gone.txt", 0, "x") is None
    assert line_of(tmp_path / "doc.pdf", 0, "x") is None  # extracted text: no lines
    g = ground([hit("the passage is here", path=str(f), start=start)], word_count, 100)
    assert g.sources[0].line == 3 and g.sources[0].label == "[1] notes.txt, line 3"


def test_the_stored_shape_reads_back_with_the_same_prompt_text() -> None:
    g = ground(HITS, word_count, 1000, collections=["docs"], line_numbers=False)
    back = Grounding.from_dict(g.to_dict())
    assert back == g  # the text is rebuilt from the sources: the same prompt


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ([], "must be an object"),
        ({"sources": "x"}, "must be a list"),
        ({"sources": [{"path": "a", "text": "t", "start": 0, "end": 1}]}, "whole numbers"),
        ({"sources": [{"number": 1, "start": 0, "end": 1, "text": "t"}]}, "a path and a text"),
        ({"sources": [{"number": True, "path": "a", "text": "", "start": 0, "end": 1}]}, "whole"),
    ],
)
def test_a_bad_stored_shape_is_one_line(bad: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Grounding.from_dict(bad)


def test_a_source_without_place_shows_its_file_name_only() -> None:
    s = Source(1, "/x/readme", None, None, 0, 4, None, "text")
    assert s.label == "[1] readme" and s.where == ""
