"""How well the document index finds the answer: recall@5 and MRR of keyword, vector and hybrid
(fused) search on a labelled set of questions about the Python language reference.

    .venv/bin/python benchmarks/rag_quality.py [--questions FILE] [--k 5] [--json OUT]

The corpus is the language reference topics in the standard library (`pydoc_data.topics`),
each topic written to its own `<topic>.txt` file and indexed as one collection by the indexer
(its chunking, all-MiniLM-L6-v2 vectors). Each question in `benchmarks/data/rag_questions.json`
lists the topics whose text answers it; a question counts as found when one of the top k hits
comes from one of those topics' files, and its reciprocal rank is 1 / the rank of the first
such hit (0 when none is in the top k). Prints the CPU model, the command and the numbers;
exits non-zero only on errors, never because of the numbers.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.rag_search import model_path  # noqa: E402
from engine.bench.hw import cpu_name  # noqa: E402
from engine.host.runtime import Model  # noqa: E402
from engine.rag.indexer import index_collection  # noqa: E402
from engine.rag.search import Hit, hybrid, keyword, vector  # noqa: E402
from engine.rag.store import RagStore  # noqa: E402
from engine.server.embeddings import Embedder  # noqa: E402
from engine.settings import LoadParams  # noqa: E402

DEFAULT_QUESTIONS = REPO / "benchmarks" / "data" / "rag_questions.json"
COLLECTION = "reference"
KINDS = ("keyword", "vector", "hybrid")


@dataclass(frozen=True)
class Question:
    text: str
    topics: frozenset[str]


@dataclass
class Score:
    """Recall@k and MRR of one kind of search, accumulated question by question."""

    found: int = 0
    reciprocal_ranks: list[float] = field(default_factory=list)

    def add(self, rank: int | None) -> None:
        self.found += rank is not None
        self.reciprocal_ranks.append(0.0 if rank is None else 1.0 / rank)

    @property
    def recall(self) -> float:
        return self.found / len(self.reciprocal_ranks) if self.reciprocal_ranks else 0.0

    @property
    def mrr(self) -> float:
        rr = self.reciprocal_ranks
        return sum(rr) / len(rr) if rr else 0.0


def load_questions(path: Path, known_topics: set[str]) -> list[Question]:
    raw = json.loads(path.read_text(encoding="utf-8"))
    questions = [Question(str(item["q"]), frozenset(item["topics"])) for item in raw]
    unknown = {t for q in questions for t in q.topics} - known_topics
    if unknown:
        raise SystemExit(f"{path}: topics not in the corpus: {', '.join(sorted(unknown))}")
    return questions


def write_corpus(folder: Path) -> dict[str, str]:
    """One `<topic>.txt` file a topic; returns the topic text by name."""
    from pydoc_data.topics import topics

    for name, text in topics.items():
        (folder / f"{name}.txt").write_text(text, encoding="utf-8")
    return dict(topics)


def first_relevant(hits: Sequence[Hit], topics: frozenset[str]) -> int | None:
    """The 1-based rank of the first hit from one of the topics' files."""
    for rank, h in enumerate(hits, 1):
        if h.path.stem in topics:
            return rank
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="the embedding GGUF (default: the tests' MiniLM)")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, help="write the numbers to this file")
    ap.add_argument("--misses", action="store_true", help="list the questions hybrid missed")
    args = ap.parse_args()
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv])
    print(f"CPU: {cpu_name()}")
    print(f"command: {command}")

    path = model_path(args.model)
    params = LoadParams(n_ctx=512, **({"n_threads": args.threads} if args.threads else {}))
    with Model(path, params) as model:
        embedder = Embedder(model)
        try:
            result = run(args, model, embedder)
        finally:
            embedder.close()
    result = {"command": command, "cpu": cpu_name(), **result}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


def run(args: argparse.Namespace, model: Model, embedder: Embedder) -> dict[str, object]:
    def count_tokens(text: str) -> int:
        return len(model.tokenize(text, add_special=True, parse_special=False))

    def embed(texts: list[str]) -> list[list[float]]:
        return [embedder.embed(t)[0] for t in texts]

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        topics = write_corpus(corpus)
        questions = load_questions(args.questions, set(topics))
        store = RagStore(Path(tmp) / "index.db")
        try:
            dim = len(embedder.embed("dimension")[0])
            store.create_collection(
                COLLECTION,
                [corpus],
                model_name=Path(model.path).stem,
                model_path=str(model.path),
                dim=dim,
            )
            t0 = time.perf_counter()
            report = index_collection(store, COLLECTION, embed, count_tokens)
            chunks = store.counts(COLLECTION).chunks
            print(
                f"indexed {len(topics)} topic files, {chunks} chunks, in "
                f"{time.perf_counter() - t0:.0f} s ({model.load_info.n_threads} threads)"
            )
            if report.skipped:
                raise SystemExit(f"files skipped while indexing: {report.skipped}")
            scores, misses = evaluate(store, questions, embed, args.k)
        finally:
            store.close()

    labelled = {t for q in questions for t in q.topics}
    print(
        f"{len(questions)} questions labelled with {len(labelled)} of the {len(topics)} topics, "
        f"k={args.k}"
    )
    print(f"  {'search':8s} {'recall@' + str(args.k):>9s} {'MRR':>6s}")
    for kind in KINDS:
        s = scores[kind]
        print(f"  {kind:8s} {s.recall:9.3f} {s.mrr:6.3f}   ({s.found}/{len(questions)})")
    if args.misses:
        print("missed by hybrid:")
        for q in misses:
            print(f"  {q.text}  [{', '.join(sorted(q.topics))}]")
    return {
        "questions": len(questions),
        "topics": len(topics),
        "topics_labelled": len(labelled),
        "chunks": chunks,
        "k": args.k,
        **{
            kind: {"recall": s.recall, "mrr": s.mrr, "found": s.found} for kind, s in scores.items()
        },
    }


def evaluate(
    store: RagStore,
    questions: Sequence[Question],
    embed: Callable[[list[str]], list[list[float]]],
    k: int,
) -> tuple[dict[str, Score], list[Question]]:
    """Each kind's score over the questions, and the questions hybrid search missed."""
    scores = {kind: Score() for kind in KINDS}
    misses: list[Question] = []
    for q in questions:
        qv = embed([q.text])[0]
        ranks = {
            "keyword": first_relevant(keyword(store, COLLECTION, q.text, k), q.topics),
            "vector": first_relevant(vector(store, COLLECTION, qv, k), q.topics),
            "hybrid": first_relevant(hybrid(store, COLLECTION, q.text, qv, k), q.topics),
        }
        for kind, rank in ranks.items():
            scores[kind].add(rank)
        if ranks["hybrid"] is None:
            misses.append(q)
    return scores, misses


if __name__ == "__main__":
    main()
