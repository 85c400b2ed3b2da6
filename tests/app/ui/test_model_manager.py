"""The model manager view with pytest-qt, against the local Hub emulator and the real engine:
search -> files -> download -> appears in the library -> load."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from keyring.backends import fail
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.services.download_manager import DownloadManager
from app.services.hub import HubClient, header_fit
from app.services.library import ModelLibrary
from app.services.secrets import TokenStore
from app.ui.model_manager import ModelManagerView
from engine.host.runtime import Model
from engine.memory.hardware import GiB, cpu_only
from engine.model.gguf import human_bytes
from engine.settings import LoadParams, SamplingParams
from tests.hub_emulator import HubEmulator, running_hub, tiny_gguf

REPO = "bartowski/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"


@pytest.fixture
def hub(smollm2_path: Path) -> Iterator[HubEmulator]:
    with running_hub() as emu:
        r = emu.repo(REPO, downloads=10)
        r.add(FILE, source=smollm2_path)
        r.add("SmolLM2-135M-Instruct-Q8_0.gguf", data=b"q" * 4096)
        yield emu


class Setup:
    def __init__(self, url: str, tmp: Path, *, token_store: TokenStore | None = None) -> None:
        self.answers: list[str] = []
        self.pick: tuple[Path, str] | None = None
        self.tokens = token_store or TokenStore(fail.Keyring())  # type: ignore[no-untyped-call]
        self.hub = HubClient(url, fit=header_fit(cpu_only(8 * GiB)), token=self.tokens.get)
        self.library = ModelLibrary(tmp / "models", discovery=False)
        self.downloads = DownloadManager(
            self.library.downloads_state, self.hub, cache_dir=tmp / "hf" / "hub", read_timeout=1.0
        )
        self.view = ModelManagerView(
            self.hub,
            self.downloads,
            self.library,
            self.tokens,
            confirm=self.confirm,
            pick_file=lambda: self.pick,
        )  # type: ignore[arg-type,return-value]

    def confirm(self, title: str, text: str) -> bool:
        self.answers.append(text)
        return True

    def close(self) -> None:
        self.view.shutdown()
        self.downloads.close()


@pytest.fixture
def ui(qtbot: QtBot, hub: HubEmulator, tmp_path: Path) -> Iterator[Setup]:
    s = Setup(hub.url, tmp_path)
    qtbot.addWidget(s.view)
    yield s
    s.close()


def cells(table: object, col: int) -> list[str]:
    t = table  # QTableWidget
    return [t.item(r, col).text() for r in range(t.rowCount())]  # type: ignore[attr-defined]


def search_and_open(qtbot: QtBot, s: Setup) -> None:
    qtbot.keyClicks(s.view.query, "smol")
    qtbot.mouseClick(s.view.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: s.view.results.rowCount() == 1, timeout=10_000)
    assert cells(s.view.results, 0) == [REPO]
    s.view.results.selectRow(0)
    qtbot.waitUntil(lambda: s.view.files.rowCount() == 2, timeout=10_000)


def test_search_files_download_library_load(qtbot: QtBot, ui: Setup, smollm2_path: Path) -> None:
    search_and_open(qtbot, ui)
    v = ui.view
    names = cells(v.files, 0)
    row = names.index(FILE)
    assert cells(v.files, 1)[row] == "Q4_1"
    assert v.files.item(row, 2).toolTip() == f"{smollm2_path.stat().st_size:,} bytes"
    # The fit badge arrives after the list, from a header read over HTTP Range.
    qtbot.waitUntil(lambda: cells(v.files, 3)[row] == "RAM only", timeout=20_000)
    assert "license: apache-2.0" in v.repo_info.text()

    v.files.selectRow(row)
    assert v.download_button.isEnabled()
    with qtbot.waitSignal(v.library_changed, timeout=60_000):
        qtbot.mouseClick(v.download_button, Qt.MouseButton.LeftButton)
    assert cells(v.jobs, 1) == ["verified"]
    sources = cells(v.local, 1)
    assert "downloaded" in sources
    entry_row = sources.index("downloaded")
    assert cells(v.local, 4)[entry_row] == f"{REPO}/{FILE}"

    v.local.selectRow(entry_row)
    with qtbot.waitSignal(v.load_requested, timeout=5_000) as sig:
        qtbot.mouseClick(v.load_button, Qt.MouseButton.LeftButton)
    path = sig.args[0]
    assert isinstance(path, Path) and path.parent.parent.name == "snapshots"
    # The downloaded file really runs in the engine.
    with Model(path, LoadParams(n_ctx=256, n_threads=2)) as model:
        gen = model.complete(
            "The capital of France is", SamplingParams(temperature=0, max_tokens=4)
        )
        text = "".join(gen)
    assert text.strip() and gen.stats is not None and gen.stats.gen_tokens > 0


def test_pause_resume_cancel_from_the_view(
    qtbot: QtBot, ui: Setup, hub: HubEmulator, tmp_path: Path
) -> None:
    hub.hold_at[(REPO, FILE)] = 8_000_000
    search_and_open(qtbot, ui)
    v = ui.view
    v.files.selectRow(cells(v.files, 0).index(FILE))
    qtbot.mouseClick(v.download_button, Qt.MouseButton.LeftButton)
    assert hub.held.wait(30)
    qtbot.waitUntil(lambda: cells(v.jobs, 1) == ["downloading"], timeout=10_000)
    v.jobs.selectRow(0)
    qtbot.mouseClick(v.pause_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: cells(v.jobs, 1) == ["paused"], timeout=20_000)
    partial = ui.downloads.jobs()[0].done_bytes
    assert 0 < partial <= 8_000_000
    assert cells(v.jobs, 2)[0].startswith(human_bytes(partial) + " / ")
    v.jobs.selectRow(0)
    qtbot.mouseClick(v.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: v.jobs.rowCount() == 0, timeout=10_000)
    assert not [p for p in (tmp_path / "hf").rglob("*") if p.is_file()]


def test_corrupt_download_is_reported_and_not_listed(
    qtbot: QtBot, ui: Setup, hub: HubEmulator
) -> None:
    hub.corrupt.add((REPO, FILE))
    search_and_open(qtbot, ui)
    v = ui.view
    v.files.selectRow(cells(v.files, 0).index(FILE))
    with qtbot.waitSignal(v.status_changed, timeout=60_000) as sig:
        qtbot.mouseClick(v.download_button, Qt.MouseButton.LeftButton)
    assert "corrupt" in sig.args[0]
    assert cells(v.jobs, 1) == ["failed"]
    assert "downloaded" not in cells(v.local, 1)


def test_offline_hub_view_says_so_and_library_works(qtbot: QtBot, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    s = Setup(url, tmp_path)
    qtbot.addWidget(s.view)
    try:
        s.view.query.setText("llama")
        with qtbot.waitSignal(s.view.status_changed, timeout=20_000) as sig:
            s.view.search()
        assert sig.args[0].startswith("Offline")
        assert "default" in " ".join(cells(s.view.local, 0))
    finally:
        s.close()


def test_import_and_delete_from_the_view(qtbot: QtBot, ui: Setup, tmp_path: Path) -> None:
    v = ui.view
    src = tiny_gguf(tmp_path / "mine" / "Mine-F16.gguf", "mine")
    ui.pick = (src, "copy")
    with qtbot.waitSignal(v.library_changed, timeout=10_000):
        qtbot.mouseClick(v.import_button, Qt.MouseButton.LeftButton)
    assert v.select_library_entry("mine-f16")
    copy = tmp_path / "models" / "Mine-F16.gguf"
    assert copy.exists()
    with qtbot.waitSignal(v.library_changed, timeout=5_000):
        qtbot.mouseClick(v.delete_button, Qt.MouseButton.LeftButton)
    assert ui.answers and "frees" in ui.answers[-1]
    assert not copy.exists() and src.exists()
    assert "freed" in v.library_status.text()
    # The bundled model is refused with a reason, nothing asked.
    assert v.select_library_entry("default")
    asked = len(ui.answers)
    qtbot.mouseClick(v.delete_button, Qt.MouseButton.LeftButton)
    assert "cannot be deleted" in v.library_status.text() and len(ui.answers) == asked


def test_token_field_session_only_and_gated_download(
    qtbot: QtBot, tmp_path: Path, smollm2_path: Path, candlewick_home: Path
) -> None:
    secret = "hf_UiSecretToken987"
    with running_hub() as emu:
        emu.repo("google/gated-GGUF", gated=True, granted_tokens={secret}).add(
            "g-Q4_1.gguf", data=b"GGUF" + b"\0" * 100
        )
        s = Setup(emu.url, candlewick_home / "data")
        qtbot.addWidget(s.view)
        try:
            v = s.view
            assert "session only" in v.token_status.text()
            v.open_repo("google/gated-GGUF")
            qtbot.waitUntil(lambda: v.files.rowCount() == 1, timeout=10_000)
            assert "Gated" in v.repo_info.text()
            v.files.selectRow(0)
            with qtbot.waitSignal(v.status_changed, timeout=20_000) as sig:
                v.download_selected()
            assert "accept its conditions" in sig.args[0]
            qtbot.keyClicks(v.token, secret)
            qtbot.mouseClick(v.save_token_button, Qt.MouseButton.LeftButton)
            assert "this session only" in v.token_status.text()
            assert v.token.text() == ""  # the field does not keep it
            v.jobs.selectRow(0)
            qtbot.mouseClick(v.resume_button, Qt.MouseButton.LeftButton)
            qtbot.waitUntil(lambda: cells(v.jobs, 1) == ["verified"], timeout=20_000)
        finally:
            s.close()
    for f in candlewick_home.rglob("*"):
        if f.is_file() and not f.is_symlink():
            assert secret.encode() not in f.read_bytes(), f


def test_downloads_list_survives_a_restart(qtbot: QtBot, hub: HubEmulator, tmp_path: Path) -> None:
    hub.hold_at[(REPO, FILE)] = 6_000_000
    first = Setup(hub.url, tmp_path)
    qtbot.addWidget(first.view)
    try:
        first.view.open_repo(REPO)
        qtbot.waitUntil(lambda: first.view.files.rowCount() == 2, timeout=10_000)
        first.view.files.selectRow(cells(first.view.files, 0).index(FILE))
        first.view.download_selected()
        assert hub.held.wait(30)
    finally:
        first.close()  # the app quits mid-download
    hub.released.set()
    del hub.hold_at[(REPO, FILE)]
    second = Setup(hub.url, tmp_path)  # and starts again
    qtbot.addWidget(second.view)
    try:
        v = second.view
        assert cells(v.jobs, 0) == [FILE] and cells(v.jobs, 1) == ["paused"]
        assert v.jobs.item(0, 1).toolTip() == "interrupted when the app closed"
        v.jobs.selectRow(0)
        with qtbot.waitSignal(v.library_changed, timeout=60_000):
            qtbot.mouseClick(v.resume_button, Qt.MouseButton.LeftButton)
        assert cells(v.jobs, 1) == ["verified"] and "downloaded" in cells(v.local, 1)
    finally:
        second.close()
