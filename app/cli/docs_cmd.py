"""`candlewick docs add|index|search|list|remove`: collections of the user's documents, indexed
for search by keywords and by meaning (engine.rag).

Every collection lives in one SQLite file in the app's data folder. Its embedding model is
kept: vectors of two models do not compare, so changing it (`add ... --reembed`) empties the
index and the next `docs index` embeds everything again. New folders are just added: the next
index embeds their files only.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from app.cli.common import CliError, first_loads, library, positive_int, print_json
from app.services.default_embedding import MODEL_NAME, DefaultEmbedding
from app.services.documents import open_documents
from app.services.embedding_models import LoadedEmbedding
from app.services.paths import AppPaths
from app.services.retrieval import RERANK_CANDIDATES, check_reranker, reranked
from engine.model.facts import model_facts
from engine.model.gguf import read_gguf
from engine.rag.indexer import IndexProgress, IndexReport, index_collection
from engine.rag.search import Hit, hybrid, keyword, vector
from engine.rag.store import Collection, RagStore, StoreError

MAX_SKIPS_SHOWN = 20


def register(sub: Any) -> None:
    p = sub.add_parser("docs", help="your documents, searchable: collections of folders")
    dsub = p.add_subparsers(dest="docs_command", metavar="SUBCOMMAND", required=True)

    a = dsub.add_parser(
        "add",
        help="create a collection of folders and files (or add to one)",
        description="Create a collection, or add folders to an existing one (the next "
        "`docs index` embeds their files only). A collection keeps its embedding model: "
        "changing it needs --reembed, which empties the index so the next `docs index` "
        "embeds everything again.",
    )
    a.add_argument("name")
    a.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    a.add_argument(
        "--embedding-model",
        metavar="MODEL",
        help="an embedding model: a library id or a path to a .gguf file (default: the "
        f"collection's own, or {MODEL_NAME}, made once from the installed package)",
    )
    a.add_argument(
        "--reembed",
        action="store_true",
        help="give an existing collection another embedding model (its index is emptied)",
    )
    a.set_defaults(handler=add)

    ix = dsub.add_parser("index", help="bring a collection's index up to date (resumable)")
    ix.add_argument("name")
    ix.add_argument("--json", action="store_true", help="print the report as one JSON object")
    ix.set_defaults(handler=index)

    s = dsub.add_parser("search", help="search a collection")
    s.add_argument("name")
    s.add_argument("query")
    s.add_argument("-k", type=positive_int, default=5, help="how many hits (default 5)")
    s.add_argument(
        "--mode",
        choices=("hybrid", "keyword", "vector"),
        default="hybrid",
        help="keyword needs no model; vector and hybrid load the embedding model",
    )
    s.add_argument(
        "--rerank",
        metavar="MODEL",
        default=None,
        help="re-sort the best candidates with a reranker: a library id or a path to a .gguf file",
    )
    s.add_argument(
        "--candidates",
        type=positive_int,
        default=None,
        help=f"how many found passages the reranker scores (default {RERANK_CANDIDATES}; "
        "at least -k)",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(handler=search)

    ls = dsub.add_parser("list", help="list the collections")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=list_collections)

    rm = dsub.add_parser("remove", help="remove a collection and its index (not your files)")
    rm.add_argument("name")
    rm.set_defaults(handler=remove)


def _collection(store: RagStore, name: str) -> Collection:
    try:
        return store.collection(name)
    except StoreError:
        known = ", ".join(c.name for c in store.collections()) or "none yet"
        raise CliError(f"no collection named {name!r} (collections: {known})") from None


# add


def add(args: argparse.Namespace) -> int:
    roots = []
    for p in args.paths:
        path = Path(p).expanduser()
        if not path.exists():
            raise CliError(f"no such file or folder: {p}")
        roots.append(path.resolve())
    with open_documents() as store:
        existing = next((c for c in store.collections() if c.name == args.name), None)
    if args.embedding_model is not None:
        model_path = library().resolve(args.embedding_model).resolve()
    elif existing is not None:  # new folders keep the collection's model
        model_path = _default_if_gone(Path(existing.model_path))
    else:
        model_path = default_embedding()
    ref = args.embedding_model or model_path.name
    facts = model_facts(read_gguf(model_path))
    if not facts.embedding_only:
        raise CliError(
            f"{ref} is a text generator, not an embedding model "
            "(its file says no pooling; try all-MiniLM-L6-v2 or nomic-embed-text)"
        )
    if facts.is_reranker:
        raise CliError(
            f"{ref} is a reranker, not an embedding model (use it with "
            "`docs search --rerank`; try all-MiniLM-L6-v2 or nomic-embed-text)"
        )
    model_name = facts.display_name or facts.name
    with open_documents() as store:
        if existing is None:
            store.create_collection(
                args.name,
                roots,
                model_name=model_name,
                model_path=str(model_path),
                dim=facts.n_embd,
            )
            print(
                f"Created collection '{args.name}' ({len(roots)} folder(s), model "
                f"{model_name}); run `candlewick docs index {args.name}`"
            )
            return 0
        merged = list(existing.roots) + [r for r in roots if r not in existing.roots]
        new_model = str(model_path) != existing.model_path
        if new_model and not args.reembed:
            raise CliError(
                f"collection '{args.name}' is embedded with {existing.model_name}; add "
                "--reembed to embed it again with this model"
            )
        if not new_model and merged == list(existing.roots):
            print(f"Collection '{args.name}' already has these folders and this model.")
            return 0
        if merged != list(existing.roots):
            store.set_roots(args.name, merged)
        if new_model:
            store.set_model(
                args.name, model_name=model_name, model_path=str(model_path), dim=facts.n_embd
            )
    what = f"model {model_name}, index emptied" if new_model else f"{len(merged)} folder(s)"
    print(f"Updated collection '{args.name}' ({what}); run `candlewick docs index {args.name}`")
    return 0


def default_embedding() -> Path:
    """The default embedding model's file, made from the installed package the first time
    (a line on stderr says so: it takes a few seconds)."""

    def tell() -> None:
        print(
            f"Making the default embedding model {MODEL_NAME} from the installed package (once)...",
            file=sys.stderr,
            flush=True,
        )

    return DefaultEmbedding(AppPaths.default().models).ensure(before_making=tell).resolve()


def _default_if_gone(path: Path) -> Path:
    """`path`; the default model made again if `path` is its file, deleted from the library."""
    if not path.exists() and path == DefaultEmbedding(AppPaths.default().models).path.resolve():
        return default_embedding()
    return path


# index


class _Embedding:
    """A collection's embedding model, loaded once: embed and count tokens as the indexer
    takes them (the window's loader, on every core: this process only indexes)."""

    def __init__(self, col: Collection) -> None:
        path = _default_if_gone(Path(col.model_path))
        if not path.exists():
            raise CliError(
                f"the embedding model of '{col.name}' is gone: {path} (add the collection "
                "again with --embedding-model MODEL --reembed)"
            )
        self.loaded = LoadedEmbedding(path, n_threads=None, first_loads=first_loads())
        if self.loaded.dim != col.dim:
            self.close()
            raise CliError(
                f"{path.name} gives vectors of {self.loaded.dim} values but '{col.name}' holds "
                f"{col.dim}"
            )

    def embed(self, texts: list[str]) -> list[list[float]]:
        return self.loaded.embed_many(texts)

    def count_tokens(self, text: str) -> int:
        return self.loaded.count_tokens(text)

    def close(self) -> None:
        self.loaded.close()


class _Progress:
    """One updating line on a terminal, a plain line every few seconds otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.shown = False

    def __call__(self, p: IndexProgress) -> None:
        now = time.monotonic()
        final = p.files_done == p.files_total
        if not final and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        eta = f"  ETA {_duration(p.eta_seconds)}" if p.eta_seconds is not None else ""
        line = f"indexing: {p.files_done}/{p.files_total} files  {p.chunks} chunks{eta}"
        if self.tty:
            print("\r" + line.ljust(72), end="", file=sys.stderr, flush=True)
            self.shown = True
        else:
            print(line, file=sys.stderr, flush=True)

    def end(self) -> None:
        if self.shown:
            print(file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _run_cancellable(work: Callable[[threading.Event], IndexReport]) -> IndexReport:
    """Run `work` in a worker thread and wait on it here, so that Ctrl-C (delivered to the
    main thread) sets the cancel event and the indexer stops between files."""
    cancel = threading.Event()
    result: list[IndexReport] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(work(cancel))
        except BaseException as e:  # re-raised in the main thread
            error.append(e)

    worker = threading.Thread(target=target, name="candlewick-docs-index", daemon=True)
    worker.start()
    while worker.is_alive():
        try:
            worker.join(0.2)
        except KeyboardInterrupt:
            cancel.set()
    if error:
        raise error[0]
    return result[0]


def index(args: argparse.Namespace) -> int:
    with open_documents() as store:
        col = _collection(store, args.name)
        embedding = _Embedding(col)
        progress = _Progress()
        try:
            report = _run_cancellable(
                lambda cancel: index_collection(
                    store,
                    col.name,
                    embedding.embed,
                    embedding.count_tokens,
                    progress=progress,
                    cancel=cancel,
                )
            )
        finally:
            progress.end()
            embedding.close()
    if args.json:
        print_json(report_dict(report))
    else:
        _print_report(report)
    if report.cancelled:
        print("cancelled: run it again to resume", file=sys.stderr)
        return 130
    return 0


def report_dict(r: IndexReport) -> dict[str, Any]:
    return {
        "added": r.added,
        "updated": r.updated,
        "unchanged": r.unchanged,
        "removed": r.removed,
        "skipped": [{"path": str(p), "reason": why} for p, why in r.skipped],
        "chunks": r.chunks,
        "seconds": round(r.seconds, 3),
        "chunks_per_s": round(_rate(r), 2),
        "cancelled": r.cancelled,
    }


def _rate(r: IndexReport) -> float:
    return r.chunks / r.seconds if r.seconds > 0 else 0.0


def _print_report(r: IndexReport) -> None:
    print(
        f"{r.added} added, {r.updated} updated, {r.unchanged} unchanged, {r.removed} removed, "
        f"{len(r.skipped)} skipped; {r.chunks} chunks in {r.seconds:.1f} s "
        f"({_rate(r):.1f} chunks/s)"
    )
    for path, why in r.skipped[:MAX_SKIPS_SHOWN]:
        print(f"  skipped {path}: {why}")
    if len(r.skipped) > MAX_SKIPS_SHOWN:
        print(f"  and {len(r.skipped) - MAX_SKIPS_SHOWN} more")


# search


def search(args: argparse.Namespace) -> int:
    if args.candidates is not None and args.rerank is None:
        raise CliError("--candidates goes with --rerank MODEL")
    reranker = None
    if args.rerank is not None:
        reranker = library().resolve(args.rerank).resolve()
        check_reranker(reranker)  # before the search: a wrong model fails at once
    depth = max(args.k, args.candidates or RERANK_CANDIDATES) if reranker is not None else args.k
    with open_documents() as store:
        col = _collection(store, args.name)
        if args.mode == "keyword":
            hits = keyword(store, col.name, args.query, depth)
        else:
            embedding = _Embedding(col)
            try:
                q = embedding.loaded.embed_query(args.query)  # a long one: its start
            finally:
                embedding.close()
            if args.mode == "vector":
                hits = vector(store, col.name, q, depth)
            else:
                hits = hybrid(store, col.name, args.query, q, depth)
    scored: list[tuple[float | None, Hit]] = [(None, h) for h in hits]
    if reranker is not None:
        loaded = LoadedEmbedding(reranker, n_threads=None, first_loads=first_loads())
        try:
            scored = list(reranked(loaded, args.query, hits)[: args.k])
        finally:
            loaded.close()
    if args.json:
        print_json([hit_dict(h, rerank_score=r) for r, h in scored])
        return 0
    if not scored:
        print(f"Nothing in '{col.name}' matches that.")
        return 0
    for n, (r, h) in enumerate(scored, 1):
        rerank = f"  rerank {r:.4f}" if r is not None else ""
        print(f"{n}. {h.path}{_where(h)}  [{h.start}:{h.end}]  score {h.score:.4f}{rerank}")
        for line in excerpt(h.text):
            print(f"   {line}")
    return 0


def hit_dict(h: Hit, *, rerank_score: float | None = None) -> dict[str, Any]:
    """A hit as JSON; `score` is the search's own (fused, bm25 or cosine), and a reranked
    search adds the reranker's raw `rerank_score`, by which the hits are then ordered."""
    d: dict[str, Any] = {
        "path": str(h.path),
        "page": h.page,
        "heading": h.heading,
        "start": h.start,
        "end": h.end,
        "score": h.score,
        "keyword_rank": h.keyword_rank,
        "vector_rank": h.vector_rank,
        "text": h.text,
    }
    if rerank_score is not None:
        d["rerank_score"] = rerank_score
    return d


def _where(h: Hit) -> str:
    parts = []
    if h.page is not None:
        parts.append(f"page {h.page}")
    if h.heading:
        parts.append(f"§ {h.heading}")
    return ("  " + ", ".join(parts)) if parts else ""


def excerpt(text: str, *, lines: int = 3, width: int = 96) -> list[str]:
    """The chunk's first non-blank lines, each cut to `width` characters."""
    out = []
    for line in text.splitlines():
        line = " ".join(line.split())
        if not line:
            continue
        out.append(line if len(line) <= width else line[: width - 1] + "…")
        if len(out) == lines:
            break
    return out


# list, remove


def list_collections(args: argparse.Namespace) -> int:
    with open_documents() as store:
        rows = [_collection_dict(store, c) for c in store.collections()]
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("No collections yet: `candlewick docs add NAME FOLDER`.")
        return 0
    for r in rows:
        last = r["last_indexed"]
        when = datetime.fromtimestamp(last).strftime("%Y-%m-%d %H:%M") if last else "never"
        print(
            f"{r['name']}  model {r['model']}  {r['files']} files, {r['chunks']} chunks, "
            f"{r['skipped']} skipped  last indexed {when}"
        )
        for root in r["roots"]:
            print(f"  {root}")
    return 0


def _collection_dict(store: RagStore, c: Collection) -> dict[str, Any]:
    counts = store.counts(c.name)
    return {
        "name": c.name,
        "roots": [str(r) for r in c.roots],
        "model": c.model_name,
        "model_path": c.model_path,
        "files": counts.indexed,
        "chunks": counts.chunks,
        "skipped": counts.skipped,
        "last_indexed": store.last_indexed(c.name),
    }


def remove(args: argparse.Namespace) -> int:
    with open_documents() as store:
        col = _collection(store, args.name)
        store.remove_collection(col.name)
    print(f"Removed collection '{col.name}' and its index (your files are untouched).")
    return 0
