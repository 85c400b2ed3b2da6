"""What the document-index tests share: a deterministic embedder (hashed bag of words), chunks
made by hand, a folder of files from the Python language reference topics, and the child
process that indexes until it kills itself (`python -m tests.engine.rag.helpers`)."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import sys
import threading
from pathlib import Path

import numpy as np

from engine.rag.chunking import Chunk
from engine.rag.files import Found

DIM = 64

# Three short notes as a user keeps them: only the garden note is about the salad leaves, and
# it shares no word with the question; the other two share words that more than half the index
# has ("happened", "leaves"), on which bm25 gives them ~0 (issue #35).
NOTES = {
    "garden.txt": "Slugs got into the vegetable bed overnight and ate the lettuce to the stalks.",
    "harbour.md": "The ferry leaves the harbour at seven. Nothing much happened on the quay.",
    "station.txt": "The night train leaves at ten; what happened to the timetable, nobody knows.",
}
SALAD = "What happened to the salad leaves?"


def bow_vector(text: str, dim: int = DIM) -> list[float]:
    """Words hashed into `dim` buckets: texts sharing words point the same way."""
    v = np.zeros(dim, dtype=np.float32)
    for word in re.findall(r"\w+", text.lower()):
        v[
            int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little") % dim
        ] += 1.0
    if not v.any():
        v[0] = 1.0
    return [float(x) for x in v]


class CountingEmbedder:
    """The hashed bag of words, counting calls and texts (to see what an index run embedded)."""

    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim
        self.calls = 0
        self.texts: list[str] = []

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        self.texts.extend(texts)
        return [bow_vector(t, self.dim) for t in texts]


def word_count(text: str) -> int:
    return len(text.split())


def make_chunks(texts: list[str]) -> list[Chunk]:
    out, pos = [], 0
    for t in texts:
        out.append(
            Chunk(
                text=t, page=None, heading=None, start=pos, end=pos + len(t), n_tokens=word_count(t)
            )
        )
        pos += len(t) + 1
    return out


def found(path: Path, size: int = 10, mtime_ns: int = 1) -> Found:
    return Found(path=path, size=size, mtime_ns=mtime_ns)


def topic_files(folder: Path, n: int) -> dict[str, Path]:
    """The `n` shortest language reference topics, one .txt file each (short: the model embeds
    every chunk on the CPU)."""
    from pydoc_data.topics import topics

    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in sorted(topics, key=lambda t: (len(topics[t]), t))[:n]:
        path = folder / f"{name}.txt"
        path.write_text(topics[name], encoding="utf-8")
        out[name] = path.resolve()
    return out


def _index_until_killed(db: str, collection: str, model_path: str, kill_after: int) -> None:
    """Index with the real model and SIGKILL this process after `kill_after` files, in the
    middle of writing the next one: the progress callback arms the kill, and a trigger fires it
    on that file's first chunk row: its file row and a chunk are written, its vector is not
    (half a file, inside its transaction), as a crash would leave it."""
    from engine.host.runtime import Model
    from engine.rag.indexer import IndexProgress, index_collection
    from engine.rag.store import RagStore
    from engine.server.embeddings import Embedder
    from engine.settings import LoadParams

    model = Model(Path(model_path), LoadParams(n_ctx=512, n_threads=2))
    embedder = Embedder(model)
    store = RagStore(db)
    armed = threading.Event()

    def embed(texts: list[str]) -> list[list[float]]:
        return [embedder.embed(t)[0] for t in texts]

    def count(text: str) -> int:
        return len(model.tokenize(text, add_special=True, parse_special=False))

    def progress(p: IndexProgress) -> None:
        if p.files_done >= kill_after:
            armed.set()

    def chunk_written() -> int:
        if armed.is_set():
            os.kill(os.getpid(), signal.SIGKILL)
        return 0

    db_conn = store._db  # the test reaches in: a crash point inside replace_file
    db_conn.create_function("chunk_written", 0, chunk_written)
    db_conn.execute(
        "CREATE TEMP TRIGGER kill_point AFTER INSERT ON main.chunks "
        "BEGIN SELECT chunk_written(); END"
    )
    index_collection(store, collection, embed, count, progress=progress)


if __name__ == "__main__":
    _index_until_killed(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
