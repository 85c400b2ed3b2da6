"""Chatting through a remote engine: a real `candlewick serve` process (SmolLM2, free port,
API key), a saved connection, the engine picker, and the same chat window as with the embedded
engine: the streamed reply, the stats footer (measured on this side, and saying so), the
history in SQLite. Failures are real too: a wrong key, a refused connection, a silent server,
a server killed mid-answer (the partial answer is kept and marked interrupted)."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.connections import Connection, ConnectionStore
from app.services.secrets import SERVICE, SecretStore
from app.ui.connections_dialog import ConnectionsDialog
from app.ui.engine_picker import Binding, EnginePicker
from app.ui.main_window import MainWindow
from app.ui.worker import EngineHost, EngineWorker, LoadedModel, RemoteTarget
from engine.host.chat_engine import ChatRequest, EmbeddedEngine
from engine.memory import cpu_kernels
from engine.memory.cpu_kernels import Exactness, batch_exactness
from engine.model.gguf import read_gguf
from engine.remote.engines import RemoteEngine
from engine.settings import SamplingParams, use_extra_buffers
from tests.app.ui.remote_server import API_KEY, Served, start_server
from tests.app.ui.shots import save_shot, shots_dir
from tests.app.ui.ui_signal_log import SignalLog
from tests.exactness import assert_same_greedy
from tests.memory_keyring import MemoryKeyring

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
QUESTION = "What is the capital of France?"
NAME = "Local server"
# The footer's fields, whichever engine answered: TTFT, speed, tokens, then notes.
FOOTER = re.compile(r"TTFT \d+\.\d\d s · \d+\.\d tok/s · \d+ tokens( · [a-z ]+)*")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Served]:
    """`candlewick serve` of the default model (`smollm2_path`: its tests are marked `model`)."""
    s = start_server(tmp_path_factory.mktemp("serve"))
    yield s
    s.stop()


@pytest.fixture
def keyring_backend() -> MemoryKeyring:
    return MemoryKeyring()


@pytest.fixture
def connections(tmp_path: Path, keyring_backend: MemoryKeyring) -> ConnectionStore:
    return ConnectionStore(tmp_path / "connections.json", SecretStore(keyring_backend))


def make_window(
    qtbot: QtBot, connections: ConnectionStore, sampling: SamplingParams = GREEDY
) -> MainWindow:
    w = build_window(sampling=sampling, connections=connections)
    w.resize(1360, 820)
    w.show()
    qtbot.waitExposed(w)
    return w


def close_window(w: MainWindow) -> None:
    w.close()
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.fixture
def window(qtbot: QtBot, connections: ConnectionStore) -> Iterator[MainWindow]:
    w = make_window(qtbot, connections)
    yield w
    close_window(w)


def picker_of(w: MainWindow) -> EnginePicker:
    assert w.engine_picker is not None
    return w.engine_picker


def listed_binding(qtbot: QtBot, w: MainWindow, connection: str) -> Binding:
    """Refresh the engine list and wait until the server's models are in it."""
    picker = picker_of(w)
    picker.refresh()

    def found() -> Binding:
        for _text, b in picker.items():
            if isinstance(b, dict) and b["connection"] == connection and b["model"]:
                return b
        return None

    qtbot.waitUntil(lambda: found() is not None and picker.fetching == 0, timeout=60_000)
    return found()


def send(qtbot: QtBot, w: MainWindow, text: str, timeout: int = 300_000) -> None:
    qtbot.keyClicks(w.chat_view.input, text)
    qtbot.keyClick(w.chat_view.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=timeout)


def last_row(w: MainWindow) -> int:
    return w.chat_model.rowCount() - 1


@pytest.mark.timeout(900)  # four replies and a model load on a shared machine
def test_chat_through_a_remote_endpoint_like_the_embedded_engine(
    window: MainWindow,
    qtbot: QtBot,
    served: Served,
    connections: ConnectionStore,
    keyring_backend: MemoryKeyring,
    tmp_path: Path,
) -> None:
    w = window
    connections.add(Connection(NAME, served.url), API_KEY)
    # The key is in the keyring, not in the file.
    assert API_KEY not in connections.path.read_text()
    assert keyring_backend.store[(SERVICE, f"connection:{NAME}")] == API_KEY
    binding = listed_binding(qtbot, w, NAME)
    assert binding is not None
    model = binding["model"]
    assert picker_of(w).choose(binding)
    assert w.controller.chat_settings["engine"] == binding

    send(qtbot, w, QUESTION)
    reply = w.chat_model.message(last_row(w))
    assert reply.state == "done" and reply.text.strip()
    assert w.controller.loaded is not None
    assert w.controller.loaded.remote == RemoteTarget(NAME, model)
    assert isinstance(w.engine.worker.engine, RemoteEngine)  # idle: safe to look
    stats = reply.stats
    assert stats is not None and stats.measured_on == "client"
    # candlewick serve reports usage: both counts are the server's, the times are ours.
    assert set(stats.server_usage) == {"prompt_tokens", "gen_tokens"}
    assert stats.prompt_tokens > 0 and 1 <= stats.gen_tokens <= GREEDY.max_tokens
    assert 0 < stats.ttft_s <= stats.total_s
    widget = w.chat_view.message_widgets[last_row(w)]
    remote_footer = widget.footer.text()
    assert FOOTER.fullmatch(remote_footer), remote_footer
    assert remote_footer.endswith("· measured here")
    assert "Measured on this computer from the stream" in widget.footer.toolTip()
    assert "usage report" in widget.footer.toolTip()
    source = w.perf_panel.labels["source"]
    # The panel hears `finished` through its own queued event, after the chat's.
    qtbot.waitUntil(lambda: source.text() == "here, from the stream", timeout=5000)
    assert "server's usage report" in source.toolTip()
    assert w.model_label.text() == f"Remote: {NAME} · {model}"

    # The history: the same rows as with the embedded engine, the engine named as the model.
    assert w.store is not None
    cid = w.controller.conversation_id
    assert cid is not None
    user, answer = w.store.active_path(cid)
    assert (user.role, user.content) == ("user", QUESTION)
    assert answer.status == "complete" and answer.content == reply.text
    assert answer.model == f"{NAME} · {model}"
    assert answer.stats == json.loads(json.dumps(stats.to_dict()))
    assert w.store.conversation(cid).settings["engine"] == binding
    save_shot(w, shots_dir(tmp_path) / "remote-chat.png")

    # The same question in a new chat on the embedded engine: the same footer fields.
    w.new_chat()
    assert picker_of(w).choose(None)
    send(qtbot, w, QUESTION)
    local = w.chat_model.message(last_row(w))
    assert local.state == "done" and local.stats is not None
    assert local.stats.measured_on == "engine"
    assert isinstance(w.engine.worker.engine, EmbeddedEngine)
    local_footer = w.chat_view.message_widgets[last_row(w)].footer.text()
    assert FOOTER.fullmatch(local_footer) and "measured here" not in local_footer

    def fields(footer: str) -> list[str]:
        return [re.sub(r"[\d.]+", "N", f) for f in footer.split(" · ") if f != "measured here"]

    assert fields(local_footer)[:3] == fields(remote_footer)[:3]
    qtbot.waitUntil(lambda: w.perf_panel.labels["source"].text() == "by the engine", timeout=5000)

    # Back in the remote chat: its engine is shown, and its next reply switches to it.
    w.open_conversation(cid)
    assert picker_of(w).binding() == binding
    assert w.chat_view.message_widgets[1].footer.text() == remote_footer
    send(qtbot, w, "And of Italy?")
    assert w.controller.loaded is not None and w.controller.loaded.remote is not None
    assert w.chat_model.message(last_row(w)).state == "done"
    assert len(w.store.active_path(cid)) == 4


def served_exactness() -> Exactness:
    """`Model.exactness` of what `candlewick serve --model default` loads (SmolLM2, the
    server's default flash-attention choice on this build), computed here."""
    from app.services.library import bundled_default_model

    path = bundled_default_model()
    assert path is not None
    gf = read_gguf(path)
    tensors = gf.tensors
    # serve's default --ctx, per slot
    flash = cpu_kernels.resolve_flash_attn_for("auto", gf, "f16", "f16", n_ctx=4096)
    return batch_exactness(
        tensors,
        cpu_kernels.detect(),
        extra_buffers=use_extra_buffers(None),
        flash_attn=flash == "on",
        type_k="f16",
        type_v="f16",
        gpu_layers=0,
        tied_output=cpu_kernels.tied_output(tensors),
    )


def test_worker_signals_are_the_same_for_a_remote_engine(
    qtbot: QtBot, served: Served, connections: ConnectionStore
) -> None:
    """The engine thread over a remote engine: the same signal sequence as over a local
    model, and the coalesced text equal to a direct request's (greedy, one server slot)."""
    connections.add(Connection(NAME, served.url, model="default"), API_KEY)
    host = EngineHost(EngineWorker())
    try:
        log = SignalLog(host.worker)
        target = RemoteTarget(NAME, "default")
        with qtbot.waitSignal(log.got_loaded, timeout=60_000) as got:
            host.connect_remote(target, lambda: connections.engine(NAME))
        info = got.args[0]
        assert isinstance(info, LoadedModel)
        assert (info.remote, info.key, info.name, info.n_ctx) == (
            target,
            target,
            f"{NAME} · default",
            0,
        )
        log.clear()
        chat = [{"role": "user", "content": "Name three colours."}]
        sampling = SamplingParams(temperature=0.0, max_tokens=12)
        with qtbot.waitSignal(log.got_finished, timeout=300_000) as got:
            host.generate(chat, sampling)
        stats = got.args[0]
        assert log.squeezed() == ["started", "tokens", "finished"]
        assert log.values("started") == [0]  # the server reports the prompt size at the end
        counts = [n for _, n in log.values("tokens")]
        assert counts == sorted(counts) and counts[-1] <= stats.gen_tokens
        streamed = "".join(t for t, _ in log.values("tokens"))
        reply = connections.engine(NAME).reply(ChatRequest(chat, sampling))
        direct = "".join(reply)
        # The second request reuses the first one's cached prompt (its last token decoded
        # alone): the same text only where the served model's kernels guarantee it.
        assert_same_greedy(served_exactness(), streamed, direct, positions=255, batch=63)
        assert streamed.strip()
        if served_exactness().exact:
            assert reply.stats.gen_tokens == stats.gen_tokens
    finally:
        host.shutdown()


def test_ollama_dialect_chats_the_same(
    window: MainWindow, qtbot: QtBot, served: Served, connections: ConnectionStore
) -> None:
    """candlewick serve also speaks Ollama's API (/api/tags, /api/chat, NDJSON)."""
    w = window
    connections.add(Connection("Ollama-style", served.url, api="ollama"), API_KEY)
    binding = listed_binding(qtbot, w, "Ollama-style")
    assert picker_of(w).choose(binding)
    send(qtbot, w, QUESTION)
    reply = w.chat_model.message(last_row(w))
    assert reply.state == "done" and reply.text.strip() and reply.stats is not None
    assert reply.stats.measured_on == "client" and reply.stats.gen_tokens >= 1
    assert "gen_tokens" in reply.stats.server_usage  # Ollama's eval_count
    footer = w.chat_view.message_widgets[last_row(w)].footer.text()
    assert FOOTER.fullmatch(footer) and footer.endswith("measured here")


def test_wrong_key_is_reported_in_the_chat(
    window: MainWindow, qtbot: QtBot, served: Served, connections: ConnectionStore
) -> None:
    w = window
    connections.add(Connection(NAME, served.url, model="default"), "not-the-key")
    binding: Binding = {"connection": NAME, "model": "default"}
    picker = picker_of(w)
    picker.refresh()
    # Listing the models fails too: the list says why, and still offers the saved model.
    qtbot.waitUntil(
        lambda: any("wrong or missing API key" in t for t, _ in picker.items()), timeout=60_000
    )
    assert picker.choose(binding)
    send(qtbot, w, QUESTION)
    reply = w.chat_model.message(last_row(w))
    assert reply.state == "error" and reply.text == ""
    assert reply.error == f"{NAME}: wrong or missing API key (HTTP 401)"
    widget = w.chat_view.message_widgets[last_row(w)]
    assert widget.error_label.isVisible() and widget.error_label.text() == reply.error
    assert w.banner.isVisible()
    assert w.store is not None and w.controller.conversation_id is not None
    cid = w.controller.conversation_id
    answer = w.store.active_path(cid)[-1]
    assert answer.status == "error" and answer.stats["error"] == reply.error
    # The key fixed in the connections dialog: the next reply uses it.
    dialog = w.open_connections()
    assert isinstance(dialog, ConnectionsDialog)
    dialog.list.setCurrentRow(0)
    dialog.api_key.setText(API_KEY)
    assert dialog.save()
    dialog.close()
    send(qtbot, w, QUESTION)
    fixed = w.chat_model.message(last_row(w))
    assert fixed.state == "done" and fixed.text.strip()
    # Editing the chat's settings in the drawer leaves its engine alone.
    assert w.chat_settings is not None
    w.chat_settings.temperature.setValue(0.5)
    assert w.controller.chat_settings["engine"] == binding
    assert w.store.conversation(cid).settings["engine"] == binding
    assert w.store.conversation(cid).settings["temperature"] == 0.5


def test_refused_and_silent_servers_are_reported_in_the_chat(
    window: MainWindow, qtbot: QtBot, connections: ConnectionStore
) -> None:
    w = window
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    silent = socket.socket()  # listens, never answers: connections wait in the backlog
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        connections.add(Connection("Nowhere", f"http://127.0.0.1:{refused_port}", model="m"))
        connections.add(
            Connection(
                "Silent",
                f"http://127.0.0.1:{silent.getsockname()[1]}",
                model="m",
                timeout_s=0.5,
                connect_timeout_s=0.5,
            )
        )
        picker = picker_of(w)
        picker.refresh()
        qtbot.waitUntil(lambda: picker.fetching == 0, timeout=30_000)

        assert picker.choose({"connection": "Nowhere", "model": "m"})
        send(qtbot, w, "Hello?")
        reply = w.chat_model.message(last_row(w))
        assert reply.state == "error" and reply.error is not None
        assert reply.error.startswith(
            f"cannot connect to Nowhere (http://127.0.0.1:{refused_port})"
        )
        assert "\n" not in reply.error

        w.new_chat()
        assert picker.choose({"connection": "Silent", "model": "m"})
        send(qtbot, w, "Hello?")
        reply = w.chat_model.message(last_row(w))
        assert reply.state == "error"
        assert reply.error == "Silent: no answer: the server was silent for 0.5 s (timed out)"
    finally:
        silent.close()


def test_stop_ends_a_remote_reply_like_a_local_one(
    qtbot: QtBot, served: Served, connections: ConnectionStore
) -> None:
    w = make_window(qtbot, connections, SamplingParams(temperature=0.0, max_tokens=1500))
    try:
        connections.add(Connection(NAME, served.url), API_KEY)
        assert picker_of(w).choose(listed_binding(qtbot, w, NAME))
        qtbot.keyClicks(w.chat_view.input, "Write a long story about a lighthouse keeper.")
        qtbot.keyClick(w.chat_view.input, Qt.Key.Key_Return)
        qtbot.waitUntil(
            lambda: w.chat_model.rowCount() == 2 and len(w.chat_model.message(1).text) >= 10,
            timeout=300_000,
        )
        qtbot.keyClick(w.chat_view.input, Qt.Key.Key_Escape)
        qtbot.waitUntil(lambda: not w.controller.busy, timeout=60_000)
        reply = w.chat_model.message(1)
        assert reply.state == "stopped" and reply.stats is not None
        assert reply.stats.stop_reason == "cancelled" and reply.stats.measured_on == "client"
        footer = w.chat_view.message_widgets[1].footer.text()
        assert FOOTER.fullmatch(footer) and footer.endswith("· stopped · measured here")
        assert w.store is not None and w.controller.conversation_id is not None
        answer = w.store.active_path(w.controller.conversation_id)[-1]
        assert answer.status == "complete" and answer.content == reply.text
        # Continue needs a local model: said so, and the answer stays as it was.
        errors: list[str] = []
        w.controller.error.connect(errors.append)
        w.chat_view.message_widgets[1].continue_button.click()
        assert len(errors) == 1 and errors[0].startswith("Continue works with a local model")
        assert not w.controller.busy
        assert (reply.state, reply.stats.stop_reason) == ("stopped", "cancelled")
        assert w.store.message(answer.id).status == "complete"
    finally:
        close_window(w)


def test_chat_bound_to_a_removed_connection_says_so(
    window: MainWindow, qtbot: QtBot, connections: ConnectionStore
) -> None:
    w = window
    assert w.store is not None
    c = w.store.create_conversation(
        "Old remote chat", settings={"engine": {"connection": "Gone", "model": "m"}}
    )
    w.open_conversation(c.id)
    picker = picker_of(w)
    assert picker.binding() == {"connection": "Gone", "model": "m"}
    assert picker.combo.currentText() == "Gone · m (not available)"
    send(qtbot, w, "Hello?")
    assert w.controller.loaded is None
    assert w.banner.isVisible()
    assert w.banner.label.text() == (
        "Could not use Gone · m: no connection named 'Gone' (known: none saved yet)"
    )
    # Back to the local model for this chat: saved with it.
    assert picker.choose(None)
    assert "engine" not in w.controller.chat_settings
    assert w.store.conversation(c.id).settings["engine"] is None


@pytest.mark.timeout(600)
@pytest.mark.model
def test_partial_answer_is_kept_when_the_server_dies(
    qtbot: QtBot, connections: ConnectionStore, tmp_path: Path
) -> None:
    served = start_server(tmp_path / "serve")
    w = make_window(qtbot, connections, SamplingParams(temperature=0.0, max_tokens=1500))
    try:
        connections.add(Connection(NAME, served.url), API_KEY)
        binding = listed_binding(qtbot, w, NAME)
        assert picker_of(w).choose(binding)
        qtbot.keyClicks(
            w.chat_view.input,
            "Write a long story about a dragon who learns to cook, with many chapters.",
        )
        qtbot.keyClick(w.chat_view.input, Qt.Key.Key_Return)
        qtbot.waitUntil(
            lambda: w.chat_model.rowCount() == 2 and len(w.chat_model.message(1).text) >= 40,
            timeout=300_000,
        )
        served.kill()
        qtbot.waitUntil(lambda: not w.controller.busy, timeout=60_000)

        reply = w.chat_model.message(1)
        assert reply.state == "interrupted"
        assert reply.error is not None and "connection dropped mid-answer" in reply.error
        assert len(reply.text) >= 40
        widget = w.chat_view.message_widgets[1]
        assert widget.error_label.isVisible() and widget.error_label.text() == reply.error
        assert widget.footer.text() == "interrupted: the answer above is partial"
        qtbot.waitUntil(lambda: not w.perf_panel.generating, timeout=5_000)  # its own event
        # Saved as interrupted with all of the text that arrived, and shown so after reopening.
        assert w.store is not None and w.controller.conversation_id is not None
        cid = w.controller.conversation_id
        answer = w.store.active_path(cid)[-1]
        assert answer.status == "interrupted" and answer.content == reply.text
        assert answer.stats["error"] == reply.error
        w.new_chat()
        w.open_conversation(cid)
        again = w.chat_model.message(1)
        assert (again.state, again.text, again.error) == ("interrupted", reply.text, reply.error)
    finally:
        close_window(w)
        served.kill()


def test_connections_dialog_add_test_remove(
    window: MainWindow,
    qtbot: QtBot,
    served: Served,
    connections: ConnectionStore,
    keyring_backend: MemoryKeyring,
    tmp_path: Path,
) -> None:
    dialog = window.open_connections()
    assert isinstance(dialog, ConnectionsDialog)
    qtbot.waitExposed(dialog)
    assert dialog.names() == [] and not dialog.remove_button.isEnabled()
    assert dialog.verify_tls.isChecked()  # on unless the user turns it off
    assert dialog.api_key.echoMode() == dialog.api_key.EchoMode.Password
    qtbot.keyClicks(dialog.name, NAME)
    qtbot.keyClicks(dialog.base_url, served.url)
    qtbot.keyClicks(dialog.api_key, API_KEY)

    # Test before saving: the form as it is, off the GUI thread.
    with qtbot.waitSignal(dialog.tested, timeout=60_000) as got:
        dialog.test_button.click()
    assert got.args is not None and got.args[0] is True
    assert re.fullmatch(r"1 model, answered in \d+ ms", got.args[1])
    assert dialog.status.text() == f"\u2713 {got.args[1]}"
    assert dialog.models.count() == 1
    model = dialog.models.item(0).text()
    dialog.models.setCurrentRow(0)
    assert dialog.model.currentText() == model

    dialog.save_button.click()
    assert connections.names() == [NAME] and dialog.names() == [NAME]
    assert dialog.api_key.text() == "" and "saved" in dialog.api_key.placeholderText()
    saved = connections.get(NAME)
    assert (saved.base_url, saved.api, saved.model, saved.verify_tls) == (
        served.url,
        "openai",
        model,
        True,
    )
    assert keyring_backend.store[(SERVICE, f"connection:{NAME}")] == API_KEY
    assert API_KEY not in connections.path.read_text()
    # The window's engine list follows.
    qtbot.waitUntil(
        lambda: any(
            b == {"connection": NAME, "model": model} for _, b in picker_of(window).items()
        ),
        timeout=60_000,
    )

    # A wrong key typed in: the test says so in one line; the saved key is untouched.
    dialog.api_key.setText("wrong")
    with qtbot.waitSignal(dialog.tested, timeout=60_000) as got:
        dialog.test_button.click()
    assert got.args == [False, f"{NAME}: wrong or missing API key (HTTP 401)"]
    dialog.api_key.clear()  # empty: the saved key is used
    with qtbot.waitSignal(dialog.tested, timeout=60_000) as got:
        dialog.test_button.click()
    assert got.args is not None and got.args[0] is True
    save_shot(dialog, shots_dir(tmp_path) / "connections.png")

    # A bad URL is refused at save, with the reason.
    dialog.new_connection()
    qtbot.keyClicks(dialog.name, "Broken")
    qtbot.keyClicks(dialog.base_url, "ftp://example")
    assert not dialog.save()
    assert dialog.status.text().startswith("\u2717 Broken:")
    assert connections.names() == [NAME]

    # Edit: rename it and lengthen its timeout; the key moves with it.
    dialog.list.setCurrentRow(0)
    assert dialog.name.text() == NAME and dialog.api_key.text() == ""
    assert "saved" in dialog.api_key.placeholderText()
    dialog.name.setText("Office")
    dialog.timeout.setValue(300.0)
    dialog.save_button.click()
    assert connections.names() == ["Office"] and dialog.names() == ["Office"]
    assert connections.get("Office").timeout_s == 300.0
    assert connections.api_key("Office") == API_KEY
    assert (SERVICE, f"connection:{NAME}") not in keyring_backend.store

    dialog.remove_button.click()
    assert connections.names() == [] and dialog.names() == []
    assert not keyring_backend.store
    dialog.close()
