"""Reranking: /v1/rerank (and llama-server's other names for it) on a reranker GGUF.

The shape is llama-server's, which Jina's and Cohere's clients also read: the documents'
indexes and raw relevance scores, best first, cut to `top_n`; `return_documents` adds each
one's text as Jina and Cohere send it back. The pairs are scored by the model's `Embedder`
(engine.server.embeddings), on its own thread, so generation streams keep flowing.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.errors import EngineError
from engine.host.host import UNSET, Unset
from engine.server.embeddings import Embedder
from engine.server.engine_state import ServerState
from engine.server.errors import ApiError
from engine.server.parsing import read_json
from engine.server.protocol.embeddings import (
    RerankDocument,
    RerankList,
    RerankRequest,
    RerankResult,
)
from engine.server.protocol.parse import parse_body

# The routes llama-server answers reranking on.
RERANK_PATHS = ("/v1/rerank", "/v1/reranking", "/rerank", "/reranking")


class RerankRoutes:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def routes(self) -> list[Route]:
        return [Route(path, self.rerank, methods=["POST"]) for path in RERANK_PATHS]

    async def rerank(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(RerankRequest, body)
        keep: float | Unset = UNSET if req.ttl is None else float(req.ttl)
        loaded = await self.state.acquire(req.model, keep_s=keep, generate=False)
        embedder = loaded.embedder
        if embedder is None:
            raise ApiError(501, "embeddings and reranking are turned off on this server")
        if not embedder.is_reranker:
            raise ApiError(
                400,
                f"model {loaded.model_id!r} is not a reranking model (its file's pooling is "
                "not rank): name a reranker GGUF",
                code="model_not_supported",
                param="model",
            )
        scores = await run_rerank(embedder, req.query, req.documents)
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i][0])[: req.top_n]
        results: list[RerankResult] = []
        for i in ranked:
            result = RerankResult(index=i, relevance_score=scores[i][0])
            if req.return_documents:
                result.document = RerankDocument(text=req.documents[i])
            results.append(result)
        n_tokens = sum(n for _, n in scores)
        answer = RerankList(
            model=loaded.model_id,
            object="list",
            usage={"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            results=results,
        )
        return JSONResponse(answer.wire())


async def run_rerank(
    embedder: Embedder, query: str, documents: list[str]
) -> list[tuple[float, int]]:
    """Score on the embedder's own thread; a refusal (a pair too long) is a 400."""
    try:
        return await asyncio.get_running_loop().run_in_executor(
            embedder.executor, embedder.rerank, query, documents
        )
    except EngineError as e:
        raise ApiError(400, str(e), param="documents") from None
