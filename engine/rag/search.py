"""Finding a collection's chunks for a question: by keywords (FTS5, bm25 over the question's
content words), by meaning (cosine over the normalised vectors, exact, with numpy) and both
fused by weighted reciprocal rank."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from engine.rag.store import RagStore, StoredChunk, normalised

# Words as the unicode61 tokenizer sees them (letters and digits); everything else separates.
_WORD = re.compile(r"\w+", re.UNICODE)
MAX_QUERY_TERMS = 64
# English function words and question words: in a keyword query they match nearly every chunk,
# so bm25 would rank on them rather than on the words that say what the question is about.
STOP_WORDS = frozenset(
    """a about an and any are as at be been but by can could did do does doing for from get had
    has have how i if in into is it its me my of on or our should so some than that the
    their them then there these they this those to us was we were what when where which
    while who whom why will with would you your""".split()  # noqa: SIM905 (a list literal is 70 lines)
)
# Each list offers this many times `k` candidates to the fusion: a chunk ranked just below the
# cut in one list can still win when the other list ranks it high (deeper lists let chunks
# that both lists rank low outvote one list's top hits: benchmarks/rag_quality.py).
FUSION_DEPTH = 4
RRF_K = 60
# The vector list counts twice the keyword list: on questions in a user's words it is the
# better one, and keyword search (exact terms, identifiers) then lifts the chunks both agree on
# and finds what the vectors miss without pushing the vectors' first hits out of the top k.
# Tuned on benchmarks/data/rag_questions.json, checked on the held-out set beside it.
KEYWORD_WEIGHT = 1.0
VECTOR_WEIGHT = 2.0


@dataclass(frozen=True)
class Hit:
    chunk_id: int
    path: Path
    page: int | None
    heading: str | None
    start: int
    end: int
    text: str
    score: float  # higher is better; keyword: -bm25, vector: cosine, RRF
    keyword_rank: int | None = None  # 1-based rank in the keyword list, None if absent
    vector_rank: int | None = None


def query_terms(query: str, *, content_only: bool = False, fallback: bool = True) -> list[str]:
    """The distinct words of user text as the FTS5 tokenizer splits them. With `content_only`,
    stop words are left out; then text of stop words only gives them back with `fallback`, and
    nothing without."""
    terms: list[str] = []
    for word in _WORD.findall(query):
        w = word.replace("_", " ").strip()  # `\w` takes "_", the tokenizer does not
        if w and w not in terms:
            terms.append(w)
    if content_only:
        content = [t for t in terms if t.casefold() not in STOP_WORDS]
        terms = content or (terms if fallback else [])
    return terms[:MAX_QUERY_TERMS]


def _quoted(term: str) -> str:
    """One term as an FTS5 string: never an operator or a column filter."""
    return '"' + term.replace('"', '""') + '"'


def fts_expression(query: str, *, content_only: bool = False) -> str | None:
    """User text as a safe FTS5 expression: each word quoted (so no word is an operator or a
    column filter), the words ORed. With `content_only`, stop words are left out unless the
    text has nothing else. None when the text has no word at all."""
    terms = query_terms(query, content_only=content_only)
    return " OR ".join(_quoted(t) for t in terms) if terms else None


def informative(store: RagStore, terms: Sequence[str]) -> list[str]:
    """The terms that tell chunks apart: those in at most half of the index's chunks. FTS5
    floors the idf of a term in more than half of them at 1e-6, so a chunk that only such
    terms match scores about 0: it matched nothing that sets it apart. (At exactly half the
    idf is 0 too, but the term still splits the chunks in two: in a two-chunk index, a word of
    one of them is evidence.)"""
    if not terms:
        return []
    total, counts = store.match_counts([_quoted(t) for t in terms])
    return [t for t, n in zip(terms, counts, strict=True) if 2 * n <= total]


def keyword(
    store: RagStore, name: str, query: str, k: int, *, evidence_only: bool = False
) -> list[Hit]:
    """The best `k` chunks by bm25 over the query's content words: a question's "how do I"
    would otherwise match almost every chunk and rank long ones first. With `evidence_only`
    (the list a fusion ranks), only chunks with an informative content word are hits: a
    question of stop words, or of words in more than half the chunks, finds none."""
    if k <= 0:
        return []
    terms = query_terms(query, content_only=True, fallback=not evidence_only)
    if evidence_only:
        terms = informative(store, terms)
    if not terms:
        return []
    ranked = store.fts(name, " OR ".join(_quoted(t) for t in terms), k)
    chunks = store.chunks([cid for cid, _ in ranked])
    return [
        _hit(chunks[cid], -bm25, keyword_rank=rank)
        for rank, (cid, bm25) in enumerate(ranked, 1)
        if cid in chunks
    ]


def vector(store: RagStore, name: str, query_vector: Sequence[float], k: int) -> list[Hit]:
    vm = store.vectors(name)
    if k <= 0 or len(vm.chunk_ids) == 0:
        return []
    q = normalised(query_vector, vm.matrix.shape[1])
    scores = vm.matrix @ q
    k = min(k, len(scores))
    # The top k unordered in O(n), then only those sorted (ties by chunk id: stable results).
    top = np.argpartition(-scores, k - 1)[:k]
    top = top[np.lexsort((vm.chunk_ids[top], -scores[top]))]
    ids = [int(vm.chunk_ids[i]) for i in top]
    chunks = store.chunks(ids)
    return [
        _hit(chunks[cid], float(scores[i]), vector_rank=rank)
        for rank, (cid, i) in enumerate(zip(ids, top, strict=True), 1)
        if cid in chunks
    ]


def hybrid(
    store: RagStore,
    name: str,
    query: str,
    query_vector: Sequence[float],
    k: int,
    *,
    rrf_k: int = RRF_K,
    keyword_weight: float = KEYWORD_WEIGHT,
    vector_weight: float = VECTOR_WEIGHT,
) -> list[Hit]:
    """Weighted reciprocal rank fusion: each chunk scores the sum of weight / (rrf_k + rank)
    over the lists it is in. Ranks, not raw scores, are fused: bm25 and cosine are on
    unrelated scales. So only hits with evidence are ranked: a rank is worth the same
    whatever the score, and a keyword hit of uninformative words or a vector at 90 degrees
    or more from the question would outrank a true match that only the other list has."""
    if k <= 0:
        return []
    depth = k * FUSION_DEPTH
    by_keyword = keyword(store, name, query, depth, evidence_only=True)
    by_vector = [h for h in vector(store, name, query_vector, depth) if h.score > 0]
    fused: dict[int, Hit] = {}
    for h in by_keyword:
        fused[h.chunk_id] = replace(h, score=keyword_weight / (rrf_k + (h.keyword_rank or 0)))
    for h in by_vector:
        add = vector_weight / (rrf_k + (h.vector_rank or 0))
        old = fused.get(h.chunk_id)
        fused[h.chunk_id] = (
            replace(h, score=add)
            if old is None
            else replace(old, score=old.score + add, vector_rank=h.vector_rank)
        )
    return sorted(fused.values(), key=lambda h: (-h.score, h.chunk_id))[:k]


def _hit(
    c: StoredChunk, score: float, *, keyword_rank: int | None = None, vector_rank: int | None = None
) -> Hit:
    return Hit(
        c.id,
        c.path,
        c.page,
        c.heading,
        c.start,
        c.end,
        c.text,
        score,
        keyword_rank=keyword_rank,
        vector_rank=vector_rank,
    )
