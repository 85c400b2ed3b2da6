"""How fast the document index is: chunks embedded per second with all-MiniLM-L6-v2 (one at a
time and batched, `Embedder.embed_many`), and the latency of keyword, vector and hybrid search
over a store of 10,000 chunks.

    .venv/bin/python benchmarks/rag_search.py [--chunks 10000] [--embed 100] [--queries 200]
        [--rounds 3] [--batch-tokens N]

The chunks are real text: the Python language reference topics (`pydoc_data.topics`), chunked
with the model's tokenizer and repeated with variations (words swapped, sentences rotated)
until there are enough. Their vectors are random unit vectors (embedding 10,000 chunks on a
CPU takes minutes and a brute-force search costs the same for any values); the queries are
embedded by the model. Prints the CPU model, then the numbers.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.bench.hw import cpu_name  # noqa: E402
from engine.host.runtime import Model  # noqa: E402
from engine.rag.chunking import Chunk, chunk  # noqa: E402
from engine.rag.extract import Document, Section  # noqa: E402
from engine.rag.files import Found  # noqa: E402
from engine.rag.search import hybrid, keyword, vector  # noqa: E402
from engine.rag.store import RagStore  # noqa: E402
from engine.server.embeddings import Embedder  # noqa: E402
from engine.settings import LoadParams  # noqa: E402

MODELS = REPO / ".artifacts" / "models"  # the tests' models: the default embedding model too
CHUNKS_PER_FILE = 20


def model_path(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    from app.services.default_embedding import DefaultEmbedding

    return DefaultEmbedding(MODELS).ensure()


def base_chunks(count_tokens: Callable[[str], int]) -> list[Chunk]:
    from pydoc_data.topics import topics

    out: list[Chunk] = []
    for name in sorted(topics):
        text = topics[name]
        out.extend(chunk(Document(Path(name), text, [Section(text, None, name, 0)]), count_tokens))
    return out


def variant(text: str, rng: random.Random) -> str:
    """The same prose, shuffled a little: its sentences rotated, two words swapped."""
    sentences = text.split(". ")
    k = rng.randrange(len(sentences))
    words = ". ".join(sentences[k:] + sentences[:k]).split(" ")
    if len(words) > 2:
        i, j = rng.randrange(len(words)), rng.randrange(len(words))
        words[i], words[j] = words[j], words[i]
    return " ".join(words)


def percentiles(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p50 = statistics.median(ms)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return f"p50 {p50:7.2f} ms   p95 {p95:7.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="the embedding GGUF (default: the tests' MiniLM)")
    ap.add_argument("--chunks", type=int, default=10_000)
    ap.add_argument("--embed", type=int, default=100, help="chunks to embed for the rate")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3, help="embedding rounds (best is kept)")
    ap.add_argument(
        "--batch-tokens", type=int, default=None, help="tokens a batched decode (the context)"
    )
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    print(f"CPU: {cpu_name()}")

    path = model_path(args.model)
    params = LoadParams(n_ctx=512, **({"n_threads": args.threads} if args.threads else {}))
    with Model(path, params) as model:
        embedder = Embedder(model, batch_tokens=args.batch_tokens)
        try:
            run(args, model, embedder)
        finally:
            embedder.close()


def run(args: argparse.Namespace, model: Model, embedder: Embedder) -> None:
    def count_tokens(text: str) -> int:
        return len(model.tokenize(text, add_special=True, parse_special=False))

    rng = random.Random(7)
    t0 = time.perf_counter()
    base = base_chunks(count_tokens)
    print(
        f"chunked the {len(base)} chunks of the language reference in "
        f"{time.perf_counter() - t0:.2f} s"
    )

    sample = [c.text for c in rng.sample(base, min(args.embed, len(base)))]
    queries = [" ".join(rng.sample(t.split(), min(8, len(t.split())))) for t in sample]
    embedder.embed_many(["warm up", "the batched context too"])
    print(
        f"embedding ({model.load_info.n_threads} threads; batched: up to "
        f"{embedder.batch_tokens} tokens and {embedder.max_sequences} inputs a decode):"
    )
    for label, texts in (("chunks", sample), ("short queries", queries)):
        # Alternated, best of the rounds: on a shared CPU the other work changes every second.
        rates: dict[str, list[float]] = {"one at a time": [], "batched": []}
        for _ in range(args.rounds):
            for mode, rate in rates.items():
                t0 = time.perf_counter()
                if mode == "batched":
                    tokens = sum(n for _, n in embedder.embed_many(texts))
                else:
                    tokens = sum(embedder.embed(t)[1] for t in texts)
                rate.append(time.perf_counter() - t0)
        for mode, times in rates.items():
            best = min(times)
            print(
                f"  {label:13s} {mode:13s} {len(texts) / best:7.1f} texts/s, "
                f"{tokens / best:6.0f} tokens/s (mean {tokens / len(texts):.0f} tokens, "
                f"best of {args.rounds})"
            )

    dim = len(embedder.embed("dimension")[0])
    texts = [c.text for c in base]
    while len(texts) < args.chunks:
        texts.append(variant(base[len(texts) % len(base)].text, rng))
    texts = texts[: args.chunks]
    vecs = np.random.default_rng(7).standard_normal((len(texts), dim), dtype=np.float32)

    with tempfile.TemporaryDirectory() as tmp:
        store = RagStore(Path(tmp) / "index.db")
        store.create_collection(
            "bench",
            [Path(tmp)],
            model_name=Path(model.path).stem,
            model_path=str(model.path),
            dim=dim,
        )
        t0 = time.perf_counter()
        for f, i in enumerate(range(0, len(texts), CHUNKS_PER_FILE)):
            part = texts[i : i + CHUNKS_PER_FILE]
            chunks = [Chunk(t, None, None, 0, len(t), count_tokens(t)) for t in part]
            store.replace_file(
                "bench",
                Found(Path(tmp) / f"f{f}.txt", 1, 1),
                f"sha{f}",
                chunks,
                [v.tolist() for v in vecs[i : i + len(part)]],
            )
        took = time.perf_counter() - t0
        print(
            f"stored {len(texts)} chunks ({len(texts) // CHUNKS_PER_FILE} files) in "
            f"{took:.2f} s: {len(texts) / took:.0f} chunks/s, {dim}-d float32 vectors"
        )

        questions = [
            " ".join(rng.sample(t.split(), min(6, len(t.split()))))
            for t in rng.sample(texts, args.queries)
        ]
        qvecs = [v for v, _ in embedder.embed_many(questions)]

        t0 = time.perf_counter()
        store.vectors("bench")
        print(
            f"loading the vector matrix (once, then cached): "
            f"{(time.perf_counter() - t0) * 1000:.1f} ms"
        )
        timings: dict[str, list[float]] = {"keyword": [], "vector": [], "hybrid": []}
        for q, qv in zip(questions, qvecs, strict=True):
            t0 = time.perf_counter()
            keyword(store, "bench", q, 10)
            t1 = time.perf_counter()
            vector(store, "bench", qv, 10)
            t2 = time.perf_counter()
            hybrid(store, "bench", q, qv, 10)
            t3 = time.perf_counter()
            timings["keyword"].append(t1 - t0)
            timings["vector"].append(t2 - t1)
            timings["hybrid"].append(t3 - t2)
        print(f"search over {len(texts)} chunks, k=10, {len(questions)} queries:")
        for kind, samples in timings.items():
            print(f"  {kind:8s} {percentiles(samples)}")
        store.close()


if __name__ == "__main__":
    main()
