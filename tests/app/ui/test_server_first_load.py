"""The Local server panel loads a file neither it nor the chat has loaded before in a child
first, like the chat: a file that aborts llama.cpp leaves the app up and the panel says why.
The abort comes from the probe child's fault hook (tests/app/ui/test_first_load_probe.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.paths import AppPaths
from app.services.secrets import SecretStore
from app.ui.server_panel import ServerPanel
from app.ui.worker import LoadedModel
from engine.native.load_probe import FIRST_LOADS_FILE, FirstLoads
from engine.native.native_load import FAULT_ENV
from engine.settings import LoadParams
from tests.app.ui.test_server_panel import free_port
from tests.memory_keyring import MemoryKeyring

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def test_the_window_gives_the_panel_the_chats_record(qtbot: QtBot) -> None:
    w = build_window()
    try:
        panel = w.findChild(ServerPanel)
        assert panel is not None and panel.first_loads is not None
        assert panel.first_loads.file == AppPaths.default().cache / FIRST_LOADS_FILE
    finally:
        w.close()
        w.shutdown()
        w.deleteLater()
        QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def test_an_abort_on_the_servers_first_load_is_one_line(
        qtbot: QtBot, smollm2_path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = Path(shutil.copyfile(smollm2_path, tmp_path / "aborts.gguf"))
    first_loads = FirstLoads(tmp_path)
    model = LoadedModel(path=path, name="aborts", n_ctx=1024, n_layer=30, n_gpu_layers=0,
                        load_s=0.1, params=LoadParams(n_ctx=1024, n_threads=1))
    panel = ServerPanel(lambda: model, SecretStore(MemoryKeyring()), first_loads=first_loads)
    qtbot.addWidget(panel)
    panel.port.setValue(free_port())
    panel.parallel.setValue(1)
    panel.ctx.setValue(512)
    try:
        monkeypatch.setenv(FAULT_ENV, "abort")
        with qtbot.waitSignal(panel.running_changed, timeout=60_000) as sig:
            assert panel.start()
        assert sig.args == [False]
        assert re.fullmatch(r"Could not start: llama\.cpp crashed while loading aborts\.gguf "
                            r"\(SIGABRT\): llama-model\.cpp:\d+: "
                            r"GGML_ASSERT\(!ml\.no_alloc\) failed", panel.status.text()), \
            panel.status.text()
        assert not first_loads.known(path)

        # Without the fault the same file serves, and is remembered for next time.
        monkeypatch.delenv(FAULT_ENV)
        with qtbot.waitSignal(panel.running_changed, timeout=60_000) as sig:
            assert panel.start()
        assert sig.args == [True], panel.status.text()
        assert first_loads.known(path)
    finally:
        panel.shutdown()
