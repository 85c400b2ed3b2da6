"""The Models page with a speech-to-text model, against the local Hub emulator: a speech
search finds whisper.cpp's repository, its files are speech variants, a download appears
under "Speech to text" (not among the chat's models) with its memory, and it is chosen as
the transcription model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from keyring.backends import fail
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.services.download_manager import DownloadManager
from app.services.hub import HubClient
from app.services.library import ModelLibrary
from app.services.secrets import TokenStore
from app.services.speech_models import current_stt_model
from app.ui.model_manager import ModelManagerView
from app.ui.speech_models_box import NONE_CHOSEN
from engine.memory.whisper import memory_of, whisper_memory
from engine.model.gguf import human_bytes
from engine.model.whisper_file import HEADER_BYTES, parse_hparams, read_whisper
from tests.app.test_speech_models_cli import REPO, TINY_HP, TINY_Q5
from tests.hub_emulator import HubEmulator, running_hub
from tests.whisper_bin import whisper_bytes


@pytest.fixture
def hub() -> Iterator[HubEmulator]:
    with running_hub() as emu:
        r = emu.repo(REPO, downloads=10, tags=["automatic-speech-recognition"])
        r.add(TINY_Q5, data=whisper_bytes({**TINY_HP, "ftype": 1009}, vocab=[b"b"]))
        yield emu


@pytest.fixture
def view(qtbot: QtBot, hub: HubEmulator, tmp_path: Path) -> Iterator[ModelManagerView]:
    tokens = TokenStore(fail.Keyring())  # type: ignore[no-untyped-call]
    client = HubClient(hub.url, token=tokens.get)
    library = ModelLibrary(tmp_path / "models", discovery=False, bundled=False)
    downloads = DownloadManager(library.downloads_state, client, cache_dir=tmp_path / "hf" / "hub")
    v = ModelManagerView(client, downloads, library, tokens)
    qtbot.addWidget(v)
    yield v
    v.shutdown()
    downloads.close()


def cells(table: object, col: int) -> list[str]:
    return [table.item(r, col).text() for r in range(table.rowCount())]  # type: ignore[attr-defined]


def test_download_appears_as_speech_to_text_and_is_chosen(
    qtbot: QtBot, view: ModelManagerView, hub: HubEmulator
) -> None:
    box = view.speech
    qtbot.waitUntil(lambda: box.status.text() == NONE_CHOSEN, timeout=5_000)
    qtbot.keyClicks(view.query, "whisper")
    view.speech_search.setChecked(True)
    qtbot.mouseClick(view.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: view.results.rowCount() == 1, timeout=10_000)
    view.results.selectRow(0)
    qtbot.waitUntil(lambda: view.files.rowCount() == 1, timeout=10_000)
    assert cells(view.files, 0) == [TINY_Q5]
    assert cells(view.files, 1) == ["Q5_1"]
    # Before the download: the memory whisper.cpp will take, from the file's first bytes.
    size = hub.repos[REPO].files[TINY_Q5].size
    head = hub.repos[REPO].files[TINY_Q5].read(0, HEADER_BYTES)
    before = memory_of(parse_hparams(head, TINY_Q5), size).total
    badge = f"speech to text · needs {human_bytes(before)}"
    qtbot.waitUntil(lambda: cells(view.files, 3) == [badge], timeout=10_000)

    view.files.selectRow(0)
    with qtbot.waitSignal(view.library_changed, timeout=60_000):
        qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: box.table.rowCount() == 1, timeout=10_000)
    assert view.local.rowCount() == 0  # never among the chat's models
    entry = box.entries[0]
    memory = whisper_memory(read_whisper(entry.path))
    assert cells(box.table, 0) == ["ggml-tiny-q5_1"]
    assert cells(box.table, 1) == ["whisper tiny (multilingual)"]
    assert cells(box.table, 2) == ["Q5_1"]
    assert cells(box.table, 4) == [human_bytes(memory.total)]
    assert f"weights {human_bytes(memory.weights)}" in box.table.item(0, 4).toolTip()
    assert cells(box.table, 5) == [f"{REPO}/{TINY_Q5}"]

    assert not box.use_button.isEnabled()
    box.table.selectRow(0)
    assert box.use_button.isEnabled()
    with qtbot.waitSignal(box.chosen_changed, timeout=5_000) as sig:
        qtbot.mouseClick(box.use_button, Qt.MouseButton.LeftButton)
    assert sig.args == [entry.path]
    assert current_stt_model() == entry.path
    qtbot.waitUntil(lambda: cells(box.table, 0) == ["ggml-tiny-q5_1  ✓"], timeout=5_000)
    assert f"needs about {human_bytes(memory.total)}" in box.status.text()

    with qtbot.waitSignal(box.chosen_changed, timeout=5_000) as none:
        qtbot.mouseClick(box.clear_button, Qt.MouseButton.LeftButton)
    assert none.args == [None] and current_stt_model() is None
    qtbot.waitUntil(lambda: box.status.text() == NONE_CHOSEN, timeout=5_000)

    # Deleted after the page's confirmation: the file and its row go.
    asked: list[str] = []
    box._confirm = lambda _title, text: asked.append(text) or True
    box.table.selectRow(0)
    freed = entry.path.stat().st_size
    with qtbot.waitSignal(box.deleted, timeout=5_000):
        qtbot.mouseClick(box.delete_button, Qt.MouseButton.LeftButton)
    assert asked and str(entry.path) in asked[0]
    qtbot.waitUntil(lambda: box.table.rowCount() == 0, timeout=5_000)
    assert not entry.path.exists()
    assert (
        box.status.text() == f"Deleted ggml-tiny-q5_1, freed {human_bytes(freed)}. " + NONE_CHOSEN
    )
