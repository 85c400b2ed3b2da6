"""The Server panel on the real SmolLM2: start, call it with the official OpenAI client, watch
the log and the slots, wrong key, stop frees the port, unsafe and impossible settings.

The panel serves the model the chat has loaded (found by name in a model host): here one
SmolLM2 loaded in a host of the test's own, as the engine thread's would hold it."""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import openai
import pytest
from PySide6.QtCore import QEvent, QSettings
from PySide6.QtWidgets import QApplication, QLineEdit, QWidget
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.local_server import KEY_ACCOUNT, LEASE, new_api_key
from app.services.secrets import SecretStore
from app.ui.memory_adapter import engine_estimator
from app.ui.server_panel import (
    NO_MODEL_TIP,
    REMOTE_TIP,
    RequestLogModel,
    ServerPanel,
    model_line,
)
from app.ui.worker import LoadedModel, RemoteTarget
from engine.host.host import ModelHost
from engine.host.runtime import Model
from engine.server.request_log import RequestRecord
from engine.settings import LoadParams, SamplingParams
from tests.memory_keyring import MemoryKeyring

pytestmark = pytest.mark.qt_log_ignore(
    "This plugin does not support propagateSizeHints", "This plugin does not support raise"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


CHAT_PARAMS = LoadParams(n_ctx=2048, n_threads=1)


@pytest.fixture
def chat_model(smollm2_path: Path) -> LoadedModel:
    """What the chat reports once it has loaded SmolLM2 (the panel serves that model)."""
    return LoadedModel(
        path=smollm2_path,
        name="SmolLM2 135M Instruct",
        n_ctx=2048,
        n_layer=30,
        n_gpu_layers=0,
        load_s=0.1,
        params=CHAT_PARAMS,
    )


@pytest.fixture(scope="module")
def loaded_smollm2(smollm2_path: Path) -> Iterator[Model]:
    """The chat's loaded model (one for the module: each panel gives its slots back)."""
    model = Model(smollm2_path, CHAT_PARAMS)
    yield model
    model.close()


@pytest.fixture
def model_host(loaded_smollm2: Model, chat_model: LoadedModel) -> Iterator[ModelHost]:
    """The engine thread's registry, holding the chat's model under the chat's name."""
    host = ModelHost()
    host.add(chat_model.name, loaded_smollm2)
    yield host
    host.remove(chat_model.name)  # the model stays loaded for the next test
    # Every test gives the chat its context back, whatever it did.
    loop = loaded_smollm2.loop
    assert loop.leased_by is None
    assert (loop.n_slots, loop.n_ctx_seq, loop.reserved_slots) == (1, 2048, 0)


@pytest.fixture
def panel(qtbot: QtBot, chat_model: LoadedModel, model_host: ModelHost) -> Iterator[ServerPanel]:
    p = ServerPanel(
        lambda: chat_model,
        SecretStore(MemoryKeyring()),
        estimator=engine_estimator(),
        model_host=model_host,
    )
    qtbot.addWidget(p)
    p.port.setValue(free_port())
    p.parallel.setValue(2)
    p.ctx.setValue(1024)
    p.resize(900, 760)
    p.show()
    yield p
    p.shutdown()


def start(qtbot: QtBot, panel: ServerPanel) -> None:
    with qtbot.waitSignal(panel.running_changed, timeout=180_000) as sig:
        assert panel.start()
    assert sig.args == [True], panel.status.text()
    assert panel.phase == "running"


def cells(model: RequestLogModel) -> list[list[str]]:
    return [
        [str(model.index(r, c).data()) for c in range(model.columnCount())]
        for r in range(model.rowCount())
    ]


@pytest.mark.slow
def test_serve_call_log_and_stop(
    qtbot: QtBot, qtmodeltester: object, panel: ServerPanel, loaded_smollm2: Model, tmp_path: Path
) -> None:
    key = panel.key_edit.text()
    assert len(key) >= 40 and panel.key_edit.echoMode() == QLineEdit.EchoMode.Password
    assert panel.require_key.isChecked()
    port = panel.port.value()
    start(qtbot, panel)
    # The chat's model serves, its loop grown by the server's slots beside the chat's own.
    assert panel.server is not None and panel.server._model is loaded_smollm2
    loop = loaded_smollm2.loop
    assert (loop.leased_by, loop.n_slots, loop.reserved_slots) == (LEASE, 1 + 2, 1)
    assert panel.secrets.get(KEY_ACCOUNT) == key  # kept in the keyring for next time
    url = panel.url.text()
    assert url == f"http://127.0.0.1:{port}"
    assert "$CANDLEWICK_API_KEY" in panel.curl.text() and key not in panel.curl.text()
    assert panel.start_button.text() == "Stop server"
    assert not panel.port.isEnabled() and not panel.host.isEnabled()

    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    # The model id the panel tells clients to send (its example curl line).
    model_id = re.search(r'"model": "([^"]+)"', panel.curl.text())[1]  # type: ignore[index]
    reply = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        temperature=0,
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 8
    qtbot.waitUntil(lambda: panel.log_model.rowCount() >= 1, timeout=10_000)
    row = panel.log_model.record(0)
    assert (row.method, row.path, row.status) == ("POST", "/v1/chat/completions", 200)
    assert row.prompt_tokens == reply.usage.prompt_tokens
    assert row.completion_tokens == reply.usage.completion_tokens
    assert cells(panel.log_model)[0][5] == (
        f"{reply.usage.prompt_tokens} / {reply.usage.completion_tokens}"
    )

    # A long streamed answer holds a slot: the panel shows it busy, then free again. The
    # loop's slots are the server's two and the one kept for the chat.
    stream = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Write a long story."}],
        max_tokens=400,
        stream=True,
    )
    chunks = iter(stream)
    next(chunks)
    qtbot.waitUntil(lambda: panel.slots.text().startswith("1 of 3 busy"), timeout=30_000)
    assert "cells" in panel.kv.text()
    stream.close()  # hang up mid-answer
    client.close()  # its pooled connections too, not at some garbage collection
    qtbot.waitUntil(lambda: panel.slots.text().startswith("0 of 3 busy"), timeout=30_000)

    bad = openai.OpenAI(base_url=url + "/v1", api_key="not-the-key-123", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    bad.close()
    qtbot.waitUntil(lambda: any(r[4] == "401" for r in cells(panel.log_model)), timeout=10_000)
    log = cells(panel.log_model)
    assert log[-1][2:6] == ["GET", "/v1/models", "401", "—"]
    assert not any(key in c for r in log for c in r)
    qtmodeltester.check(panel.log_model)  # type: ignore[attr-defined]
    panel.start_button.setFocus()  # not the key field, whose text would show selected
    save_shot(panel, shots_dir(tmp_path) / "server_panel.png")

    with qtbot.waitSignal(panel.running_changed, timeout=60_000) as sig:
        panel.stop()
    assert sig.args == [False]
    assert panel.phase == "stopped" and panel.status.text() == "Stopped"
    assert port_is_free(port)
    assert panel.url.text() == "" and panel.port.isEnabled()
    # The chat has its one slot of 2,048 tokens back, and the model is still loaded.
    assert (loop.leased_by, loop.n_slots, loop.n_ctx_seq) == (None, 1, 2048)
    assert loaded_smollm2.loop is loop


def test_start_is_off_without_a_model(qtbot: QtBot) -> None:
    p = ServerPanel(lambda: None, SecretStore(MemoryKeyring()))
    qtbot.addWidget(p)
    assert not p.start_button.isEnabled()
    assert p.start_button.toolTip() == NO_MODEL_TIP
    assert not p.start()
    p.shutdown()


def test_start_is_off_for_a_remote_engine(qtbot: QtBot, chat_model: LoadedModel) -> None:
    remote = dataclasses.replace(chat_model, remote=RemoteTarget("lab", "qwen"))
    p = ServerPanel(lambda: remote, SecretStore(MemoryKeyring()))
    qtbot.addWidget(p)
    assert not p.start_button.isEnabled() and p.start_button.toolTip() == REMOTE_TIP
    assert not p.start()
    p.shutdown()


def test_network_bind_without_a_key_is_refused(panel: ServerPanel) -> None:
    panel.require_key.setChecked(False)
    panel.host.setCurrentIndex(panel.host.findData("0.0.0.0"))
    assert panel.settings().host == "0.0.0.0" and panel.settings().api_key is None
    assert not panel.start()
    assert panel.status.text().startswith(
        "Cannot start: refusing to listen on 0.0.0.0 without an API key"
    )
    assert panel.phase == "stopped" and panel.server is None
    # With the key it is allowed (checked without binding to the network here).
    panel.require_key.setChecked(True)
    panel.settings().config().validate()


def test_a_taken_port_is_one_clear_line(panel: ServerPanel) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        panel.port.setValue(port)
        assert not panel.start()
    assert panel.status.text() == (
        f"Cannot start: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert panel.phase == "stopped"


@pytest.mark.slow
def test_cancel_while_loading_frees_everything(
    qtbot: QtBot, chat_model: LoadedModel, model_host: ModelHost, tmp_path: Path
) -> None:
    ini = QSettings(str(tmp_path / "window.ini"), QSettings.Format.IniFormat)
    panel = ServerPanel(
        lambda: chat_model, SecretStore(MemoryKeyring()), settings=ini, model_host=model_host
    )
    qtbot.addWidget(panel)
    port = free_port()
    panel.port.setValue(port)
    panel.parallel.setValue(3)
    with qtbot.waitSignal(panel.running_changed, timeout=120_000) as sig:
        assert panel.start()
        assert panel.start_button.text() == "Cancel"
        panel.stop()
    assert sig.args == [False]
    assert panel.phase == "stopped" and panel.status.text().startswith("Stopped")
    assert port_is_free(port)
    panel.shutdown()
    # The settings of that start are what the window shows next time (the key is not there).
    again = ServerPanel(lambda: chat_model, SecretStore(MemoryKeyring()), settings=ini)
    qtbot.addWidget(again)
    assert (again.port.value(), again.parallel.value(), again.settings().host) == (
        port,
        3,
        "127.0.0.1",
    )
    assert again.require_key.isChecked()
    assert "cw-" not in (tmp_path / "window.ini").read_text()


@pytest.mark.slow
def test_quitting_while_serving_shuts_down(
    qtbot: QtBot, panel: ServerPanel, loaded_smollm2: Model
) -> None:
    # Threads of this panel's server only: another test's server may live in this process
    # (a session fixture, when the suite runs in another order or split over workers).
    others = set(threading.enumerate())
    start(qtbot, panel)
    ours = set(threading.enumerate()) - others
    assert "candlewick-server" in {t.name for t in ours}
    port = panel.port.value()
    panel.shutdown()
    left = {t.name for t in ours if t.is_alive()}
    assert not left & {"candlewick-server", "candlewick-embed_0"}
    assert port_is_free(port)
    # The decode loop is the chat's model's: it goes on, with the chat's context back.
    assert not loaded_smollm2.loop.closed
    assert (loaded_smollm2.loop.leased_by, loaded_smollm2.loop.n_slots) == (None, 1)


@pytest.mark.slow
def test_in_the_window_it_follows_the_chat_model_and_stops_at_quit(
    qtbot: QtBot, smollm2_path: Path
) -> None:
    w = build_window(sampling=SamplingParams(temperature=0.0, max_tokens=4))
    asked: list[str] = []

    def ask_quit(_parent: object, warnings: Sequence[str]) -> bool:
        asked.extend(warnings)
        return True

    w.ask_quit = ask_quit
    others = set(threading.enumerate())  # another test's server may live in this process
    try:
        panel = w.findChild(ServerPanel)
        assert panel is not None
        panel.secrets = SecretStore(MemoryKeyring())  # not the real keyring of the machine
        action = next(a for a in w.actions() if a.text() == "Local server")
        assert not panel.start_button.isEnabled()
        assert panel.start_button.toolTip() == NO_MODEL_TIP
        w.controller.load(smollm2_path, LoadParams(n_ctx=1024, n_threads=1))
        qtbot.waitUntil(panel.start_button.isEnabled, timeout=120_000)
        info = w.controller.loaded
        assert info is not None and info.name == "SmolLM2 135M Instruct · Q4_1"
        # The name people read, next to the id API clients send.
        assert panel.model_label.text() == model_line(info.name, "smollm2-135m-instruct-q4_1")
        w.show()  # the Local server is a page of the window
        qtbot.waitExposed(w)
        action.trigger()
        assert w.current_page() == "server" and panel.isVisible()
        panel.port.setValue(free_port())
        panel.ctx.setValue(512)
        start(qtbot, panel)
        r = httpx.get(
            panel.url.text() + "/v1/models",
            timeout=60,
            headers={"Authorization": f"Bearer {panel.key_edit.text()}"},
        )
        assert r.status_code == 200
        assert "smollm2-135m-instruct-q4_1" in {m["id"] for m in r.json()["data"]}
        assert panel.model_label.text().startswith(
            model_line(info.name, "smollm2-135m-instruct-q4_1") + " · "
        )
        port = panel.port.value()
    finally:
        w.close()
        w.shutdown()  # what quitting the app does
        w.deleteLater()
        QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    assert port_is_free(port)
    ours = set(threading.enumerate()) - others
    assert "candlewick-server" not in {t.name for t in ours}
    # Quitting asked first, naming what it stops.
    assert len(asked) == 1 and asked[0].startswith(
        "The Local server is serving SmolLM2 135M Instruct · Q4_1 at "
    )


def test_request_log_model_is_bounded(qtmodeltester: object) -> None:
    m = RequestLogModel(max_rows=5)
    qtmodeltester.check(m)  # type: ignore[attr-defined]
    m.add([RequestRecord("GET", f"/{i}", status=200) for i in range(3)])
    m.add([RequestRecord("POST", f"/{i}", status=429, latency_s=0.01) for i in range(3, 9)])
    assert m.rowCount() == 5
    assert [m.record(r).path for r in range(5)] == ["/4", "/5", "/6", "/7", "/8"]
    assert m.index(0, 6).data() == "10 ms" and m.index(0, 5).data() == "—"
    qtmodeltester.check(m)  # type: ignore[attr-defined]


def test_new_key_is_random(panel: ServerPanel) -> None:
    old = panel.key_edit.text()
    panel.new_key.click()
    assert panel.key_edit.text() != old and panel.key_edit.text().startswith("cw-")
    assert new_api_key() != new_api_key()
    panel.show_key.click()
    assert panel.key_edit.echoMode() == QLineEdit.EchoMode.Normal


def shots_dir(tmp_path: Path) -> Path:
    """Where the screenshot goes: docs/screenshots when CANDLEWICK_SCREENSHOTS names it."""
    return Path(os.environ.get("CANDLEWICK_SCREENSHOTS") or tmp_path)


def save_shot(widget: QWidget, path: Path) -> None:
    QApplication.processEvents()
    path.parent.mkdir(parents=True, exist_ok=True)
    assert widget.grab().save(str(path))
    assert path.stat().st_size > 10_000  # a picture, not an empty grab
