"""/v1/embeddings and /v1/rerank: the request bodies and the answers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from engine.server.body_model import UNKNOWN, Body, NotHonoured, refuse, refuse_whole
from engine.server.protocol.base import EmbedInput, NonEmpty, Reply, Ttl

MAX_RERANK_DOCUMENTS = 1000  # Cohere's limit; each is one pair to score


class EmbeddingRequest(Body):
    model: str | None = None
    ttl: Ttl | None = None
    encoding_format: Literal["float", "base64"] | None = None
    input: EmbedInput
    dimensions: Annotated[Any, NotHonoured("vectors have the model's own length")] = None


class RerankDocument(Body):
    """A document as Jina and Cohere also send it."""

    text: str


def _documents(v: Any) -> list[str]:
    if not isinstance(v, list) or not v:
        raise refuse('must be a non-empty list of strings or {"text": ...} objects')
    for i, x in enumerate(v):
        for key in x if isinstance(x, dict) else ():
            if key != "text":
                raise refuse_whole(f"'documents[{i}].{key}' {UNKNOWN}")
    out = [x["text"] if isinstance(x, dict) and isinstance(x.get("text"), str) else x for x in v]
    if not all(isinstance(x, str) for x in out):
        raise refuse('must be a non-empty list of strings or {"text": ...} objects')
    if len(out) > MAX_RERANK_DOCUMENTS:
        raise refuse(f"takes at most {MAX_RERANK_DOCUMENTS} documents")
    return out


# The documents' texts, whichever way they were sent.
RerankDocuments = Annotated[
    list[str],
    BeforeValidator(
        _documents,
        json_schema_input_type=Annotated[
            list[str | RerankDocument], Field(min_length=1, max_length=MAX_RERANK_DOCUMENTS)
        ],
    ),
]


class RerankRequest(Body):
    """/v1/rerank, as llama-server, Jina and Cohere take it."""

    model: str | None = None
    ttl: Ttl | None = None
    query: NonEmpty
    documents: RerankDocuments
    top_n: Annotated[int, Field(ge=1, description="the best N only (default: all)")] | None = None
    return_documents: Annotated[
        bool | None, Field(description='each result carries its "document": {"text": ...}')
    ] = None


class Embedding(Reply):
    object: str
    index: int
    embedding: list[float] | str  # base64 of little-endian float32 with encoding_format


class EmbeddingList(Reply):
    object: str
    data: list[Embedding]
    model: str
    usage: dict[str, int]


class RerankResult(Reply):
    index: int  # the document's place in the request
    relevance_score: float  # the model's raw score: higher is more relevant
    document: RerankDocument | None = None  # with return_documents


class RerankList(Reply):
    """Results sorted by score, best first, cut to top_n."""

    model: str
    object: Literal["list"]
    usage: dict[str, int]
    results: list[RerankResult]
