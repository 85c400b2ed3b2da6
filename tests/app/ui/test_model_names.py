"""One name per model, everywhere the window names it: derived from the file for the bundled
SmolLM2 ("SmolLM2 135M Instruct · Q4_1", not its `general.name` "Smollm2 135M 8k Lc100K Mix1
Ep2"), renamed in the library's table, shown at once in the Engine picker, the status bar,
the library's status, the performance panel, the Local server and Benchmark windows, new
answers' headers and the Markdown export, and still there after a restart. The Local server's
API id stays the slug."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication, QLineEdit
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.library import DEFAULT_MODEL_ID
from app.services.paths import AppPaths
from app.ui.bench_view import BenchView
from app.ui.bench_worker import BenchRequest, BenchWorker
from app.ui.main_window import MainWindow
from app.ui.server_panel import ServerPanel, model_line
from engine.bench.harness import BenchConfig
from engine.bench.result import BenchResult
from engine.bench.workloads import Workload
from engine.host.host import ModelHost
from engine.settings import LoadParams, SamplingParams

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")
DERIVED = "SmolLM2 135M Instruct · Q4_1"
SLUG = "smollm2-135m-instruct-q4_1"
NEW = "Pocket SmolLM"


def open_window(qtbot: QtBot) -> MainWindow:
    w = build_window(sampling=SamplingParams(temperature=0.0, max_tokens=3))
    w.ask_quit = lambda _parent, _warnings: True
    w.show()
    qtbot.waitExposed(w)
    return w


def close_window(w: MainWindow) -> None:
    w.close()
    w.shutdown()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = open_window(qtbot)
    yield w
    close_window(w)


def library_name(w: MainWindow) -> str:
    lm = w.library_model
    return str(lm.data(lm.index(lm.row_of(DEFAULT_MODEL_ID), 0)))


def test_name_column_is_not_cut_at_the_default_window_size(window: MainWindow) -> None:
    assert window.size().width() == 1360  # the default size (no saved geometry)
    table = window.library_panel.table
    header = table.horizontalHeader()
    assert library_name(window) == DERIVED
    needed = table.sizeHintForColumn(0)  # the widest name, with the cell's padding
    assert needed > table.fontMetrics().horizontalAdvance(DERIVED)
    assert header.sectionSize(0) >= needed
    # ... and all of it inside the visible part of the table, with the other columns.
    assert header.sectionViewportPosition(0) + header.sectionSize(0) <= table.viewport().width()
    assert header.length() <= table.viewport().width()
    assert not table.horizontalScrollBar().isVisible()


def names_shown(w: MainWindow) -> dict[str, str]:
    server = w.findChild(ServerPanel)
    bench = w.findChild(BenchView)
    assert server is not None and bench is not None and w.engine_picker is not None
    return {
        "library": library_name(w),
        "picker": w.engine_picker.items()[0][0],
        "status bar": w.model_label.text(),
        "library status": w.library_panel.status.text(),
        "performance": w.perf_panel.labels["model"].text(),
        "server": server.model_label.text(),
        "benchmark": bench.model_label.text(),
    }


def expected(name: str) -> dict[str, str]:
    return {
        "library": name,
        "picker": f"This computer: {name}",
        "status bar": f"{name} · ctx 512",
        "library status": f"Loaded {name} · context 512",
        "performance": name,
        "server": model_line(name, SLUG),  # the API id does not follow a rename
        "benchmark": f"<b>Model:</b> {name} (SmolLM2-135M-Instruct.Q4_1.gguf)",
    }


def shown_as_expected(w: MainWindow, name: str) -> bool:
    shown = names_shown(w)
    shown["library status"] = shown["library status"].rsplit(" · ", 1)[0]  # load time
    return shown == expected(name)


def answer(qtbot: QtBot, w: MainWindow, text: str) -> str:
    """Ask, wait for the answer, and return the model name in its header."""
    assert w.controller.send(text)
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=120_000)
    widget = w.chat_view.message_widgets[-1]
    assert widget.role == "assistant" and widget.model_label.isVisibleTo(w)
    return widget.model_label.text()


@pytest.mark.slow
def test_rename_shows_everywhere_and_survives_a_restart(
    qtbot: QtBot, smollm2_path: Path, tmp_path: Path
) -> None:
    w = open_window(qtbot)
    try:
        renamed_while_loaded(qtbot, w, smollm2_path, tmp_path)
    finally:
        close_window(w)
    # The next start: the library still has the name.
    again = open_window(qtbot)
    try:
        assert library_name(again) == NEW
        names = json.loads((AppPaths.default().models / "names.json").read_text("utf-8"))
        assert names == {str(smollm2_path.resolve()): NEW}
        # The context menu's "Use the derived name" (an empty name does the same).
        entry = again.library_panel.selected_entry()
        assert entry is not None and entry.id == DEFAULT_MODEL_ID
        menu = again.library_panel.rename_actions(entry)
        reset = menu.actions()[1]
        assert reset.isEnabled() and DERIVED in reset.text()
        reset.trigger()
        qtbot.waitUntil(lambda: library_name(again) == DERIVED, timeout=5_000)
        assert again.engine_picker is not None
        assert again.engine_picker.items()[0][0] == f"This computer: {DERIVED}"
        assert json.loads((AppPaths.default().models / "names.json").read_text("utf-8")) == {}
        again.library_model.setData(again.library_model.index(0, 0), NEW)
        qtbot.waitUntil(lambda: library_name(again) == NEW, timeout=5_000)
        again.library_model.setData(again.library_model.index(0, 0), "  ")  # empty: derived
        qtbot.waitUntil(lambda: library_name(again) == DERIVED, timeout=5_000)
    finally:
        close_window(again)


def renamed_while_loaded(qtbot: QtBot, w: MainWindow, smollm2_path: Path, tmp_path: Path) -> None:
    w._load(smollm2_path, LoadParams(n_ctx=512, n_threads=1))
    qtbot.waitUntil(lambda: w.controller.loaded is not None, timeout=120_000)
    qtbot.waitUntil(lambda: shown_as_expected(w, DERIVED), timeout=5_000)
    assert w.controller.loaded is not None and w.controller.loaded.model_id == SLUG
    assert answer(qtbot, w, "Hi") == DERIVED

    # Rename in the table, as a person does: F2 (the editor holds the name), type, Enter.
    table = w.library_panel.table
    table.setFocus()
    table.setCurrentIndex(w.library_model.index(w.library_model.row_of(DEFAULT_MODEL_ID), 0))
    qtbot.keyClick(table, Qt.Key.Key_F2)
    editor = table.viewport().findChild(QLineEdit)
    assert editor is not None and editor.text() == DERIVED
    editor.selectAll()
    qtbot.keyClicks(editor, NEW)
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: shown_as_expected(w, NEW), timeout=5_000)
    assert w.controller.loaded is not None and w.controller.loaded.name == NEW
    assert w.library_panel.selected_entry() is not None
    assert w.library_panel.selected_entry().id == DEFAULT_MODEL_ID  # type: ignore[union-attr]
    # The first answer was written under the old name and keeps it; the next has the new one.
    assert w.chat_view.message_widgets[1].model_label.text() == DERIVED
    assert answer(qtbot, w, "Hello") == NEW
    assert w.store is not None
    cid = w.controller.conversation_id
    assert cid is not None
    stored = [m.model for m in w.store.active_path(cid) if m.role == "assistant"]
    assert stored == [DERIVED, NEW]
    md = tmp_path / "chats.md"
    w.export_chats(md, "md")
    assert f"*{NEW} · " in md.read_text("utf-8")


def test_benchmark_result_carries_the_shown_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The saved JSON and the charts name the model as the window does."""
    import engine.bench.embedded as embedded

    def fake_run(*_args: Any, **_kwargs: Any) -> BenchResult:
        return BenchResult(target={"name": "Smollm2 135M 8k Lc100K Mix1 Ep2", "file": "x.gguf"})

    monkeypatch.setattr(embedded, "run_loaded_benchmark", fake_run)
    host = ModelHost()
    model: Any = object()
    monkeypatch.setattr(host, "get", lambda name: model if name == SLUG else None)
    worker = BenchWorker(host)
    got: list[Any] = []
    worker.finished.connect(got.append)
    worker.failed.connect(got.append)
    workload = Workload(name="chat", prompts=(), source="test")
    worker.run(BenchRequest(SLUG, workload, BenchConfig(), title=NEW), threading.Event())
    assert len(got) == 1 and not isinstance(got[0], str), got
    assert got[0].result.target == {
        "name": NEW,
        "file": "x.gguf",
        "general_name": "Smollm2 135M 8k Lc100K Mix1 Ep2",
    }


def test_library_model_with_names_passes_modeltester(
    qtmodeltester: Any, tmp_path: Path, smollm2_path: Path
) -> None:
    from app.services.library import ModelLibrary
    from app.ui.library_model import LibraryModel

    (tmp_path / "broken.gguf").write_bytes(b"nope")
    lib = ModelLibrary(tmp_path, bundled=smollm2_path, discovery=False)
    lib.rename(DEFAULT_MODEL_ID, NEW)
    model = LibraryModel(lib.entries())
    qtmodeltester.check(model)
    row, broken = model.row_of(DEFAULT_MODEL_ID), model.row_of("broken")
    index = model.index(row, 0)
    assert index.data() == NEW and index.data(Qt.ItemDataRole.EditRole) == NEW
    assert f"Your name for {DERIVED}" in index.data(Qt.ItemDataRole.ToolTipRole)
    assert model.flags(index) & Qt.ItemFlag.ItemIsEditable
    assert not model.flags(model.index(row, 1)) & Qt.ItemFlag.ItemIsEditable
    assert not model.flags(model.index(broken, 0)) & Qt.ItemFlag.ItemIsEditable
    asked: list[tuple[str, str]] = []
    model.rename_requested.connect(lambda i, n: asked.append((i, n)))
    assert not model.setData(index, f" {NEW} ")  # unchanged: nothing to ask
    assert model.setData(index, "Other")
    assert not model.setData(model.index(row, 1), "x")
    assert asked == [(DEFAULT_MODEL_ID, "Other")]
