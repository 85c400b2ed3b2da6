"""How fast the chat answers while a collection is being indexed: idle, with indexing running
freely beside it, and with indexing held while the chat answers (what the desktop does).

    .venv/bin/python benchmarks/rag_chat_while_indexing.py [--rounds 5] [--tokens 128]

One SmolLM2 (2 threads) answers the same greedy request; an indexing thread runs the real
indexer (`engine.rag.indexer.index_collection`, all-MiniLM-L6-v2 on one thread as the app
loads it, `app.services.embedding_models`) over the Python language reference, starting a
new collection whenever one is done, so it never runs out of work. Modes, alternated every
round so machine noise hits each alike:

* idle: no indexing;
* free: indexing runs while the chat answers;
* held: indexing waits at its pause gate while the chat answers (`app.ui.index_job.ChatGate`,
  closed around each reply as the window's busy signal does), and runs between replies.

Prints the CPU model, each mode's median decode rate and its ratio to idle, and how many
chunks the indexer embedded per second in each mode (the price of holding it). Exits non-zero
only on errors, never because of the numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.services.embedding_models import EmbeddingModels  # noqa: E402
from app.services.library import bundled_default_model  # noqa: E402
from app.ui.index_job import ChatGate  # noqa: E402
from benchmarks.rag_search import model_path  # noqa: E402
from benchmarks.reply_rate import reply_rate  # noqa: E402
from engine.bench.hw import cpu_name  # noqa: E402
from engine.host.runtime import Model  # noqa: E402
from engine.rag.indexer import IndexProgress, index_collection  # noqa: E402
from engine.rag.store import RagStore  # noqa: E402
from engine.settings import LoadParams, SamplingParams  # noqa: E402

MODES = ("idle", "free", "held")


def corpus(folder: Path) -> Path:
    """The language reference topics, a .txt file each (922 chunks with MiniLM)."""
    from pydoc_data.topics import topics

    folder.mkdir(parents=True, exist_ok=True)
    for name, text in topics.items():
        (folder / f"{name}.txt").write_text(text, encoding="utf-8")
    return folder


class Indexing:
    """The indexing thread: index a fresh collection of the corpus, again and again, until
    stopped; `running` says whether it may work now (idle mode stops it entirely)."""

    def __init__(self, store_path: Path, docs: Path, embedding: Path) -> None:
        self.store = RagStore(store_path)
        self.docs = docs
        self.embedding = embedding
        self.models = EmbeddingModels()
        self.gate = ChatGate()
        self.running = threading.Event()
        self.stop = threading.Event()
        self.chunks = 0  # embedded so far
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="indexing", daemon=True)

    def _run(self) -> None:
        model = self.models.get(self.embedding)
        round_no = 0
        while not self.stop.is_set():
            round_no += 1
            name = f"reference-{round_no}"
            self.store.create_collection(
                name,
                [self.docs],
                model_name="all-MiniLM-L6-v2",
                model_path=str(self.embedding),
                dim=model.dim,
            )
            done = [0]

            def progress(p: IndexProgress, done: list[int] = done) -> None:
                with self._lock:
                    self.chunks += p.chunks - done[0]
                done[0] = p.chunks

            index_collection(
                self.store,
                name,
                model.embed_many,
                model.count_tokens,
                progress=progress,
                cancel=self.stop,
                pause=self._pause,
            )

    def _pause(self) -> None:
        while not self.running.is_set() and not self.stop.is_set():
            self.running.wait(0.05)
        self.gate.wait(self.stop, lambda _paused: None)

    def embedded(self) -> int:
        with self._lock:
            return self.chunks

    def close(self) -> None:
        self.stop.set()
        self.running.set()
        self.gate.set_busy(False)
        self.thread.join(timeout=120)
        self.models.close()
        self.store.close()


def rate(model: Model, sampling: SamplingParams) -> float:
    model.reset_cache()
    return reply_rate(model, sampling)[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="the chat model's threads")
    args = ap.parse_args()

    load0 = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="candlewick-rag-chat-"))
    chat_path = bundled_default_model()
    assert chat_path is not None, "the bundled SmolLM2 is not installed"
    chat = Model(chat_path, LoadParams(n_ctx=2048, n_threads=args.threads))
    sampling = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    indexing = Indexing(work / "documents.sqlite3", corpus(work / "docs"), model_path(None))
    indexing.thread.start()
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    chunk_rates: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        rate(chat, sampling)  # warm-up
        for _ in range(args.rounds):
            for mode in MODES:
                if mode == "idle":
                    indexing.running.clear()
                else:
                    indexing.running.set()
                time.sleep(1.0)  # the indexer is under way (or has stopped) before the reply
                c0, t0 = indexing.embedded(), time.perf_counter()
                indexing.gate.set_busy(mode == "held")
                rates[mode].append(rate(chat, sampling))
                indexing.gate.set_busy(False)
                time.sleep(1.0)  # held: what the indexer does between two replies counts too
                chunk_rates[mode].append((indexing.embedded() - c0) / (time.perf_counter() - t0))
    finally:
        indexing.close()
        chat.close()

    idle = statistics.median(rates["idle"])
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; chat: SmolLM2 ({args.threads} threads)")
    print(f"command: .venv/bin/python benchmarks/rag_chat_while_indexing.py --rounds {args.rounds}")
    print("| mode | chat decode t/s (median) | vs idle | runs | chunks embedded/s |")
    print("|---|---:|---:|---|---:|")
    for mode in MODES:
        med = statistics.median(rates[mode])
        print(
            f"| {mode} | {med:.1f} | {med / idle:.2f}x | "
            f"{', '.join(f'{r:.0f}' for r in rates[mode])} | "
            f"{statistics.median(chunk_rates[mode]):.1f} |"
        )
    print(f"load average at start {load0:.1f}, at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
