"""The predicted decode speed beside the fit badge: the Hub page's Speed column (its tooltip
says what it is based on) and the chat's model bar (with the measured speed once known).
Model-free: probe-sized GGUF files and a simulated machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from keyring.backends import fail
from pytestqt.qtbot import QtBot

from app.services.download_manager import DownloadManager
from app.services.hub import HubClient, header_fit, header_speed
from app.services.library import LibraryEntry, ModelLibrary
from app.services.secrets import TokenStore
from app.services.speed_records import SpeedService, SpeedView, file_key
from app.ui.library_model import LibraryModel
from app.ui.model_bar import ModelBar
from app.ui.model_manager import ModelManagerView
from engine.bench.speed_probe import SpeedProfile, write_probe_model
from engine.memory.hardware import GiB, cpu_only
from engine.settings import LoadParams, SamplingParams
from tests.app.ui.test_ui_window import close_window, open_window, send, wait_idle
from tests.hub_emulator import running_hub
from tests.speed_machine import QUIET, SimulatedDecoder, sim_settings

REPO = "someone/Probe-GGUF"
NAME = "probe-Q8_0.gguf"

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def test_model_bar_shows_predicted_and_measured_speed(qtbot: QtBot, tmp_path: Path) -> None:
    entries = [
        LibraryEntry("a", tmp_path / "a.gguf", "imported"),
        LibraryEntry("b", tmp_path / "b.gguf", "imported"),
        LibraryEntry("c", tmp_path / "c.gguf", "imported"),
    ]
    bar = ModelBar(LibraryModel(entries), None, LoadParams)
    qtbot.addWidget(bar)
    bar.show()
    bar.set_selected(entries[0])
    assert bar.speed.isHidden()  # no source: nothing said

    def source(path: Path) -> SpeedView | None:
        if path.name == "a.gguf":
            return SpeedView(45.2, "Predicted from the tensor table.", 43.0, 3, "chat")
        if path.name == "c.gguf":
            raise OSError("gone")
        return None

    bar.set_speed_source(source)
    assert bar.speed.isVisible() and bar.speed.text() == "~45 tok/s · measured 43"
    assert "Predicted from the tensor table." in bar.speed.toolTip()
    assert "median of 3 chat replies" in bar.speed.toolTip()
    bar.set_selected(entries[1])  # nothing known about it
    assert bar.speed.isHidden()
    bar.set_selected(entries[2])  # unreadable: no badge, no error
    assert bar.speed.isHidden()


@pytest.fixture
def view(qtbot: QtBot, tmp_path: Path) -> Iterator[tuple[ModelManagerView, SimulatedDecoder]]:
    src = tmp_path / "src" / NAME
    src.parent.mkdir()
    write_probe_model(src, n_layer=4, n_embd=256, n_ff=512, type_name="Q8_0")
    sim = SimulatedDecoder(1e-4, 5e-4, {"F32": 1e12, "Q8_0": 8e9})
    profile = SpeedProfile(
        tmp_path / "data" / "p.json",
        sim_settings(),
        timer=sim,
        chat_timer=sim.chat,
        bandwidth=lambda: 2e10,
        load=QUIET,
    )
    speed = SpeedService(tmp_path / "data", profile)
    with running_hub() as emu:
        emu.repo(REPO).add(NAME, source=src)
        tokens = TokenStore(fail.Keyring())  # type: ignore[no-untyped-call]
        hub = HubClient(emu.url, fit=header_fit(cpu_only(8 * GiB)), speed=header_speed(speed))
        library = ModelLibrary(tmp_path / "models", discovery=False)
        downloads = DownloadManager(library.downloads_state, hub, cache_dir=tmp_path / "hf")
        v = ModelManagerView(hub, downloads, library, tokens)
        qtbot.addWidget(v)
        yield v, sim
        v.shutdown()
        downloads.close()


def test_hub_files_show_the_predicted_speed_with_its_basis(
    qtbot: QtBot, view: tuple[ModelManagerView, SimulatedDecoder]
) -> None:
    v, sim = view
    assert v.files.horizontalHeaderItem(4).text() == "Speed"
    v.open_repo(REPO)
    qtbot.waitUntil(lambda: v.files.rowCount() == 1, timeout=10_000)
    assert v.files.item(0, 0).text() == NAME
    qtbot.waitUntil(lambda: v.files.item(0, 4).text().endswith("tok/s"), timeout=20_000)
    cell = v.files.item(0, 4)
    assert cell.text().startswith("~")
    tip = cell.toolTip()
    assert "Predicted on this machine" in tip and "threads" in tip and "MiB read per token" in tip
    qtbot.waitUntil(lambda: v.files.item(0, 3).text() == "RAM only", timeout=20_000)
    # The probe ran once: fixed work, then the file's kernel on a large matrix and at its
    # layers' width class.
    assert len(sim.calls) == 4
    qtbot.waitUntil(lambda: not v.busy, timeout=10_000)


@pytest.mark.model
def test_a_chat_reply_records_its_decode_speed_beside_the_prediction(qtbot: QtBot) -> None:
    w = open_window(qtbot, SamplingParams(temperature=0.0, max_tokens=40))
    try:
        assert w.speed is not None
        send(qtbot, w, "Write a short story about a lighthouse keeper.")
        wait_idle(qtbot, w)
        loaded = w.controller.loaded
        assert loaded is not None
        key = file_key(loaded.path.name, loaded.path.stat().st_size)
        measured = w.speed.records.get(key)["measured"]
        assert measured["source"] == "chat" and measured["tokens_per_s"] > 0
        # The model bar says it (no prediction yet: this machine was never probed here).
        assert w.model_bar.speed.text() == f"measured {measured['tokens_per_s']:.0f}"
        assert "median of 1 chat reply;" in w.model_bar.speed.toolTip()
    finally:
        close_window(w)
