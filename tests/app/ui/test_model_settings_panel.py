"""The library panel starts from the settings saved for the selected model (or the defaults)
and says which; it saves what the user changes or loads with while "Remember for this model"
is on; the desktop's on-demand loads (Local server) read the same store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from pytestqt.qtbot import QtBot

from app.main import on_demand_params
from app.services.library import DEFAULT_MODEL_ID, ModelLibrary
from app.services.model_settings import DEFAULT, SAVED, ModelSettingsStore
from app.ui.library_model import LibraryModel
from app.ui.library_panel import SETTINGS_GROUP, LibraryPanel, settings_key
from engine.settings import LoadParams

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.fixture
def library(tmp_path: Path, smollm2_path: Path, gemma_path: Path) -> ModelLibrary:
    lib = ModelLibrary(tmp_path / "models", bundled=smollm2_path, discovery=False)
    lib.import_file(gemma_path)
    return lib


@pytest.fixture
def store(tmp_path: Path) -> ModelSettingsStore:
    return ModelSettingsStore(tmp_path / "config" / "model_settings.json")


@pytest.fixture
def ini(tmp_path: Path) -> QSettings:
    return QSettings(str(tmp_path / "window.ini"), QSettings.Format.IniFormat)


def make_panel(
    qtbot: QtBot, library: ModelLibrary, store: ModelSettingsStore, ini: QSettings
) -> LibraryPanel:
    panel = LibraryPanel(LibraryModel(library.entries()), None, settings=ini, model_settings=store)
    qtbot.addWidget(panel)
    return panel


def gemma_id(library: ModelLibrary, gemma_path: Path) -> str:
    return next(e.id for e in library.entries() if e.path.name == gemma_path.name)


def test_panel_prefills_from_the_saved_settings_and_says_so(
    qtbot: QtBot,
    library: ModelLibrary,
    store: ModelSettingsStore,
    ini: QSettings,
    smollm2_path: Path,
    gemma_path: Path,
) -> None:
    store.save(
        smollm2_path,
        {"n_ctx": 1024, "type_k": "q8_0", "type_v": "q8_0", "flash_attn": "on", "top_k": 7},
    )
    panel = make_panel(qtbot, library, store, ini)
    assert panel.select(DEFAULT_MODEL_ID)
    p = panel.load_params()
    assert (p.n_ctx, p.type_k, p.type_v, p.flash_attn) == (1024, "q8_0", "q8_0", "on")
    assert panel.settings_source.text() == "Settings: saved for this model"
    assert panel.remember.isChecked()

    gemma = gemma_id(library, gemma_path)
    assert panel.select(gemma)
    d = LoadParams()
    p = panel.load_params()
    assert (p.n_ctx, p.type_k, p.type_v, p.flash_attn) == (d.n_ctx, d.type_k, d.type_v, "auto")
    assert panel.settings_source.text() == "Settings: defaults"
    assert store.get(gemma_path).source == DEFAULT  # looking is not saving

    panel.set_context_length(2048)  # the user's change is remembered for this model
    assert store.get(gemma_path).saved["n_ctx"] == 2048
    assert panel.settings_source.text() == "Settings: saved for this model"

    panel.remember.setChecked(False)  # forgotten, and changes are not saved
    assert store.get(gemma_path).source == DEFAULT
    assert panel.settings_source.text() == "Settings: defaults"
    panel.type_k.setCurrentText("q8_0")
    assert store.get(gemma_path).source == DEFAULT

    # Loading with Remember on saves what it loads with; the sampling defaults stay.
    panel.remember.setChecked(True)
    assert panel.select(DEFAULT_MODEL_ID)
    panel.set_context_length(1536)
    loads: list[tuple[object, object]] = []
    panel.load_requested.connect(lambda path, params: loads.append((path, params)))
    panel.load_button.click()
    assert len(loads) == 1 and isinstance(loads[0][1], LoadParams)
    assert loads[0][1].n_ctx == 1536
    saved = store.get(smollm2_path).saved
    assert (saved["n_ctx"], saved["type_k"], saved["top_k"]) == (1536, "q8_0", 7)

    # A new panel on the same profile shows the same.
    again = make_panel(qtbot, library, store, ini)
    assert again.select(DEFAULT_MODEL_ID)
    assert again.load_params().n_ctx == 1536
    assert store.get(smollm2_path).source == SAVED


def test_settings_of_the_window_file_move_to_the_store(
    qtbot: QtBot,
    library: ModelLibrary,
    store: ModelSettingsStore,
    ini: QSettings,
    smollm2_path: Path,
) -> None:
    key = f"{SETTINGS_GROUP}/{settings_key(smollm2_path)}"
    old = {"n_ctx": 512, "gpu_layers": 0, "type_k": "q9", "speculative": "off"}
    ini.setValue(key, json.dumps(old))
    panel = make_panel(qtbot, library, store, ini)
    assert panel.select(DEFAULT_MODEL_ID)
    assert panel.load_params().n_ctx == 512
    # The value a store refuses is left at its default, the others move.
    assert dict(store.get(smollm2_path).saved) == {
        "n_ctx": 512,
        "n_gpu_layers": 0,
        "speculative": "off",
    }
    assert ini.value(key) is None


def test_the_local_servers_on_demand_loads_use_the_saved_settings(
    library: ModelLibrary, store: ModelSettingsStore, ini: QSettings, smollm2_path: Path
) -> None:
    ini.setValue("server/parallel", 2)
    ini.setValue("server/ctx", 1024)
    entry = library.entry(DEFAULT_MODEL_ID)
    params = on_demand_params(ini, store)
    assert params(entry) == LoadParams(n_ctx=2048, n_seq_max=2)  # nothing saved
    store.save(smollm2_path, {"n_ctx": 512, "type_k": "q8_0", "speculative": "lookup"})
    p = params(entry)
    # A saved context is each slot's; drafting stays the chat's.
    assert (p.n_ctx, p.n_seq_max, p.type_k, p.speculative) == (1024, 2, "q8_0", None)
