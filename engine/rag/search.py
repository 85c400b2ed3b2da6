"""Finding a collection's chunks for a question: by keywords (FTS5, bm25), by meaning (cosine
over the normalised vectors, exact, with numpy) and both fused by reciprocal rank."""

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
# Each list offers this many times `k` candidates to the fusion: a chunk ranked just below the
# cut in one list can still win when the other list ranks it high.
FUSION_DEPTH = 4


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


def fts_expression(query: str) -> str | None:
    """User text as a safe FTS5 expression: each word quoted (so no word is an operator or a
    column filter), the words ORed. None when the text has no word at all."""
    terms: list[str] = []
    for word in _WORD.findall(query):
        w = word.replace("_", " ").strip()  # `\w` takes "_", the tokenizer does not
        if w and w not in terms:
            terms.append(w)
    if not terms:
        return None
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms[:MAX_QUERY_TERMS])


def keyword(store: RagStore, name: str, query: str, k: int) -> list[Hit]:
    expression = fts_expression(query)
    if expression is None or k <= 0:
        return []
    ranked = store.fts(name, expression, k)
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
    rrf_k: int = 60,
) -> list[Hit]:
    """Reciprocal rank fusion: each chunk scores the sum of 1 / (rrf_k + rank) over the lists
    it is in. Ranks, not raw scores, are fused: bm25 and cosine are on unrelated scales."""
    if k <= 0:
        return []
    depth = k * FUSION_DEPTH
    by_keyword = keyword(store, name, query, depth)
    by_vector = vector(store, name, query_vector, depth)
    fused: dict[int, Hit] = {}
    for h in by_keyword:
        fused[h.chunk_id] = replace(h, score=1.0 / (rrf_k + (h.keyword_rank or 0)))
    for h in by_vector:
        add = 1.0 / (rrf_k + (h.vector_rank or 0))
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
