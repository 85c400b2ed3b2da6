"""The window as the real-model UI tests open it: a library holding only a folder of links
(SmolLM2, and a projector beside it where the test pairs one), the window built over it,
shown, exposed and with that model selected; then closed, shut down (its engine thread
joined) and deleted, the deferred deletes run so nothing outlives the test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PySide6.QtCore import QEvent, QRect
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.library import LibraryEntry, ModelLibrary
from app.services.paths import AppPaths
from app.ui.main_window import MainWindow
from engine.settings import SamplingParams

SMOLLM2_NAME = "SmolLM2-135M-Instruct-Q8_0.gguf"


def linked_folder(folder: Path, model: Path, *beside: Path, model_name: str = SMOLLM2_NAME) -> Path:
    """`folder` made, holding a link to `model` named `model_name` and links to `beside`
    (a projector) under their own names, as a Hub repo has them."""
    folder.mkdir()
    (folder / model_name).symlink_to(model)
    for path in beside:
        (folder / path.name).symlink_to(path)
    return folder


def library() -> ModelLibrary:
    """The profile's library with nothing bundled or discovered: only what a test imports."""
    return ModelLibrary(AppPaths.default().ensure().models, bundled=False, discovery=False)


def open_window(
    qtbot: QtBot,
    lib: ModelLibrary,
    entry: LibraryEntry,
    sampling: SamplingParams,
    geometry: QRect | None = None,
) -> MainWindow:
    w = build_window(library=lib, sampling=sampling)
    if geometry is not None:
        w.setGeometry(geometry)
    w.show()
    qtbot.waitExposed(w)
    assert w.library_panel.select(entry.id)
    return w


def close_window(w: MainWindow) -> None:
    try:
        w.close()
    except RuntimeError:  # its C++ side is gone: the test closed it already (to reopen it)
        return
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@contextmanager
def model_window(
    qtbot: QtBot, folder: Path, sampling: SamplingParams, geometry: QRect | None = None
) -> Iterator[tuple[MainWindow, LibraryEntry]]:
    """The window over a fresh library of `folder`'s one model, selected; closed after."""
    lib = library()
    (entry,) = lib.import_folder(folder)
    w = open_window(qtbot, lib, entry, sampling, geometry)
    try:
        yield w, entry
    finally:
        close_window(w)
