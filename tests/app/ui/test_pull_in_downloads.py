"""A pull sent to the desktop's server runs on the Downloads page's own download manager: the
window lists it while it runs and once it is verified."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.local_server import LocalServer, ServeSettings
from app.ui.main_window import MainWindow
from app.ui.model_manager import ModelManagerView
from app.ui.server_panel import ServerPanel
from engine.server import ServerState, ServerThread
from tests.app.ui.test_ui_window import close_window
from tests.hub_emulator import HubEmulator, running_hub, tiny_gguf

REPO = "owner/Tiny-GGUF"
FILE = "Tiny-Q4_K_M.gguf"

pytestmark = pytest.mark.qt_log_ignore(
    "This plugin does not support propagateSizeHints", "This plugin does not support raise"
)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubEmulator]:
    with running_hub() as emu:
        emu.repo(REPO).add(FILE, source=tiny_gguf(tmp_path / "tiny.gguf", name="tiny"))
        monkeypatch.setenv("HF_ENDPOINT", emu.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        yield emu


@pytest.fixture
def window(qtbot: QtBot, hub: HubEmulator) -> Iterator[MainWindow]:
    w = build_window(model_manager=True)
    yield w
    close_window(w)


def _rows(view: ModelManagerView) -> list[tuple[str, str]]:
    t = view.jobs
    return [(t.item(r, 0).text(), t.item(r, 1).text()) for r in range(t.rowCount())]


def test_a_pull_is_listed_on_the_downloads_page(
    qtbot: QtBot, window: MainWindow, hub: HubEmulator
) -> None:
    panel = window.page("server")
    view = window.page("downloads")
    assert isinstance(panel, ServerPanel) and isinstance(view, ModelManagerView)
    store = panel.model_store
    assert store is not None and store.downloads is view.downloads  # type: ignore[attr-defined]
    # The Local server hands the panel's store to its server (what `start` builds).
    local = LocalServer(window.engine.worker.host, "none", ServeSettings(), store=store)
    assert local.state.store is store
    local.stop()

    hub.hold_at[(REPO, FILE)] = 4096
    state = ServerState(ServeSettings(port=0).config(), host=window.engine.worker.host, store=store)
    with ServerThread(state) as srv, httpx.Client(timeout=120) as client:
        with client.stream("POST", srv.url + "/api/pull", json={"model": f"hf.co/{REPO}"}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert '"pulling manifest"' in next(lines)
            assert hub.held.wait(60)
            qtbot.waitUntil(lambda: [f for f, _ in _rows(view)] == [FILE], timeout=10_000)
            hub.released.set()
            assert '"success"' in list(lines)[-1]
        qtbot.waitUntil(lambda: _rows(view) == [(FILE, "verified")], timeout=10_000)
        assert any(
            m["model"] == f"hf.co/{REPO}:latest"
            for m in client.get(srv.url + "/api/tags").json()["models"]
        )
    state.close()
