"""How well the document index finds the answer: recall@5 and MRR of keyword, vector and hybrid
(fused) search on labelled sets of questions about the Python language reference.

    .venv/bin/python benchmarks/rag_quality.py [--questions FILE [FILE...]] [--k 5]
        [--index FILE] [--json OUT] [--misses] [--rrf-k 60] [--keyword-weight W]
        [--vector-weight W]

The corpus is the language reference topics in the standard library (`pydoc_data.topics`),
each topic written to its own `<topic>.txt` file and indexed as one collection by the indexer
(its chunking, all-MiniLM-L6-v2 vectors). Each question in a set (by default
`benchmarks/data/rag_questions.json`, the set search was tuned on, and
`rag_questions_heldout.json`, written apart and not tuned on) lists the topics whose text
answers it; a question counts as found when one of the top k hits comes from one of those
topics' files, and its reciprocal rank is 1 / the rank of the first such hit (0 when none is
in the top k). With `--index FILE` the index is kept in FILE (the corpus beside it, in
`FILE.corpus/`) and the next run with the same model only checks it: the indexer finds every
file unchanged and embeds nothing. Prints the CPU model, the command and the numbers; exits
non-zero only on errors, never because of the numbers.
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
from engine.rag.search import (  # noqa: E402
    KEYWORD_WEIGHT,
    RRF_K,
    VECTOR_WEIGHT,
    Hit,
    hybrid,
    keyword,
    vector,
)
from engine.rag.store import RagStore  # noqa: E402
from engine.server.embeddings import Embedder  # noqa: E402
from engine.settings import LoadParams  # noqa: E402

DATA = REPO / "benchmarks" / "data"
DEFAULT_QUESTIONS = [DATA / "rag_questions.json", DATA / "rag_questions_heldout.json"]
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
    """One `<topic>.txt` file a topic (a file already holding its text is left alone, so a kept
    index finds it unchanged); returns the topic text by name."""
    from pydoc_data.topics import topics

    folder.mkdir(parents=True, exist_ok=True)
    for name, text in topics.items():
        path = folder / f"{name}.txt"
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
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
    ap.add_argument("--questions", type=Path, nargs="+", default=DEFAULT_QUESTIONS)
    ap.add_argument(
        "--index", type=Path, help="keep the index in this file and reuse it (same model)"
    )
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, help="write the numbers to this file")
    ap.add_argument("--misses", action="store_true", help="list the questions each search missed")
    ap.add_argument("--rrf-k", type=int, default=RRF_K, help="the fusion's rank constant")
    ap.add_argument("--keyword-weight", type=float, default=KEYWORD_WEIGHT)
    ap.add_argument("--vector-weight", type=float, default=VECTOR_WEIGHT)
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
        return [v for v, _ in embedder.embed_many(texts)]

    with tempfile.TemporaryDirectory() as tmp:
        db = args.index or Path(tmp) / "index.db"
        corpus = db.with_name(db.name + ".corpus").resolve()
        topics = write_corpus(corpus)
        sets = {path: load_questions(path, set(topics)) for path in args.questions}
        store = RagStore(db)
        try:
            dim = len(embed(["dimension"])[0])
            open_collection(store, corpus, model, dim)
            t0 = time.perf_counter()
            report = index_collection(store, COLLECTION, embed, count_tokens)
            chunks = store.counts(COLLECTION).chunks
            print(
                f"indexed {len(topics)} topic files ({report.added + report.updated} embedded, "
                f"{report.unchanged} unchanged), {chunks} chunks, in "
                f"{time.perf_counter() - t0:.0f} s ({model.load_info.n_threads} threads)"
            )
            if report.skipped:
                raise SystemExit(f"files skipped while indexing: {report.skipped}")
            fusion = Fusion(args.rrf_k, args.keyword_weight, args.vector_weight)
            print(
                f"fusion: rrf_k {fusion.rrf_k}, weights keyword {fusion.keyword_weight:g}, "
                f"vector {fusion.vector_weight:g}"
            )
            results = {
                path.name: evaluate(store, questions, embed, args.k, fusion)
                for path, questions in sets.items()
            }
        finally:
            store.close()

    out: dict[str, object] = {
        "topics": len(topics),
        "chunks": chunks,
        "k": args.k,
        "fusion": {
            "rrf_k": args.rrf_k,
            "keyword_weight": args.keyword_weight,
            "vector_weight": args.vector_weight,
        },
    }
    for path, questions in sets.items():
        scores, misses = results[path.name]
        labelled = {t for q in questions for t in q.topics}
        print(
            f"{path.name}: {len(questions)} questions labelled with {len(labelled)} of the "
            f"{len(topics)} topics, k={args.k}"
        )
        print(f"  {'search':8s} {'recall@' + str(args.k):>9s} {'MRR':>6s}")
        for kind in KINDS:
            s = scores[kind]
            print(f"  {kind:8s} {s.recall:9.3f} {s.mrr:6.3f}   ({s.found}/{len(questions)})")
        if args.misses:
            for kind in KINDS:
                print(f"  missed by {kind}:")
                for q in misses[kind]:
                    print(f"    {q.text}  [{', '.join(sorted(q.topics))}]")
        out[path.name] = {
            "questions": len(questions),
            "topics_labelled": len(labelled),
            **{
                kind: {"recall": s.recall, "mrr": s.mrr, "found": s.found}
                for kind, s in scores.items()
            },
        }
    return out


def open_collection(store: RagStore, corpus: Path, model: Model, dim: int) -> None:
    """The benchmark's collection over `corpus`: made if missing; kept if it was embedded by
    this model file, else emptied so every file is embedded again."""
    model_path = str(Path(model.path).resolve())
    if COLLECTION not in {c.name for c in store.collections()}:
        store.create_collection(
            COLLECTION, [corpus], model_name=Path(model.path).stem, model_path=model_path, dim=dim
        )
        return
    col = store.collection(COLLECTION)
    if col.model_path != model_path or col.dim != dim:
        print(f"the kept index was made with {col.model_path}: embedding it again")
        store.set_model(
            COLLECTION, model_name=Path(model.path).stem, model_path=model_path, dim=dim
        )
    if col.roots != (corpus,):
        store.set_roots(COLLECTION, [corpus])


@dataclass(frozen=True)
class Fusion:
    """The hybrid search's settings (engine.rag.search's defaults unless given)."""

    rrf_k: int = RRF_K
    keyword_weight: float = KEYWORD_WEIGHT
    vector_weight: float = VECTOR_WEIGHT


def evaluate(
    store: RagStore,
    questions: Sequence[Question],
    embed: Callable[[list[str]], list[list[float]]],
    k: int,
    fusion: Fusion | None = None,
) -> tuple[dict[str, Score], dict[str, list[Question]]]:
    """Each kind's score over the questions, and the questions each kind missed."""
    scores = {kind: Score() for kind in KINDS}
    misses: dict[str, list[Question]] = {kind: [] for kind in KINDS}
    f = fusion or Fusion()
    vectors = embed([q.text for q in questions])
    for q, qv in zip(questions, vectors, strict=True):
        ranks = {
            "keyword": first_relevant(keyword(store, COLLECTION, q.text, k), q.topics),
            "vector": first_relevant(vector(store, COLLECTION, qv, k), q.topics),
            "hybrid": first_relevant(
                hybrid(
                    store,
                    COLLECTION,
                    q.text,
                    qv,
                    k,
                    rrf_k=f.rrf_k,
                    keyword_weight=f.keyword_weight,
                    vector_weight=f.vector_weight,
                ),
                q.topics,
            ),
        }
        for kind, rank in ranks.items():
            scores[kind].add(rank)
            if rank is None:
                misses[kind].append(q)
    return scores, misses


if __name__ == "__main__":
    main()
