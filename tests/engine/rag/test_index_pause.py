"""The indexer's `pause` gate: called before every embedding batch, it holds the run (nothing
is embedded or stored while it blocks), and a cancel while it holds stops the run with the
file in flight left for the next one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from engine.rag.indexer import EMBED_BATCH, IndexReport, index_collection
from engine.rag.store import RagStore
from tests.engine.rag.helpers import DIM, CountingEmbedder, word_count


class Gate:
    """A pause that blocks until opened, counting the calls and telling when one waits."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.waiting = threading.Event()
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        self.waiting.set()
        self.open.wait()


def folder_of(tmp: Path, n: int, words: int = 8) -> Path:
    docs = tmp / "docs"
    docs.mkdir()
    for i in range(n):
        (docs / f"note{i}.txt").write_text(" ".join(f"w{i}x{j}" for j in range(words)))
    return docs


def run_in_thread(work: Callable[[], IndexReport]) -> tuple[threading.Thread, list[IndexReport]]:
    out: list[IndexReport] = []
    t = threading.Thread(target=lambda: out.append(work()), name="test-index")
    t.start()
    return t, out


def test_a_closed_gate_holds_indexing_until_it_opens(tmp_path: Path) -> None:
    docs = folder_of(tmp_path, 3)
    embed, gate = CountingEmbedder(), Gate()
    with RagStore(tmp_path / "i.db") as store:
        store.create_collection("c", [docs], model_name="m", model_path="", dim=DIM)
        t, out = run_in_thread(lambda: index_collection(store, "c", embed, word_count, pause=gate))
        assert gate.waiting.wait(10)
        t.join(0.3)
        assert t.is_alive()  # still held
        assert embed.calls == 0 and store.counts("c").chunks == 0
        gate.open.set()
        t.join(30)
        assert not t.is_alive()
    report = out[0]
    assert (report.added, report.cancelled) == (3, False)
    assert embed.calls == gate.calls == 3  # one gate call before each embedding batch


def test_the_gate_is_asked_before_every_batch_of_a_big_file(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    # Many paragraphs, each its own chunk of a few words: more than two batches.
    (docs / "big.txt").write_text(
        "\n\n".join(f"para{i} " + "word " * 150 for i in range(2 * EMBED_BATCH + 5))
    )
    embed, gate = CountingEmbedder(), Gate()
    gate.open.set()
    with RagStore(tmp_path / "i.db") as store:
        store.create_collection("c", [docs], model_name="m", model_path="", dim=DIM)
        report = index_collection(store, "c", embed, word_count, pause=gate)
    assert report.chunks > 2 * EMBED_BATCH and embed.calls >= 3
    assert gate.calls == embed.calls  # one gate call before each embedding batch


def test_cancel_while_held_stops_and_the_next_run_resumes(tmp_path: Path) -> None:
    docs = folder_of(tmp_path, 3)
    embed, gate = CountingEmbedder(), Gate()
    cancel = threading.Event()
    with RagStore(tmp_path / "i.db") as store:
        store.create_collection("c", [docs], model_name="m", model_path="", dim=DIM)
        t, out = run_in_thread(
            lambda: index_collection(store, "c", embed, word_count, cancel=cancel, pause=gate)
        )
        assert gate.waiting.wait(10)
        cancel.set()
        gate.open.set()  # the desktop's gate returns on a cancel; this one is opened
        t.join(30)
        assert out[0].cancelled and out[0].added == 0
        assert embed.calls == 0 and store.counts("c").files == 0
        again = index_collection(store, "c", embed, word_count)
        assert (again.added, again.cancelled) == (3, False)
        store.check("c")
