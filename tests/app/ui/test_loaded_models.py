"""The Loaded models window over a real model host: SmolLM2 and Gemma loaded on demand (as
API requests load them), the chat's own model beside them; countdowns, pins and Eject.

The host runs on a clock of the test's own, so a countdown moves by exactly what the test
advances it, without waiting minutes."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.library import ModelLibrary
from app.services.model_catalog import CHAT_OWNER
from app.services.secrets import SecretStore
from app.ui.loaded_models import (
    CHAT_EJECT_TIP,
    ON_DEMAND,
    LoadedModelsModel,
    LoadedModelsView,
    memory_text,
)
from app.ui.server_panel import ServerPanel
from engine.host.host import Loadable, ModelHost
from engine.host.host_entry import HostedModel
from engine.host.runtime import Model
from engine.settings import LoadParams, SamplingParams
from tests.memory_keyring import MemoryKeyring

pytestmark = pytest.mark.qt_log_ignore(
    "This plugin does not support propagateSizeHints", "This plugin does not support raise"
)

PARAMS = LoadParams(n_ctx=512, n_threads=2)
CHAT = "smollm2-the-chats"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def host(smollm2_path: Path, gemma_path: Path, clock: Clock) -> Iterator[ModelHost]:
    catalog = [
        Loadable("smollm2", smollm2_path, PARAMS, aliases=("smol",), title="SmolLM2"),
        Loadable("gemma", gemma_path, PARAMS, title="Gemma 3 270M"),
    ]
    host = ModelHost(lambda: catalog, clock=clock)
    yield host
    host.close()


@pytest.fixture
def view(qtbot: QtBot, host: ModelHost) -> Iterator[tuple[LoadedModelsView, list[str]]]:
    ejected: list[str] = []
    v = LoadedModelsView(
        host,
        title=lambda h: {"smollm2": "SmolLM2", "gemma": "Gemma"}.get(h.name),
        eject_chat=lambda: ejected.append("chat"),
    )
    qtbot.addWidget(v)
    v.show()
    yield v, ejected
    v.shutdown()


def cell(v: LoadedModelsView, name: str, column: str) -> str:
    row = v.model.row_of(name)
    assert row >= 0, f"{name} is not listed"
    return v.model.text(row, LoadedModelsModel.COLUMNS.index(column))


def hosted(host: ModelHost, name: str) -> HostedModel:
    return next(h for h in host.hosted() if h.name == name)


def save_shot(widget: QWidget, tmp_path: Path) -> None:
    """The window's picture: in docs/screenshots when CANDLEWICK_SCREENSHOTS names it."""
    QApplication.processEvents()
    folder = Path(os.environ.get("CANDLEWICK_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "loaded_models.png"
    assert widget.grab().save(str(path))
    assert path.stat().st_size > 5_000  # a picture, not an empty grab


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_on_demand_models_countdown_pin_and_eject(
    qtbot: QtBot,
    qtmodeltester: object,
    host: ModelHost,
    clock: Clock,
    view: tuple[LoadedModelsView, list[str]],
    smollm2_path: Path,
) -> None:
    v, ejected = view
    assert v.model.rowCount() == 0 and v.summary.text() == "No model loaded"
    # As two API requests would: load on demand, answer, let go.
    host.acquire("smol").release()
    host.acquire("gemma").release()
    qtbot.waitUntil(lambda: v.model.rowCount() == 2)
    for name, title in (("smollm2", "SmolLM2"), ("gemma", "Gemma")):
        h = hosted(host, name)
        assert h.memory and all(n > 0 for n in h.memory.values())
        assert cell(v, name, "Model") == title
        assert cell(v, name, "State") == "ready"
        assert cell(v, name, "Used by") == ON_DEMAND
        assert cell(v, name, "Memory") == memory_text(h.memory)
        assert cell(v, name, "Unloads in") == "5:00"  # the host's default keep-alive
    if set(hosted(host, "gemma").memory) == {"CPU"}:
        assert cell(v, "gemma", "Memory").startswith("RAM ")
    assert v.summary.text().startswith("2 models · ")
    qtmodeltester.check(v.model)  # type: ignore[attr-defined]

    # The countdown moves with the host's clock, read by the window's own timer.
    clock.now += 28.5
    qtbot.waitUntil(lambda: cell(v, "smollm2", "Unloads in") == "4:32", timeout=3000)
    assert cell(v, "gemma", "Unloads in") == "4:32"

    # A request in flight: counted, and the countdown waits for it to end.
    lease = host.acquire("gemma")
    v.refresh()
    assert cell(v, "gemma", "Used by") == f"{ON_DEMAND}, 1 request"
    assert cell(v, "gemma", "Unloads in") == "5:00 after idle"
    lease.release()

    # Pin through the Pinned box: the host keeps it, the countdown says so.
    index = v.model.index(v.model.row_of("smollm2"), LoadedModelsModel.PINNED)
    assert v.model.flags(index) & Qt.ItemFlag.ItemIsUserCheckable
    assert v.model.setData(index, Qt.CheckState.Checked.value, Qt.ItemDataRole.CheckStateRole)
    assert hosted(host, "smollm2").pinned
    assert cell(v, "smollm2", "Unloads in") == "pinned"
    assert index.data(Qt.ItemDataRole.CheckStateRole) == Qt.CheckState.Checked
    # Pin / Unpin on the selected row does the same.
    v.table.selectRow(v.model.row_of("gemma"))
    assert v.pin_button.text() == "Pin"
    v.pin_button.click()
    assert hosted(host, "gemma").pinned and v.pin_button.text() == "Unpin"
    clock.now += 600  # long past their keep-alive: pinned models stay
    v.refresh()
    assert cell(v, "gemma", "Unloads in") == "pinned" and host.names() == ["gemma", "smollm2"]
    v.pin_button.click()
    assert not hosted(host, "gemma").pinned
    assert cell(v, "gemma", "Unloads in") == "5:00"  # counting again from the unpin

    # The chat's model, added by its client: listed while the window is hidden (the host's
    # change signal, not the timer), kept, and not the host's to eject.
    v.hide()
    chat_model = Model(smollm2_path, PARAMS)
    try:
        host.add(CHAT, chat_model, owner=CHAT_OWNER)
        qtbot.waitUntil(lambda: v.model.row_of(CHAT) >= 0)
        v.show()
        assert cell(v, CHAT, "Model") == CHAT  # no library name given for it
        assert cell(v, CHAT, "Used by") == "chat"
        assert cell(v, CHAT, "Unloads in") == "kept"
        chat_pin = v.model.index(v.model.row_of(CHAT), LoadedModelsModel.PINNED)
        assert not v.model.flags(chat_pin) & Qt.ItemFlag.ItemIsUserCheckable
        assert v.eject(CHAT)  # handed to the chat's own Eject
        assert ejected == ["chat"] and CHAT in host.names()
        # Without a way to the chat's Eject, the button is off and says where it is.
        other = LoadedModelsView(host)
        qtbot.addWidget(other)
        other.table.selectRow(other.model.row_of(CHAT))
        assert not other.eject_button.isEnabled()
        assert other.eject_button.toolTip() == CHAT_EJECT_TIP
        assert not other.eject(CHAT) and CHAT in host.names()
        other.shutdown()
    finally:
        host.remove(CHAT)
        chat_model.close()

    # Eject a pinned, idle on-demand model: unpinned and gone, by the host's keep-alive.
    assert v.eject("smollm2")
    qtbot.waitUntil(lambda: v.model.row_of("smollm2") < 0, timeout=10_000)
    assert host.names() == ["gemma"]
    assert v.status.text() == "Unloaded SmolLM2"
    assert v.summary.text().startswith("1 model · ")
    # Under a request, Eject waits for it to end.
    lease = host.acquire("gemma")
    assert v.eject("gemma")
    v.refresh()
    assert cell(v, "gemma", "Unloads in") == "when idle"
    qtbot.wait(300)  # the keep-alive thread has woken (Eject notified it): not under a request
    assert host.names() == ["gemma"]
    v.hide()  # no timer: the keep-alive thread's change signal alone updates the table
    lease.release()
    qtbot.waitUntil(lambda: v.model.rowCount() == 0, timeout=10_000)
    assert host.names() == [] and v.summary.text() == "No model loaded"


@pytest.mark.slow
def test_in_the_window_api_requests_load_library_models_beside_the_chats(
    qtbot: QtBot, tmp_path: Path, smollm2_path: Path, gemma_path: Path
) -> None:
    """The app's host has the library as its catalog: with the Local server serving the
    chat's SmolLM2, a request naming Gemma loads it on demand into the same host; /api/ps
    and the Loaded models window (Tools menu) list both. Quitting closes the host."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "gemma-3-270m.gguf").symlink_to(gemma_path)
    w = build_window(
        library=ModelLibrary(models, bundled=smollm2_path, discovery=False),
        sampling=SamplingParams(temperature=0.0, max_tokens=4),
    )
    w.ask_quit = lambda _parent, _warnings: True
    try:
        panel = w.findChild(ServerPanel)
        assert panel is not None
        panel.secrets = SecretStore(MemoryKeyring())  # not the real keyring of the machine
        w.controller.load(smollm2_path, LoadParams(n_ctx=1024, n_threads=1))
        qtbot.waitUntil(panel.start_button.isEnabled, timeout=120_000)
        panel.port.setValue(free_port())
        panel.parallel.setValue(2)
        panel.ctx.setValue(512)
        with qtbot.waitSignal(panel.running_changed, timeout=120_000) as sig:
            assert panel.start()
        assert sig.args == [True], panel.status.text()
        url, key = panel.url.text(), panel.key_edit.text()
        auth = {"Authorization": f"Bearer {key}"}
        r = httpx.post(
            url + "/api/generate",
            headers=auth,
            timeout=180,
            json={
                "model": "gemma-3-270m",
                "prompt": "Hi",
                "stream": False,
                "options": {"num_predict": 2, "temperature": 0},
            },
        )
        assert r.status_code == 200, r.text
        ps = httpx.get(url + "/api/ps", headers=auth, timeout=60).json()
        chat = "smollm2-135m-instruct-q4_1"
        assert {"gemma-3-270m", chat} <= {m["name"] for m in ps["models"]}
        # Loaded with the server's slots as it was started: 2 of 512 tokens.
        gemma = next(s for s in w.engine.worker.host.known() if s.path.name == "gemma-3-270m.gguf")
        assert (gemma.params.n_seq_max, gemma.params.n_ctx) == (2, 1024)

        next(a for a in w.actions() if a.text() == "Loaded models…").trigger()
        view = w.findChild(LoadedModelsView)
        assert view is not None and view.isVisible()
        assert view.host is w.engine.worker.host
        qtbot.waitUntil(lambda: view.model.rowCount() == 2)
        assert cell(view, chat, "Model") == "SmolLM2 135M Instruct · Q4_1"  # the library's
        assert cell(view, chat, "Used by") == "chat · Local server"  # its slots
        assert cell(view, chat, "Unloads in") == "kept"
        gemma_name = w.model_name(models / "gemma-3-270m.gguf")
        assert gemma_name and cell(view, "gemma-3-270m", "Model") == gemma_name
        assert cell(view, "gemma-3-270m", "Used by") == ON_DEMAND
        assert cell(view, "gemma-3-270m", "Unloads in") in ("5:00", "4:59", "4:58")
        assert cell(view, "gemma-3-270m", "Memory") == memory_text(
            hosted(view.host, "gemma-3-270m").memory
        )
        save_shot(view, tmp_path)

        assert view.eject("gemma-3-270m")
        qtbot.waitUntil(lambda: view.model.row_of("gemma-3-270m") < 0, timeout=10_000)
        # The chat's model goes the library's way: the chat unloads it (no API request used
        # it), and the server goes on serving the library.
        assert view.eject(chat)
        qtbot.waitUntil(lambda: view.model.rowCount() == 0, timeout=30_000)
        qtbot.waitUntil(lambda: w.controller.loaded is None, timeout=30_000)
        assert panel.phase == "running" and httpx.get(
            url + "/api/ps", headers=auth, timeout=60
        ).json() == {"models": []}
    finally:
        w.close()
        w.shutdown()  # what quitting the app does: the host's threads end with it
