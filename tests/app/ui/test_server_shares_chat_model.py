"""The Local server serves the model the chat has loaded, on its one decode loop: starting it
loads nothing (the same `Model` object serves), an API request and a chat reply are decoded
together, stopping gives the chat its context back; the server goes on when the chat ejects
or switches its model, and a model the API uses stays loaded for it.
(These replace the tests of the server's first load in a child process: it loads nothing.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.local_server import LEASE
from app.services.secrets import SecretStore
from app.ui.main_window import MainWindow
from app.ui.server_panel import ServerPanel
from engine.host.runtime import Model
from engine.settings import LoadParams, SamplingParams
from tests.app.ui.test_server_panel import free_port, port_is_free, start
from tests.app.ui.ui_signal_log import SignalLog
from tests.memory_keyring import MemoryKeyring

pytestmark = pytest.mark.qt_log_ignore(
    "This plugin does not support propagateSizeHints", "This plugin does not support raise"
)
CHAT_CTX = 1024
LONG_STORY = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 3000}},
    "required": ["story"],
}


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = build_window(sampling=SamplingParams(temperature=0.0, max_tokens=8))
    w.ask_quit = lambda _parent, _warnings: True
    yield w
    w.close()
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.fixture
def model_inits(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The file of every `Model` created from now on (a load, of a chat or a draft)."""
    made: list[Path] = []
    real = Model.__init__

    def counting(self: Model, path: Any, *args: Any, **kwargs: Any) -> None:
        made.append(Path(path))
        real(self, path, *args, **kwargs)

    monkeypatch.setattr(Model, "__init__", counting)
    return made


def server_panel(qtbot: QtBot, w: MainWindow, smollm2_path: Path) -> ServerPanel:
    """The window's panel, once the chat has loaded SmolLM2; two slots of 512 tokens."""
    panel = w.findChild(ServerPanel)
    assert panel is not None
    panel.secrets = SecretStore(MemoryKeyring())  # not the real keyring of the machine
    w.controller.load(smollm2_path, LoadParams(n_ctx=CHAT_CTX, n_threads=1))
    qtbot.waitUntil(panel.start_button.isEnabled, timeout=120_000)
    panel.port.setValue(free_port())
    panel.parallel.setValue(2)
    panel.ctx.setValue(512)
    return panel


def test_the_window_gives_the_panel_the_engine_threads_host(window: MainWindow) -> None:
    panel = window.findChild(ServerPanel)
    assert panel is not None and panel.model_host is window.engine.worker.host


@pytest.mark.slow
def test_starting_loads_nothing_and_stopping_gives_the_context_back(
    qtbot: QtBot, window: MainWindow, smollm2_path: Path, model_inits: list[Path]
) -> None:
    panel = server_panel(qtbot, window, smollm2_path)
    model = window.engine.worker.model
    assert model is not None and model_inits == [smollm2_path]  # the chat's load
    loop = model.loop
    assert (loop.n_slots, loop.n_ctx_seq, loop.leased_by) == (1, CHAT_CTX, None)
    assert window.engine.worker.host.get(window.controller.loaded.host_key) is model  # type: ignore

    start(qtbot, panel)
    server = panel.server
    assert server is not None and server._model is model
    assert model_inits == [smollm2_path]  # no second instance
    # The chat's context, grown by the server's two slots, each as long as the chat's.
    assert model.loop is loop and loop.leased_by == LEASE
    assert (loop.n_slots, loop.reserved_slots, loop.n_ctx_seq) == (3, 1, CHAT_CTX)
    assert panel.start_button.text() == "Stop server"

    with qtbot.waitSignal(panel.running_changed, timeout=60_000) as sig:
        panel.stop()
    assert sig.args == [False]
    assert loop.leased_by is None  # stop released it
    assert (loop.n_slots, loop.reserved_slots, loop.n_ctx_seq) == (1, 0, CHAT_CTX)
    assert window.engine.worker.model is model and model_inits == [smollm2_path]
    # The chat goes on answering on the same model.
    log = SignalLog(window.engine.worker)
    with qtbot.waitSignal(log.got_finished, timeout=120_000):
        window.chat_view.input.submitted.emit("Say hello.")
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=30_000)
    assert window.chat_model.message(1).state == "done"


@pytest.mark.slow
def test_an_api_request_and_a_chat_reply_run_together(
    qtbot: QtBot, window: MainWindow, smollm2_path: Path
) -> None:
    panel = server_panel(qtbot, window, smollm2_path)
    start(qtbot, panel)
    model = window.engine.worker.model
    assert model is not None
    loop = model.loop
    client = openai.OpenAI(
        base_url=panel.url.text() + "/v1", api_key=panel.key_edit.text(), max_retries=0, timeout=300
    )
    api_text: list[str] = []
    hang_up = threading.Event()
    errors: list[BaseException] = []

    def call_api() -> None:  # a long streamed answer, read until the test hangs up
        try:
            stream = client.chat.completions.create(
                model=client.models.list().data[0].id,
                messages=[{"role": "user", "content": "Write a long story, as JSON."}],
                max_tokens=900,
                temperature=0,
                stream=True,
                # Cannot end before ~700 tokens: still streaming after the chat's reply.
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "story", "schema": LONG_STORY},
                },
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    api_text.append(chunk.choices[0].delta.content)
                if hang_up.is_set():
                    break
            stream.close()
        except Exception as e:  # reported by the test below
            errors.append(e)

    api = threading.Thread(target=call_api, name="test-api-client")
    api.start()
    try:
        qtbot.waitUntil(lambda: bool(api_text) or bool(errors), timeout=120_000)
        assert not errors
        busy_during_chat: list[int] = []
        log = SignalLog(window.engine.worker)
        log.got_tokens.connect(lambda *_: busy_during_chat.append(loop.snapshot().busy_slots))
        with qtbot.waitSignal(log.got_finished, timeout=120_000) as done:
            window.chat_view.input.submitted.emit("Name three colours.")
        qtbot.waitUntil(lambda: not window.controller.busy, timeout=30_000)
        # The chat's reply was decoded while the API's answer still held its slot.
        assert busy_during_chat and max(busy_during_chat) == 2, busy_during_chat
        reply = window.chat_model.message(1)
        assert reply.state == "done" and reply.text.strip() and reply.stats is done.args[0]
        streamed_before = len(api_text)
        qtbot.waitUntil(lambda: len(api_text) > streamed_before or bool(errors), timeout=60_000)
        assert not errors  # and the API's answer goes on after the chat's
    finally:
        hang_up.set()
        api.join(120)
        client.close()
    assert not api.is_alive() and not errors


@pytest.mark.slow
def test_ejecting_the_chats_model_leaves_the_server_running(
    qtbot: QtBot, window: MainWindow, smollm2_path: Path
) -> None:
    panel = server_panel(qtbot, window, smollm2_path)
    start(qtbot, panel)
    server = panel.server
    assert server is not None
    name = window.controller.loaded.name  # type: ignore[union-attr]
    host = window.engine.worker.host
    with qtbot.assertNotEmitted(panel.running_changed, wait=500):
        window.controller.eject()
        qtbot.waitUntil(lambda: host.names() == [], timeout=60_000)
    # Nobody else used it: it is freed, and the server goes on serving the library.
    assert server.running and panel.phase == "running" and not port_is_free(server.port)
    qtbot.waitUntil(lambda: f"{name} was unloaded" in panel.status.text(), timeout=10_000)
    assert panel.models.text().startswith("none loaded")
    assert "The chat has no model loaded" in panel.model_label.text()
    assert panel.quit_warning() != ""
    with qtbot.waitSignal(panel.running_changed, timeout=60_000) as sig:
        panel.stop()
    assert sig.args == [False] and port_is_free(server.port)


@pytest.mark.slow
def test_switching_the_chat_model_keeps_the_one_the_api_uses(
    qtbot: QtBot, window: MainWindow, smollm2_path: Path, gemma_path: Path, model_inits: list[Path]
) -> None:
    """The chat moves to Gemma while an API client streams from SmolLM2: SmolLM2 stays loaded
    for it (the host's now, with a keep-alive), the server keeps running and serves both,
    and the chat going back to SmolLM2 takes that model again instead of loading a copy."""
    panel = server_panel(qtbot, window, smollm2_path)
    start(qtbot, panel)
    host = window.engine.worker.host
    smol_id = window.controller.loaded.host_key  # type: ignore[union-attr]
    smol = host.get(smol_id)
    client = openai.OpenAI(
        base_url=panel.url.text() + "/v1", api_key=panel.key_edit.text(), max_retries=0, timeout=300
    )
    pieces: list[str] = []
    hang_up = threading.Event()
    errors: list[BaseException] = []

    def call_api() -> None:
        try:
            # A story that cannot end before ~700 tokens (a schema's minLength), so the
            # stream is still in flight when the chat's new model is loaded: a free greedy
            # story ended after ~300 tokens with some CPUs' kernels, before Gemma was loaded.
            with client.chat.completions.create(
                model=smol_id,
                messages=[{"role": "user", "content": "Write a long story, as JSON."}],
                max_tokens=900,
                temperature=0,
                stream=True,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "story", "schema": LONG_STORY},
                },
            ) as stream:
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        pieces.append(chunk.choices[0].delta.content)
                    if hang_up.is_set():
                        break
        except Exception as e:  # reported below
            errors.append(e)

    api = threading.Thread(target=call_api, name="test-api-client")
    api.start()
    try:
        qtbot.waitUntil(lambda: bool(pieces) or bool(errors), timeout=120_000)
        assert not errors
        with qtbot.assertNotEmitted(panel.running_changed, wait=200):
            window.controller.load(gemma_path, LoadParams(n_ctx=CHAT_CTX, n_threads=1))
            qtbot.waitUntil(
                lambda: (
                    window.controller.loaded is not None
                    and window.controller.loaded.path == gemma_path
                ),
                timeout=120_000,
            )
        hosted = {h.name: h for h in host.hosted()}
        gemma_id = window.controller.loaded.host_key  # type: ignore[union-attr]
        assert set(hosted) == {smol_id, gemma_id}
        assert hosted[smol_id].owner is None and hosted[smol_id].in_flight == 1
        assert hosted[smol_id].keep_s == host.default_keep_s
        assert hosted[gemma_id].owner == "chat" and host.get(smol_id) is smol
        # The stream goes on from the model the chat left; the chat's new one is served too.
        before = len(pieces)
        qtbot.waitUntil(lambda: len(pieces) > before or bool(errors), timeout=60_000)
        assert not errors and panel.server is not None and panel.server.running
        qtbot.waitUntil(
            lambda: (
                f"{smol_id} (1 in flight)" in panel.models.text()
                and f"{gemma_id} (chat)" in panel.models.text()
            ),
            timeout=10_000,
        )
        answer = client.chat.completions.create(
            model=gemma_id,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
            temperature=0,
        )
        assert answer.model == gemma_id and answer.choices[0].message.content is not None
        assert gemma_id in panel.model_label.text() or "Gemma" in panel.model_label.text()
    finally:
        hang_up.set()
        api.join(120)
        client.close()
    assert not api.is_alive() and not errors
    qtbot.waitUntil(
        lambda: next(h for h in host.hosted() if h.name == smol_id).expires_in_s is not None,
        timeout=10_000,
    )  # idle: its keep-alive runs

    # Back to SmolLM2: the chat takes the host's model; Gemma, used by one request, stays.
    window.controller.load(smollm2_path, LoadParams(n_ctx=CHAT_CTX, n_threads=1))
    qtbot.waitUntil(
        lambda: (
            window.controller.loaded is not None and window.controller.loaded.path == smollm2_path
        ),
        timeout=120_000,
    )
    assert window.engine.worker.model is smol
    assert model_inits == [smollm2_path, gemma_path]  # no second copy of SmolLM2
    assert host.owner_of(smol_id) == "chat" and host.owner_of(gemma_id) is None
    assert panel.server is not None and panel.server.running
