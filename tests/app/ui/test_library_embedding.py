"""An embedding GGUF in the library says so (the library table and the model manager's list),
is never offered as a draft model, and cannot be loaded as the chat's model: Load is off with a
one-line reason, in both places."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from keyring.backends import fail
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.services.download_manager import DownloadManager
from app.services.hub import HubClient
from app.services.library import DEFAULT_MODEL_ID, LibraryEntry, ModelLibrary
from app.services.secrets import TokenStore
from app.ui.library_model import LibraryModel
from app.ui.library_panel import LibraryPanel
from app.ui.model_manager import ModelManagerView

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.fixture
def library(tmp_path: Path, minilm_path: Path) -> tuple[ModelLibrary, LibraryEntry]:
    lib = ModelLibrary(tmp_path / "models", discovery=False)
    return lib, lib.import_file(minilm_path)


def name_cell(model: LibraryModel, entry_id: str, role: Qt.ItemDataRole) -> str:
    return str(model.data(model.index(model.row_of(entry_id), 0), role))


def test_library_table_marks_the_embedding_model_and_refuses_to_load_it(
    qtbot: QtBot, library: tuple[ModelLibrary, LibraryEntry]
) -> None:
    lib, minilm = library
    model = LibraryModel(lib.entries())
    panel = LibraryPanel(model, None)
    qtbot.addWidget(panel)
    display = Qt.ItemDataRole.DisplayRole
    assert name_cell(model, minilm.id, display) == f"{minilm.name} (embedding)"
    assert name_cell(model, DEFAULT_MODEL_ID, display) == lib.entry(DEFAULT_MODEL_ID).name
    assert "Documents tab" in name_cell(model, minilm.id, Qt.ItemDataRole.ToolTipRole)
    # Renaming edits the name, not the tag.
    assert name_cell(model, minilm.id, Qt.ItemDataRole.EditRole) == minilm.name
    drafts = [panel.draft_model.itemData(i) for i in range(panel.draft_model.count())]
    assert str(minilm.path) not in drafts and drafts

    requested: list[object] = []
    panel.load_requested.connect(lambda path, _params: requested.append(path))
    assert panel.select(minilm.id)
    assert not panel.load_button.isEnabled()
    assert not panel.kind_note.isHidden()
    assert panel.kind_note.text() == (
        f"{minilm.name} is an embedding model: it is for your documents (the Documents tab), "
        "not for chat"
    )
    panel._request_load()  # as a shortcut would: still refused
    assert requested == []

    assert panel.select(DEFAULT_MODEL_ID)
    assert panel.load_button.isEnabled() and panel.kind_note.isHidden()
    panel.load_button.click()
    assert requested == [lib.entry(DEFAULT_MODEL_ID).path]


@pytest.fixture
def manager(
    qtbot: QtBot, tmp_path: Path, library: tuple[ModelLibrary, LibraryEntry]
) -> Iterator[ModelManagerView]:
    lib, _ = library
    tokens = TokenStore(fail.Keyring())  # type: ignore[no-untyped-call]
    hub = HubClient("http://127.0.0.1:9", token=tokens.get)
    downloads = DownloadManager(lib.downloads_state, hub, cache_dir=tmp_path / "hf" / "hub")
    view = ModelManagerView(hub, downloads, lib, tokens)
    qtbot.addWidget(view)
    yield view
    view.shutdown()
    downloads.close()


def test_model_manager_marks_it_and_says_it_is_for_documents(
    manager: ModelManagerView, library: tuple[ModelLibrary, LibraryEntry]
) -> None:
    _, minilm = library
    manager.refresh_library()
    items = [manager.local.item(r, 0) for r in range(manager.local.rowCount())]
    names = [item.text() for item in items if item is not None]
    assert f"{minilm.name} (embedding)  [{minilm.id}]" in names
    assert not any("(embedding)" in n for n in names if minilm.id not in n)
    loads: list[object] = []
    manager.load_requested.connect(loads.append)
    assert manager.select_library_entry(minilm.id)
    manager.load_button.click()
    assert loads == []
    assert manager.library_status.text().startswith(f"{minilm.name} is an embedding model")
    assert manager.select_library_entry(DEFAULT_MODEL_ID)
    manager.load_button.click()
    assert loads == [manager.library.entry(DEFAULT_MODEL_ID).path]


def test_a_reranker_is_marked_refused_as_chat_model_and_never_a_draft(
    qtbot: QtBot, tmp_path: Path, reranker_path: Path
) -> None:
    lib = ModelLibrary(tmp_path / "models", discovery=False)
    rerank = lib.import_file(reranker_path)
    model = LibraryModel(lib.entries())
    panel = LibraryPanel(model, None)
    qtbot.addWidget(panel)
    assert name_cell(model, rerank.id, Qt.ItemDataRole.DisplayRole) == f"{rerank.name} (reranker)"
    assert "Rerank with" in name_cell(model, rerank.id, Qt.ItemDataRole.ToolTipRole)
    drafts = [panel.draft_model.itemData(i) for i in range(panel.draft_model.count())]
    assert str(rerank.path) not in drafts and drafts

    requested: list[object] = []
    panel.load_requested.connect(lambda path, _params: requested.append(path))
    assert panel.select(rerank.id)
    assert not panel.load_button.isEnabled() and not panel.kind_note.isHidden()
    assert panel.kind_note.text() == (
        f"{rerank.name} is a reranker: it cannot chat; it re-sorts the passages a chat's "
        "documents search finds (Chat settings → Rerank with)"
    )
    panel._request_load()
    assert requested == []
