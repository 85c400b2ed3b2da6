"""Search over hand-made chunks with the hashed bag-of-words embedder: keyword (bm25) with any
user text made a safe FTS5 expression, exact cosine, and reciprocal rank fusion of the two."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.rag.search import (
    KEYWORD_WEIGHT,
    STOP_WORDS,
    VECTOR_WEIGHT,
    fts_expression,
    hybrid,
    keyword,
    vector,
)
from engine.rag.store import RagStore
from tests.engine.rag.helpers import DIM, NOTES, SALAD, bow_vector, found, make_chunks

FILES = {
    "cooking.txt": [
        "Boil the pasta in salted water for nine minutes.",
        "A risotto needs arborio rice and patience.",
    ],
    "garden.txt": [
        "Water the tomatoes in the morning, not at noon.",
        "Prune the roses after the last frost.",
    ],
    "café.md": ["Le café crème se sert le matin.", "Espresso: nine bars of pressure."],
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RagStore]:
    with RagStore(tmp_path / "index.db") as s:
        s.create_collection("home", [tmp_path], model_name="fake", model_path="fake", dim=DIM)
        s.create_collection("other", [tmp_path], model_name="fake", model_path="fake", dim=DIM)
        for name, texts in FILES.items():
            s.replace_file(
                "home",
                found(tmp_path / name),
                name,
                make_chunks(texts),
                [bow_vector(t) for t in texts],
            )
        s.replace_file(
            "other",
            found(tmp_path / "x.txt"),
            "x",
            make_chunks(["pasta in another collection"]),
            [bow_vector("pasta in another collection")],
        )
        yield s


@pytest.mark.parametrize(
    "text",
    [
        'pasta"',
        '"',
        "NEAR(a b)",
        "a AND",
        "OR OR",
        "title:pasta",
        "-pasta",
        "pas*",
        "^pasta",
        "(unbalanced",
        "x' OR 1=1 --",
        "{col}: q",
        "\x00nul",
        "foo_bar",
        "ÉLAN",
        "a" * 5000,
    ],
)
def test_no_user_text_is_an_fts_syntax_error(store: RagStore, text: str) -> None:
    keyword(store, "home", text, 5)  # raises on a syntax error


def test_fts_expressions() -> None:
    assert fts_expression('Boil "pasta" OR NOT') == '"Boil" OR "pasta" OR "OR" OR "NOT"'
    assert fts_expression("foo_bar") == '"foo bar"'
    assert fts_expression("  ?! ") is None
    assert fts_expression("a a a") == '"a"'


def test_keyword_ranks_by_bm25_within_the_collection(tmp_path: Path, store: RagStore) -> None:
    hits = keyword(store, "home", "pasta water", 10)
    assert [h.text for h in hits[:1]] == ["Boil the pasta in salted water for nine minutes."]
    assert {h.path.name for h in hits} == {"cooking.txt", "garden.txt"}  # not "other"
    assert [h.keyword_rank for h in hits] == list(range(1, len(hits) + 1))
    assert all(h.vector_rank is None for h in hits)
    assert hits == sorted(hits, key=lambda h: -h.score)
    top = hits[0]
    assert (top.start, top.end) == (0, len(top.text)) and top.path == tmp_path / "cooking.txt"
    assert keyword(store, "home", "?!", 5) == [] and keyword(store, "home", "pasta", 0) == []


def test_keyword_folds_case_and_diacritics(store: RagStore) -> None:
    assert [h.path.name for h in keyword(store, "home", "CAFE creme", 5)] == ["café.md"]


def test_vector_is_exact_cosine(store: RagStore) -> None:
    query = "prune the roses"
    hits = vector(store, "home", bow_vector(query), 3)
    assert hits[0].text == "Prune the roses after the last frost."
    assert [h.vector_rank for h in hits] == [1, 2, 3]
    assert hits[0].score == pytest.approx(
        float(
            sum(
                a * b
                for a, b in zip(
                    _unit(bow_vector(query)), _unit(bow_vector(hits[0].text)), strict=True
                )
            )
        ),
        abs=1e-5,
    )
    assert len(vector(store, "home", bow_vector(query), 100)) == 6


def test_hybrid_fuses_ranks(store: RagStore) -> None:
    # "nine" is a keyword of two chunks; the vector of "espresso pressure" points to one.
    hits = hybrid(store, "home", "nine", bow_vector("espresso pressure"), 3, rrf_k=60)
    top = hits[0]
    assert top.text == "Espresso: nine bars of pressure."
    assert top.keyword_rank is not None and top.vector_rank == 1
    assert top.score == pytest.approx(KEYWORD_WEIGHT / (60 + top.keyword_rank) + VECTOR_WEIGHT / 61)
    assert len(hits) == 3 and hits == sorted(hits, key=lambda h: -h.score)
    # With no keyword match the fusion is the vector list's order.
    only = hybrid(store, "home", "zzz", bow_vector("risotto rice water"), 2)
    assert [h.vector_rank for h in only] == [1, 2]
    assert all(h.keyword_rank is None for h in only)
    # A chunk that shares no word with the question (cosine 0) is no hit.
    assert [h.text for h in hybrid(store, "home", "zzz", bow_vector("risotto"), 5)] == [
        "A risotto needs arborio rice and patience."
    ]


def test_the_vector_list_outweighs_the_keyword_list(store: RagStore) -> None:
    # Each list's first hit is not among the other's candidates: the weights decide.
    query, meaning = "pressure", bow_vector("risotto rice patience")
    assert [h.text for h in keyword(store, "home", query, 1)] == [
        "Espresso: nine bars of pressure."
    ]
    top = hybrid(store, "home", query, meaning, 1)[0]
    assert top.text == "A risotto needs arborio rice and patience." and top.keyword_rank is None
    assert top.score == pytest.approx(VECTOR_WEIGHT / 61)
    flipped = hybrid(store, "home", query, meaning, 1, keyword_weight=3.0, vector_weight=1.0)
    assert flipped[0].text == "Espresso: nine bars of pressure."
    assert flipped[0].score == pytest.approx(3.0 / 61)


def test_keyword_search_ranks_on_the_content_words(store: RagStore) -> None:
    # "the", "in", "how" are in most chunks; only "pasta" says what the question is about.
    hits = keyword(store, "home", "How do I cook the pasta in the water?", 10)
    assert hits[0].path.name == "cooking.txt"
    assert fts_expression("how do I cook the pasta", content_only=True) == '"cook" OR "pasta"'
    # Nothing but stop words: they are all there is to search with.
    assert fts_expression("what is the", content_only=True) == '"what" OR "is" OR "the"'
    assert STOP_WORDS.isdisjoint({"pasta", "nine", "slots", "nonlocal", "yield"})


def test_an_empty_collection_finds_nothing(tmp_path: Path) -> None:
    with RagStore(tmp_path / "e.db") as s:
        s.create_collection("empty", [], model_name="m", model_path="p", dim=DIM)
        assert vector(s, "empty", bow_vector("x"), 5) == []
        assert hybrid(s, "empty", "x", bow_vector("x"), 5) == []


def _unit(v: list[float]) -> list[float]:
    n = sum(x * x for x in v) ** 0.5
    return [x / n for x in v]


def _axis(i: int, tilt: float = 0.0) -> list[float]:
    """A unit vector at cosine `tilt` from axis 0, in the plane of axes 0 and i."""
    v = [0.0] * DIM
    v[0], v[i] = tilt, (1.0 - tilt * tilt) ** 0.5
    return v


@pytest.fixture
def notes(tmp_path: Path) -> Iterator[RagStore]:
    # The question points along axis 0; the vectors are MiniLM's cosines from the issue.
    vectors = {"garden.txt": 0.494, "harbour.md": 0.068, "station.txt": -0.05}
    with RagStore(tmp_path / "notes.db") as s:
        s.create_collection("notes", [tmp_path], model_name="m", model_path="p", dim=DIM)
        for i, (name, text) in enumerate(NOTES.items(), 1):
            s.replace_file(
                "notes",
                found(tmp_path / name),
                name,
                make_chunks([text]),
                [_axis(i, vectors[name])],
            )
        yield s


def test_a_keyword_hit_without_evidence_does_not_outrank_a_vector_match(notes: RagStore) -> None:
    question = _axis(10, 1.0)
    # Keyword search on its own still lists what the words match, at a score of about 0.
    matched = keyword(notes, "notes", SALAD, 5)
    assert {h.path.name for h in matched} == {"harbour.md", "station.txt"}
    assert all(abs(h.score) < 1e-4 for h in matched)
    # The fusion ranks only evidence: the meaning's first hit comes first, and the note at
    # more than 90 degrees from the question is no hit at all.
    hits = hybrid(notes, "notes", SALAD, question, 5)
    assert [h.path.name for h in hits] == ["garden.txt", "harbour.md"]
    assert all(h.keyword_rank is None for h in hits)
    assert hits[0].score == pytest.approx(VECTOR_WEIGHT / 61)


def test_an_informative_word_still_counts_in_the_fusion(notes: RagStore) -> None:
    # "ferry" is in one note of three: bm25 weighs it, and the fusion lifts that note.
    hits = hybrid(notes, "notes", "What happened to the ferry?", _axis(10, 1.0), 5)
    assert hits[0].path.name == "harbour.md" and hits[0].keyword_rank == 1
    assert keyword(notes, "notes", "ferry leaves", 5, evidence_only=True)[0].path.name == (
        "harbour.md"
    )


def test_a_question_of_stop_words_has_no_keyword_evidence(notes: RagStore) -> None:
    assert [h.path.name for h in keyword(notes, "notes", "what is the", 5)] != []
    assert keyword(notes, "notes", "what is the", 5, evidence_only=True) == []
    hits = hybrid(notes, "notes", "what is the", _axis(10, 1.0), 5)
    assert [h.keyword_rank for h in hits] == [None, None]
