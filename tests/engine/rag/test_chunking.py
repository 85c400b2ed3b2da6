"""Chunks sized in tokens: exact spans, overlap, limits, sections kept, and linear speed."""

from __future__ import annotations

import itertools
from pathlib import Path
from pydoc_data.topics import topics

import pytest

from engine.rag.chunking import Chunk, chunk
from engine.rag.extract import Document, Section


def words(text: str) -> int:
    """A whitespace tokenizer: one token per word."""
    return len(text.split())


def document(*sections: tuple[str, int | None, str | None]) -> Document:
    parts, secs, offset = [], [], 0
    for text, page, heading in sections:
        if parts:
            parts.append("\n\n")
            offset += 2
        secs.append(Section(text, page, heading, offset))
        parts.append(text)
        offset += len(text)
    return Document(Path("doc.txt"), "".join(parts), secs)


def check(doc: Document, chunks: list[Chunk], max_tokens: int) -> None:
    for c in chunks:
        assert c.text.strip() and c.text == c.text.strip()
        assert doc.text[c.start : c.end] == c.text
        assert c.n_tokens == words(c.text) <= max_tokens


def test_short_section_is_one_chunk() -> None:
    doc = document(("One short paragraph.", None, None))
    assert chunk(doc, words) == [Chunk("One short paragraph.", None, None, 0, 20, 3)]


def test_chunks_respect_the_limit_and_overlap() -> None:
    sentences = [f"Sentence number {i} says a thing." for i in range(60)]  # 6 words each
    doc = document((" ".join(sentences), None, None))
    chunks = chunk(doc, words, max_tokens=40, overlap_tokens=12)
    check(doc, chunks, 40)
    assert len(chunks) > 5
    for a, b in itertools.pairwise(chunks):
        assert a.start < b.start < a.end  # overlapping and moving on
        shared = doc.text[b.start : a.end]
        assert shared.endswith("thing.") and words(shared) == 12  # two whole sentences
    # Every sentence is in some chunk.
    covered = "".join(doc.text[c.start : c.end] for c in chunks)
    assert all(s in covered for s in sentences)


def test_no_overlap_gives_a_partition_of_the_sentences() -> None:
    doc = document((" ".join(f"Word{i} a b c d." for i in range(50)), None, None))
    chunks = chunk(doc, words, max_tokens=20, overlap_tokens=0)
    check(doc, chunks, 20)
    assert all(a.end < b.start for a, b in itertools.pairwise(chunks))
    assert sum(c.n_tokens for c in chunks) == words(doc.text)


def test_chunks_end_at_paragraph_breaks_when_they_can() -> None:
    paragraph = " ".join(["This sentence has exactly six words."] * 4)  # 24 words
    doc = document(("\n\n".join([paragraph] * 6), None, None))
    chunks = chunk(doc, words, max_tokens=70, overlap_tokens=0)
    check(doc, chunks, 70)
    # Two paragraphs (48 words) fit; a third would not: each chunk is two whole paragraphs.
    assert [c.n_tokens for c in chunks] == [48, 48, 48]
    assert all(c.text.count("\n\n") == 1 for c in chunks)


def test_long_sentence_splits_at_words_and_a_long_word_in_pieces() -> None:
    doc = document((" ".join(f"w{i}" for i in range(95)) + " " + "x" * 50, None, None))
    chunks = chunk(doc, words, max_tokens=10, overlap_tokens=3)
    check(doc, chunks, 10)
    assert chunks[-1].text.endswith("x" * 50)

    def chars(text: str) -> int:  # a counter by which a 50-letter word is far too long
        return len(text.replace(" ", ""))

    long_word = document(("a" * 50, None, None))
    pieces = chunk(long_word, chars, max_tokens=8, overlap_tokens=0)
    assert "".join(c.text for c in pieces) == "a" * 50
    assert all(0 < c.n_tokens <= 8 for c in pieces)


def test_chunks_never_cross_sections_and_keep_page_and_heading() -> None:
    doc = document(
        ("Page one text. " * 30, 1, None),
        ("Install the app. " * 3, None, "Installation"),
        ("Page three text.", 3, "Appendix"),
    )
    chunks = chunk(doc, words, max_tokens=25, overlap_tokens=5)
    check(doc, chunks, 25)
    for c in chunks:
        section = next(s for s in doc.sections if s.start <= c.start < s.start + len(s.text))
        assert c.end <= section.start + len(section.text)
        assert (c.page, c.heading) == (section.page, section.heading)
    assert [(c.page, c.heading) for c in chunks[-2:]] == [
        (None, "Installation"),
        (3, "Appendix"),
    ]


def test_blank_sections_and_documents_give_no_chunks() -> None:
    assert chunk(Document(Path("e.txt"), "", []), words) == []
    doc = Document(Path("b.txt"), "  \n\n ", [Section("  \n\n ", None, None, 0)])
    assert chunk(doc, words) == []


def test_joined_text_is_recounted_when_the_tokenizer_is_not_additive() -> None:
    # A tokenizer that adds two special tokens per call, like [CLS] and [SEP].
    def with_specials(text: str) -> int:
        return len(text.split()) + 2

    doc = document((" ".join(f"S{i} one two." for i in range(40)), None, None))
    chunks = chunk(doc, with_specials, max_tokens=20, overlap_tokens=4)
    assert chunks and all(c.n_tokens == with_specials(c.text) <= 20 for c in chunks)


@pytest.mark.parametrize(("max_tokens", "overlap"), [(0, 0), (10, 10), (10, -1)])
def test_bad_limits_are_refused(max_tokens: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        chunk(document(("text", None, None)), words, max_tokens=max_tokens, overlap_tokens=overlap)


def test_python_reference_corpus_chunks_fast_and_linear() -> None:
    text = "\n\n".join(topics.values())  # about 460,000 characters nobody here wrote
    doc = Document(Path("reference.txt"), text, [Section(text, None, None, 0)])
    calls = 0

    def counting(t: str) -> int:
        nonlocal calls
        calls += 1
        return words(t)

    chunks = chunk(doc, counting)  # linear: counted in calls below, not timed
    check(doc, chunks, 200)
    assert calls < 4 * len(text.split()) // 10  # per sentence and chunk, not per word
    mean = sum(c.n_tokens for c in chunks) / len(chunks)
    assert 120 < mean <= 200  # chunks are filled, not cut short
    # Consecutive chunks overlap or touch: no text falls between them.
    assert all(not text[a.end : b.start].strip() for a, b in itertools.pairwise(chunks))
    assert sum(a.end > b.start for a, b in itertools.pairwise(chunks)) > len(chunks) // 2
