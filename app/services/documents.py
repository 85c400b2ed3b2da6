"""Where the document collections live: one SQLite index in the app's data folder, shared by
the command line and the window (engine.rag does the work; this only names the file)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.services.paths import AppPaths
from engine.rag.store import RagStore

INDEX_FILE = "documents.sqlite3"


def index_path(paths: AppPaths | None = None) -> Path:
    """The index file (its folder is created when missing)."""
    return (paths or AppPaths.default()).ensure().data / INDEX_FILE


@contextmanager
def open_documents(paths: AppPaths | None = None) -> Iterator[RagStore]:
    with RagStore(index_path(paths)) as store:
        yield store
