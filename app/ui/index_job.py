"""Indexing a document collection off the GUI thread, one collection at a time, held while the
chat answers.

The work is `engine.rag.indexer.index_collection` on a `Background` thread, with the
collection's model from the app's shared embedding models (loaded there the first time, kept
for the chat's searches too). Progress, "paused" and the end come back
as queued signals. Cancelling stops between two embedding steps; the indexer commits each file
on its own, so the next run resumes where this one stopped (quitting the window cancels).

`ChatGate` is what the indexing waits on while a reply streams: embedding and generating on
the same cores would halve the chat's speed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from PySide6.QtCore import QObject, Signal, SignalInstance

from app.services.embedding_models import EmbeddingModels
from app.ui.background import Background
from engine.errors import EngineError
from engine.model.facts import model_facts
from engine.model.gguf import GGUFError, read_gguf
from engine.rag.indexer import IndexProgress, IndexReport, index_collection
from engine.rag.store import Collection, RagStore

# Progress reaches the panel at most this often (unchanged files pass by the hundred).
PROGRESS_EVERY_S = 0.1
GATE_POLL_S = 0.1


class DocumentsError(Exception):
    """A collection cannot be indexed as it is; `str()` is one line for the user."""


class Embedding(Protocol):
    """A collection's embedding model as the indexer takes it."""

    def embed(self, texts: list[str]) -> list[list[float]]: ...

    def count_tokens(self, text: str) -> int: ...

    def close(self) -> None: ...


# Loads a collection's model for one run.
EmbeddingLoader = Callable[[Collection], Embedding]


@dataclass(frozen=True)
class EmbeddingChoice:
    """What a collection records about its embedding model."""

    name: str
    path: Path
    dim: int


def embedding_choice(path: Path) -> EmbeddingChoice:
    """The model at `path` as a collection's embedding model, or DocumentsError saying why it
    cannot be one (a text generator, an unreadable file)."""
    try:
        facts = model_facts(read_gguf(path))
    except (GGUFError, OSError) as e:
        raise DocumentsError(f"{path.name} cannot be read: {e}") from None
    if not facts.embedding_only:
        raise DocumentsError(
            f"{facts.display_name or path.name} is a text generator, not an embedding model "
            "(try all-MiniLM-L6-v2 or nomic-embed-text)"
        )
    if facts.is_reranker:
        raise DocumentsError(
            f"{facts.display_name or path.name} is a reranker, not an embedding model "
            "(pick it in Chat settings → Rerank with)"
        )
    return EmbeddingChoice(facts.display_name or facts.name, path.resolve(), facts.n_embd)


class CollectionEmbedding:
    """A collection's model, from the app's shared embedding models, checked against what the
    collection holds. Closing it is a no-op: the shared models are freed at shutdown."""

    def __init__(self, col: Collection, models: EmbeddingModels) -> None:
        path = Path(col.model_path)
        if not path.exists():
            raise DocumentsError(
                f"the embedding model of '{col.name}' is gone ({path}): choose another with "
                "Change model"
            )
        choice = embedding_choice(path)
        if choice.dim != col.dim:
            raise DocumentsError(
                f"{path.name} gives vectors of {choice.dim} values but '{col.name}' holds "
                f"{col.dim}: choose its model again with Change model"
            )
        self.model = models.get(path)

    def embed(self, texts: list[str]) -> list[list[float]]:
        # The indexer's batches fit one decode of the embedder: the chat's gate, asked before
        # each, holds a reply up for one decode at most.
        return self.model.embed_many(texts)

    def count_tokens(self, text: str) -> int:
        return self.model.count_tokens(text)

    def close(self) -> None:
        pass


def embedding_loader(models: EmbeddingModels) -> EmbeddingLoader:
    def load(col: Collection) -> Embedding:
        return CollectionEmbedding(col, models)

    return load


class ChatGate:
    """Open while the chat is idle; `set_busy` (GUI thread) closes it while a reply is on its
    way, and the indexing thread waits in `wait` until it opens again or the run is
    cancelled."""

    def __init__(self) -> None:
        self._idle = threading.Event()
        self._idle.set()

    def set_busy(self, busy: bool) -> None:
        if busy:
            self._idle.clear()
        else:
            self._idle.set()

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    def wait(self, cancel: threading.Event, paused: Callable[[bool], None]) -> None:
        """Return at once when the chat is idle; else say `paused(True)`, wait, and say
        `paused(False)` before returning."""
        if self._idle.is_set() or cancel.is_set():
            return
        paused(True)
        try:
            while not self._idle.wait(GATE_POLL_S):
                if cancel.is_set():
                    return
        finally:
            paused(False)


class IndexJob(QObject):
    """Runs one collection's indexing at a time. Signals arrive on the GUI thread:
    `progress(name, IndexProgress)`, `paused(name, bool)`, then `finished(name, IndexReport)`
    or `failed(name, message)`."""

    progress = Signal(str, object)
    paused = Signal(str, bool)
    finished = Signal(str, object)
    failed = Signal(str, str)

    def __init__(
        self,
        store: RagStore,
        load: EmbeddingLoader,
        gate: ChatGate | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.store = store
        self._load = load
        self.gate = gate or ChatGate()
        self._bg = Background(self, max_threads=1)
        self._cancel = threading.Event()
        self.running: str | None = None  # the collection being indexed

    def start(self, name: str) -> bool:
        """Index collection `name` (False: another one is being indexed)."""
        if self.running is not None:
            return False
        self.running = name
        self._cancel = cancel = threading.Event()
        self._bg.run(
            lambda: self._work(name, cancel),
            lambda result, error: self._done(name, result, error),
            name="candlewick-docs-index",
        )
        return True

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelling(self) -> bool:
        return self.running is not None and self._cancel.is_set()

    def _work(self, name: str, cancel: threading.Event) -> IndexReport:
        embedding = self._load(self.store.collection(name))

        def gate() -> None:
            self.gate.wait(cancel, lambda on: self._emit(self.paused, name, on))

        last = [0.0]

        def on_progress(p: IndexProgress) -> None:
            now = time.monotonic()
            if p.files_done == p.files_total or now - last[0] >= PROGRESS_EVERY_S:
                last[0] = now
                self._emit(self.progress, name, p)

        try:
            return index_collection(
                self.store,
                name,
                embedding.embed,
                embedding.count_tokens,
                progress=on_progress,
                cancel=cancel,
                pause=gate,
            )
        finally:
            embedding.close()

    def _emit(self, signal: SignalInstance, name: str, value: object) -> None:
        with contextlib.suppress(RuntimeError):  # this object is gone: the run is cancelled
            signal.emit(name, value)

    def _done(self, name: str, report: IndexReport | None, error: BaseException | None) -> None:
        self.running = None
        if error is None and report is not None:
            self.finished.emit(name, report)
            return
        if isinstance(error, (DocumentsError, EngineError, GGUFError)):
            text = str(error)
        elif isinstance(error, OSError):
            text = error.strerror or str(error)
        elif isinstance(error, MemoryError):
            text = "not enough memory to load its embedding model"
        else:
            text = f"{type(error).__name__}: {error}"
        self.failed.emit(name, f"Could not index '{name}': {text}")

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Cancel a run and wait for its thread (the next run resumes where it stopped)."""
        self._cancel.set()
        self._bg.wait(timeout_s)
        self.running = None
