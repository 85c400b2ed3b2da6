"""The sentences a voice speaks of a streamed answer: the same however it was cut into
deltas, each given as soon as it is complete, and only its prose."""

from __future__ import annotations

import random

import pytest

from engine.speech.sentences import SentenceSplitter


def speak(text: str, cuts: list[int] | None = None, **kw: object) -> list[str]:
    """The sentences of `text` fed in pieces cut at `cuts` (every character when None)."""
    splitter = SentenceSplitter(**kw)  # type: ignore[arg-type]
    bounds = list(range(1, len(text))) if cuts is None else sorted(cuts)
    out: list[str] = []
    start = 0
    for end in [*bounds, len(text)]:
        out += splitter.feed(text[start:end])
        start = end
    return out + splitter.flush()


def assert_every_split(text: str, expected: list[str], *, three: bool = False) -> None:
    """Whole, character by character, at every single cut (and every pair of cuts)."""
    assert speak(text, []) == expected
    assert speak(text) == expected
    for i in range(1, len(text)):
        assert speak(text, [i]) == expected, f"cut at {i}: {text[:i]!r}|{text[i:]!r}"
    if three:
        for i in range(1, len(text)):
            for j in range(i + 1, len(text)):
                assert speak(text, [i, j]) == expected, f"cuts at {i}, {j}"


ANSWER = """<think>The user wants a summary. Keep it short.</think>

# Getting started

Dr. Smith measured 3.14 cm, e.g. about pi. See [the guide](https://example.com/a) and **the
notes** [1]. Visit https://example.com/page. Then call `make_it()` once.

```python
print("Not spoken. Ever.")
```

- First *item*
- Second item here[^2]
1. Numbered one

| Name | Size |
|------|------|
| tiny | 1 MB |

[^2]: A footnote. Not spoken.
---
> Quoted words.

The end"""

SPOKEN = [
    "Getting started",
    "Dr. Smith measured 3.14 cm, e.g. about pi.",
    "See the guide and the notes.",
    "Visit.",
    "Then call once.",
    "First item",
    "Second item here",
    "Numbered one",
    "Name, Size",
    "tiny, 1 MB",
    "Quoted words.",
    "The end",
]


def test_an_answer_is_spoken_as_its_prose_however_it_was_cut() -> None:
    assert_every_split(ANSWER, SPOKEN)


def test_random_cuts_into_many_deltas_give_the_same_sentences() -> None:
    rng = random.Random(42)
    for _ in range(200):
        cuts = rng.sample(range(1, len(ANSWER)), rng.randint(2, 40))
        assert speak(ANSWER, cuts) == SPOKEN


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hi there. How are you? Fine!", ["Hi there.", "How are you?", "Fine!"]),
        ("Pi is 3.14159 roughly. Yes.", ["Pi is 3.14159 roughly.", "Yes."]),
        ("Ask Dr. Who and Mr. Smith. Done.", ["Ask Dr. Who and Mr. Smith.", "Done."]),
        (
            "Use tools, e.g. a hammer, i.e. this. Ok.",
            ["Use tools, e.g. a hammer, i.e. this.", "Ok."],
        ),
        ("See No. 5 now. I said no. Then left.", ["See No. 5 now.", "I said no.", "Then left."]),
        ("J. R. R. Tolkien wrote it. Yes.", ["J. R. R. Tolkien wrote it.", "Yes."]),
        ("It costs approx. five euros. Ok.", ["It costs approx. five euros.", "Ok."]),
        ('He said "Stop." Then left.', ['He said "Stop."', "Then left."]),
        ("Wait... what? No.", ["Wait... what?", "No."]),
        ("Born in the U.S. Then moved.", ["Born in the U.S. Then moved."]),
        ("こんにちは。元気ですか\uff1fはい。", ["こんにちは。", "元気ですか\uff1f", "はい。"]),
    ],
)
def test_sentence_ends(text: str, expected: list[str]) -> None:
    assert_every_split(text, expected, three=True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Use `x = 1.5. y` here. Done.", ["Use here.", "Done."]),
        ("Use ``a ` b`` here.", ["Use here."]),
        ("An unclosed ` tick here.", ["An unclosed tick here."]),
        ("Some *italic*, __bold__ and ~~gone~~ words.", ["Some italic, bold and gone words."]),
        ("Keep snake_case_names and 2 * 3 here.", ["Keep snake_case_names and 2 * 3 here."]),
        ("A [link **bold**](http://a.b/c) here.", ["A link bold here."]),
        ("A [ref link][ref] here.", ["A ref link here."]),
        ("Cited [1, 2] and [3-5] and [^note].", ["Cited and and."]),
        ("An image ![alt text](pic.png) here.", ["An image here."]),
        ("Mail <me@example.com> or <https://x.y> now.", ["Mail or now."]),
        ("Line<br>break and <b>bold</b>.", ["Linebreak and bold."]),
        ("Is 1 < 2? Yes.", ["Is 1 < 2?", "Yes."]),
        ("See www.example.com, then (https://x.y/z) go.", ["See, then go."]),
        ("A bracket [unclosed here.", ["A bracket unclosed here."]),
    ],
)
def test_inline_marks_code_links_and_citations(text: str, expected: list[str]) -> None:
    assert_every_split(text, expected, three=True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("## Title\nBody text.", ["Title", "Body text."]),
        ("#hashtag text.", ["#hashtag text."]),
        ("- a\n- b\n\n* c\n+ d", ["a", "b", "c", "d"]),
        ("1. one\n2) two\n12 apples.", ["one", "two 12 apples."]),
        ("A line\ncontinued here.", ["A line continued here."]),
        ("Before.\n***\n- - -\n___\nAfter.", ["Before.", "After."]),
        ("-5 degrees.\n--flag works.", ["-5 degrees.", "--flag works."]),
        ("> quoted\n> > nested.", ["quoted", "nested."]),
        ("[label]: https://x.y\nText.", ["Text."]),
        ("[Link](u) starts it.", ["Link starts it."]),
        ("Code:\n~~~\nx. Y.\n```\nstill code.\n~~~~\nAfter.", ["Code:", "After."]),
        ("````md\n```\ninner. Yes.\n```\n````\nOut.", ["Out."]),
        ("Open fence\n```\nnever closed. Really.", ["Open fence"]),
        ("  ```\n  indented fence.\n  ```\nText.", ["Text."]),
    ],
)
def test_lines(text: str, expected: list[str]) -> None:
    assert_every_split(text, expected, three=True)


@pytest.mark.parametrize(
    ("text", "expected", "kw"),
    [
        ("<think>a. b.</think>Answer.", ["Answer."], {}),
        ("  \n<think>\nHidden.\n</think>\n\nShown.", ["Shown."], {}),
        ("[THINK]x. Y.[/THINK]Shown.", ["Shown."], {}),
        ("<seed:think>x.</seed:think>Shown.", ["Shown."], {}),
        ("Hidden. Text.</think>Shown.", ["Shown."], {"in_thinking": True}),
        ("<think>never closed. At all.", [], {}),
        ("<thinking is text.", ["<thinking is text."], {}),
        ("Later <think>is text.</think>", ["Later is text."], {}),
    ],
)
def test_thinking_at_the_start_is_left_out(
    text: str, expected: list[str], kw: dict[str, bool]
) -> None:
    assert speak(text, [], **kw) == expected
    assert speak(text, None, **kw) == expected
    for i in range(1, len(text)):
        assert speak(text, [i], **kw) == expected


def test_a_long_sentence_is_cut_at_a_clause_and_the_first_soonest() -> None:
    first = "This opening sentence keeps going, and going on for quite a while, well past "
    first += "the point where speech should begin, so it is cut at a clause."
    later = "Then a second one " + "with many words " * 8 + "ends here."
    got = speak(f"{first} {later}", [])
    assert got[0] == "This opening sentence keeps going, and going on for quite a while,"
    assert got[1].startswith("well past the point")
    assert all(len(s) <= 201 for s in got)
    assert " ".join(got) == f"{first} {later}"  # nothing lost, nothing added
    assert_every_split(f"{first} {later}", got)


def test_a_long_run_without_clauses_is_cut_at_a_word() -> None:
    text = "word " * 60
    got = speak(text, [], max_chars=50, first_max_chars=30, min_chars=10)
    assert " ".join(got) == text.strip()
    assert all(len(s) <= 50 for s in got)
    assert len(got[0]) <= 30


def test_a_sentence_is_given_as_soon_as_the_next_word_is_read() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("First one") == []
    assert splitter.feed(". Sec") == []  # "Sec" may still become a URL, which is not spoken
    assert splitter.feed("ond ") == ["First one."]  # a capital: a new sentence
    assert splitter.feed("one.\n") == []
    assert splitter.feed("\n") == ["Second one."]  # a blank line ends the paragraph
    assert splitter.feed("- item") == []
    assert splitter.feed("\n- ") == []  # "- - -" would be a rule
    assert splitter.feed("next") == ["item"]  # the next item starts
    assert splitter.flush() == ["next"]


def test_code_open_across_deltas_is_never_spoken() -> None:
    splitter = SentenceSplitter()
    said = splitter.feed("Here:\n``")
    said += splitter.feed("`py\nx = 1. Print it.\n")
    said += splitter.feed("more. Code.\n``")
    said += splitter.feed("`\nBack to prose.")
    assert said + splitter.flush() == ["Here:", "Back to prose."]


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="min_chars"):
        SentenceSplitter(min_chars=500)
