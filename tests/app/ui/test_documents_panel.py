"""The Documents tab over a real documents index in a temporary folder: collections listed,
created through the dialog (a text generator refused in one line), indexed with the real
all-MiniLM-L6-v2 on a background thread with live progress, held while the chat answers,
cancelled and resumed, skipped files listed with their reasons, the model changed (the index
emptied) and the collection removed (the files kept); the window has the tab, wired to the
chat's busy state."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.services import default_embedding
from app.services.default_embedding import DefaultEmbedding
from app.services.embedding_models import EmbeddingModels
from app.services.library import ModelLibrary
from app.ui.documents_panel import (
    DEFAULT_LABEL,
    EMPTY_TEXT,
    NO_EMBEDDING_MODEL,
    PAUSED_TEXT,
    DocumentsPanel,
    NewCollectionDialog,
)
from app.ui.index_job import embedding_loader
from engine.rag.indexer import IndexProgress, IndexReport
from engine.rag.store import RagStore
from tests.app.ui.shots import save_shot, shots_dir
from tests.engine.rag.helpers import NOTES, topic_files

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")
INDEX_TIMEOUT_MS = 240_000


class Setup:
    def __init__(self, tmp: Path, default: DefaultEmbedding | None = None) -> None:
        self.tmp = tmp
        self.store = RagStore(tmp / "documents.sqlite3")
        self.library = ModelLibrary(tmp / "models", discovery=False)
        self.answers: list[str] = []
        self.say_yes = True
        self.folders: list[Path] = []
        self.models = EmbeddingModels()
        self.panel = DocumentsPanel(
            self.store,
            self.library,
            embedding_loader(self.models),
            confirm=self.confirm,
            pick_folder=lambda: self.folders,
            pick_files=lambda: [],
            default_embedding=default,
        )

    def confirm(self, _title: str, text: str) -> bool:
        self.answers.append(text)
        return self.say_yes

    def close(self) -> None:
        self.panel.shutdown()
        self.models.close()
        self.store.close()


@pytest.fixture
def ui(qtbot: QtBot, tmp_path: Path) -> Iterator[Setup]:
    s = Setup(tmp_path)
    qtbot.addWidget(s.panel)
    yield s
    s.close()


@pytest.fixture
def with_minilm(ui: Setup, minilm_path: Path) -> Setup:
    """A library of the bundled SmolLM2 (a text generator) and MiniLM."""
    ui.library.import_file(minilm_path)
    return ui


def docs(tmp: Path, n: int) -> Path:
    folder = tmp / "docs"
    topic_files(folder, n)
    (folder / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)  # a skip with a reason
    return folder


def run_index(qtbot: QtBot, s: Setup) -> IndexReport:
    with qtbot.waitSignal(s.panel.job.finished, timeout=INDEX_TIMEOUT_MS) as got:
        assert s.panel.index_selected()
    report = got.args[1] if got.args else None
    assert isinstance(report, IndexReport)
    return report


def test_empty_state_then_the_store_s_collections(ui: Setup, tmp_path: Path) -> None:
    p = ui.panel
    assert not p.empty.isHidden() and p.empty.text() == EMPTY_TEXT
    assert p.list.isHidden() and not p.index_button.isEnabled()
    folder = tmp_path / "notes"
    folder.mkdir()
    for name in ("zeta", "alpha"):
        ui.store.create_collection(
            name, [folder], model_name="all-MiniLM-L6-v2", model_path="/m.gguf", dim=4
        )
    p.refresh()
    assert p.empty.isHidden() and not p.list.isHidden()
    assert [p.list.item(i).text().splitlines()[0] for i in range(p.list.count())] == [
        "alpha",
        "zeta",
    ]
    assert p.selected_name() == "alpha"
    assert p.model_label.text() == "all-MiniLM-L6-v2"
    assert p.folders_label.text() == str(folder.resolve())
    assert p.counts_label.text() == "0 files · 0 chunks · 0 skipped"
    assert p.when_label.text() == "never"
    assert p.index_button.isEnabled() and not p.cancel_button.isEnabled()
    assert not p.skipped_button.isEnabled()


def test_new_collection_dialog_lists_only_embedding_models(
    with_minilm: Setup, tmp_path: Path, smollm2_path: Path
) -> None:
    s = with_minilm
    folder = docs(tmp_path, 3)
    s.folders = [folder]
    dialog = s.panel.new_collection()
    assert isinstance(dialog, NewCollectionDialog)
    models = [dialog.model.itemText(i) for i in range(dialog.model.count())]
    assert len(models) == 1 and "minilm" in models[0].lower()

    dialog.try_create()  # no name yet
    assert dialog.isVisible() and dialog.message.text() == "Give the collection a name."
    dialog.name.setText("Reference")
    dialog.try_create()
    assert dialog.message.text() == "Add at least one folder or file."
    dialog.add_paths(s.folders)
    dialog.add_paths(s.folders)  # the same folder once
    assert dialog.paths() == [folder]
    dialog.try_create()
    assert not dialog.isVisible()
    col = s.store.collection("Reference")
    assert col.roots == (folder.resolve(),) and col.dim == 384
    assert s.panel.selected_name() == "Reference"

    # A text generator is refused in one line, whether for a new collection or a change.
    problem = s.panel.create_collection("Chat", [folder], smollm2_path)
    assert problem is not None and "is a text generator, not an embedding model" in problem
    assert "\n" not in problem
    assert [c.name for c in s.store.collections()] == ["Reference"]
    assert not s.panel.change_model(smollm2_path)
    assert "text generator" in s.panel.status.text()
    assert s.store.collection("Reference").model_path == col.model_path
    # A folder that vanished, and a name taken.
    assert s.panel.create_collection("Gone", [tmp_path / "nowhere"], Path(col.model_path)) == (
        f"Not found: {tmp_path / 'nowhere'}"
    )
    taken = s.panel.create_collection("Reference", [folder], Path(col.model_path))
    assert taken == "a collection named 'Reference' already exists"


def test_a_reranker_is_not_offered_as_an_embedding_model(
    with_minilm: Setup, tmp_path: Path, reranker_path: Path
) -> None:
    s = with_minilm
    s.library.import_file(reranker_path)
    [only] = s.panel.embedding_models()  # MiniLM; not the reranker, nor SmolLM2
    assert only.facts is not None and only.facts.embedding_only and not only.facts.is_reranker
    # Named directly, it is refused in one line.
    problem = s.panel.create_collection("R", [tmp_path], reranker_path)
    assert problem is not None and "is a reranker, not an embedding model" in problem
    assert "\n" not in problem and s.store.collections() == []


def test_new_collection_without_an_embedding_model_says_where_to_get_one(ui: Setup) -> None:
    dialog = ui.panel.new_collection()
    assert dialog.model.count() == 0
    assert dialog.message.text() == NO_EMBEDDING_MODEL and not dialog.message.isHidden()
    dialog.try_create()
    assert dialog.isVisible()
    dialog.reject()


def test_index_with_progress_pause_skips_and_a_screenshot(
    qtbot: QtBot, with_minilm: Setup, tmp_path: Path
) -> None:
    s, p = with_minilm, with_minilm.panel
    folder = docs(tmp_path, 6)
    minilm = next(e for e in p.embedding_models())
    assert p.create_collection("Reference", [folder], minilm.path) is None
    seen: list[IndexProgress] = []
    paused: list[bool] = []
    p.job.progress.connect(lambda _name, prog: seen.append(prog))
    p.job.paused.connect(lambda _name, on: paused.append(on))

    # The chat answers: indexing holds before its first embedding.
    p.set_chat_busy(True)
    assert p.index_selected()
    assert not p.index_button.isEnabled() and p.cancel_button.isEnabled()
    assert not p.remove_button.isEnabled() and not p.model_button.isEnabled()
    qtbot.waitUntil(lambda: paused == [True], timeout=INDEX_TIMEOUT_MS)
    assert p.status.text().startswith(PAUSED_TEXT)
    qtbot.wait(300)
    assert s.store.counts("Reference").chunks == 0  # nothing embedded while it waits
    with qtbot.waitSignal(p.job.finished, timeout=INDEX_TIMEOUT_MS) as got:
        p.set_chat_busy(False)
    report = got.args[1]
    assert paused == [True, False]
    assert (report.added, report.unchanged, report.removed, report.cancelled) == (6, 0, 0, False)
    assert [(path.name, why) for path, why in report.skipped] == [
        ("photo.png", "not a supported format")
    ]
    assert seen and seen[-1].files_done == seen[-1].files_total == 6  # found, not skipped
    assert [x.files_done for x in seen] == sorted(x.files_done for x in seen)
    counts = s.store.counts("Reference")
    assert counts.indexed == 6 and counts.chunks == report.chunks > 0
    assert p.status.text().startswith("Indexed 'Reference'. 6 added, 0 updated, 0 unchanged")
    assert p.counts_label.text() == f"6 files · {counts.chunks} chunks · 1 skipped"
    assert p.when_label.text() != "never"
    assert p.progress.isHidden() and p.index_button.isEnabled()
    dialog = p.show_skipped()
    assert dialog is not None
    row = dialog.tree.topLevelItem(0)
    assert row is not None and dialog.tree.topLevelItemCount() == 1
    assert (row.text(0), row.text(1)) == ("photo.png", "not a supported format")
    dialog.reject()

    assert p.minimumSizeHint().width() <= 340  # fits the side panel without scrolling sideways
    p.resize(340, 720)
    p.show()
    qtbot.waitExposed(p)
    save_shot(p, shots_dir(tmp_path) / "documents-panel.png")

    again = run_index(qtbot, s)  # nothing changed: nothing embedded
    assert (again.added, again.unchanged, again.chunks) == (0, 6, 0)


def test_cancel_mid_index_then_resume(qtbot: QtBot, with_minilm: Setup, tmp_path: Path) -> None:
    s, p = with_minilm, with_minilm.panel
    folder = docs(tmp_path, 24)
    minilm = p.embedding_models()[0]
    assert p.create_collection("Reference", [folder], minilm.path) is None
    first_file: list[None] = []

    def cancel_after_a_file(_name: str, prog: IndexProgress) -> None:
        if prog.chunks and not first_file:
            first_file.append(None)
            p.cancel()

    p.job.progress.connect(cancel_after_a_file)
    cut = run_index(qtbot, s)
    p.job.progress.disconnect(cancel_after_a_file)
    assert cut.cancelled and 0 < cut.added < 24
    assert p.status.text().startswith("Cancelled 'Reference': indexing it again resumes")
    kept = s.store.counts("Reference").indexed
    assert kept == cut.added
    s.store.check("Reference")  # every stored chunk has its vector and FTS row

    rest = run_index(qtbot, s)
    assert not rest.cancelled
    assert (rest.unchanged, rest.added) == (kept, 24 - kept)
    assert s.store.counts("Reference").indexed == 24
    s.store.check("Reference")


def test_change_model_empties_the_index_and_remove_keeps_the_files(
    qtbot: QtBot, with_minilm: Setup, tmp_path: Path
) -> None:
    s, p = with_minilm, with_minilm.panel
    folder = docs(tmp_path, 2)
    minilm = p.embedding_models()[0]
    assert p.create_collection("Reference", [folder], minilm.path) is None
    run_index(qtbot, s)
    assert s.store.counts("Reference").indexed == 2

    # Another copy of the model is another model to the collection: asked, then emptied.
    other = tmp_path / "copy" / "minilm-copy.gguf"
    other.parent.mkdir()
    other.write_bytes(minilm.path.read_bytes())
    s.say_yes = False
    assert not p.change_model(other)
    assert s.store.counts("Reference").indexed == 2
    s.say_yes = True
    assert p.change_model(other)
    assert "Its index is emptied now" in s.answers[-1]
    assert s.store.collection("Reference").model_path == str(other.resolve())
    assert s.store.counts("Reference").files == 0
    assert p.counts_label.text() == "0 files · 0 chunks · 0 skipped"

    more = tmp_path / "more"
    more.mkdir()
    s.folders = [more]
    p.add_folder()
    assert s.store.collection("Reference").roots == (folder.resolve(), more.resolve())
    p.add_folder([tmp_path / "vanished"])
    assert p.status.text() == f"Not found: {tmp_path / 'vanished'}"

    assert p.remove_selected()
    assert "Your files are not touched" in s.answers[-1]
    assert s.store.collections() == []
    assert len(list(folder.glob("*.txt"))) == 2  # the files themselves are still there
    assert not p.empty.isHidden()


def test_window_has_the_documents_tab_wired_to_the_chat(qtbot: QtBot) -> None:
    from app.main import build_window

    w = build_window()
    try:
        pages = w.page_keys()
        # A page of the rail after the models (and downloads, when the window has them).
        assert [p for p in pages if p != "downloads"][2] == "documents"
        docs_panel = w.documents
        assert docs_panel is not None
        assert w.page("documents") is docs_panel
        w.controller.busy_changed.emit(True)
        assert docs_panel.gate.busy
        w.controller.busy_changed.emit(False)
        assert not docs_panel.gate.busy
    finally:
        w.shutdown()
        w.deleteLater()
        QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.mark.slow
@pytest.mark.model
def test_a_new_collection_uses_the_default_model_made_when_it_indexes(
    qtbot: QtBot, tmp_path: Path
) -> None:
    default = DefaultEmbedding(tmp_path / "models")  # the library's folder
    s = Setup(tmp_path, default)
    qtbot.addWidget(s.panel)
    try:
        p = s.panel
        dialog = p.new_collection()
        assert dialog.model.currentIndex() == 0 and dialog.model.currentText() == DEFAULT_LABEL
        assert dialog.model.currentData() == str(default.path) and dialog.message.isHidden()
        notes = tmp_path / "notes"
        notes.mkdir()
        for name, text in NOTES.items():
            (notes / name).write_text(text, encoding="utf-8")
        dialog.name.setText("Notes")
        dialog.add_paths([notes])
        dialog.try_create()  # recorded now; the file is made by the first Index, off this thread
        assert not dialog.isVisible() and not default.path.exists()
        [col] = s.store.collections()
        assert (col.model_name, col.model_path, col.dim) == (
            "all-MiniLM-L6-v2",
            str(default.path.resolve()),
            384,
        )
        with qtbot.waitSignal(p.job.finished, timeout=INDEX_TIMEOUT_MS) as got:
            assert p.index_selected()
            assert "(first making all-MiniLM-L6-v2 from the installed package" in p.status.text()
        report = got.args[1]
        assert report.added == 3 and default.ready()
        # Listed by the library once, and offered once (as the default) from then on.
        assert [e.path for e in p.embedding_models()] == [default.path]
        again = p.new_collection()
        assert [again.model.itemText(i) for i in range(again.model.count())] == [DEFAULT_LABEL]
        again.reject()
    finally:
        s.close()


def test_when_the_default_model_cannot_be_made_indexing_says_why(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(default_embedding, "model_folder", lambda _zip: contextlib.nullcontext())

    def full_disk(_folder: Path, _out: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    default = DefaultEmbedding(tmp_path / "models", write=full_disk)
    s = Setup(tmp_path, default)
    qtbot.addWidget(s.panel)
    try:
        (tmp_path / "notes").mkdir()
        assert s.panel.create_collection("Notes", [tmp_path / "notes"], default.path) is None
        with qtbot.waitSignal(s.panel.job.failed, timeout=INDEX_TIMEOUT_MS):
            assert s.panel.index_selected()
        qtbot.waitUntil(lambda: s.panel.progress.isHidden())
        assert s.panel.status.text() == (
            "Could not index 'Notes': could not make the default embedding model in "
            f"{tmp_path / 'models'}: No space left on device"
        )
        assert not default.path.exists()
    finally:
        s.close()
