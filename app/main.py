"""Builds and wires the desktop application: the one place where services, the engine thread
and the window are created and connected."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes.util
import dataclasses
import logging
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import qasync
from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication

from app.services.chat_store import ChatStore, ChatStoreError, default_store_path
from app.services.connections import FILE_NAME as CONNECTIONS_FILE
from app.services.connections import ConnectionStore
from app.services.default_embedding import DefaultEmbedding
from app.services.documents import index_path
from app.services.embedding_models import EmbeddingModels
from app.services.library import LibraryEntry, ModelLibrary
from app.services.local_server import ServeSettings
from app.services.model_catalog import library_catalog, server_params
from app.services.model_settings import SERVED_KEYS, ModelSettingsStore
from app.services.paths import AppPaths
from app.services.speed_records import SpeedService
from app.ui.chat_model import ChatModel
from app.ui.controller import ChatController, LibrarySelection, ModelName
from app.ui.documents_panel import DocumentsPanel
from app.ui.estimate import Estimator
from app.ui.index_job import embedding_loader
from app.ui.library_model import LibraryModel, is_reranker
from app.ui.library_panel import LibraryPanel
from app.ui.main_window import MainWindow
from app.ui.worker import EngineHost, EngineWorker, probing_factory
from engine.host.host import ModelHost
from engine.host.runtime import Model
from engine.native.load_probe import FirstLoads
from engine.rag.store import RagStore, StoreError
from engine.server.model_store import ModelStore
from engine.settings import LoadParams, SamplingParams

if TYPE_CHECKING:  # imported where they are built, as the other pages are
    from app.ui.loaded_models import LoadedModelsView
    from app.ui.server_panel import ServerPanel

# The GUI thread, the engine thread and the decode loop's thread share one interpreter lock,
# and a thread that wants it waits until the holder has run for the switch interval (5 ms by
# default). Back from llama_decode, the decode loop waited that long behind the GUI thread's
# layout and painting before it could sample and start the next token, with llama.cpp's
# threads idle. 0.5 ms bounds the wait; a plain decode loop is as fast either way
# (docs/benchmarks.md, "GUI streaming").
SWITCH_INTERVAL_S = 0.0005


def share_the_interpreter() -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def platform_problem() -> str | None:
    """Why Qt could not open a window here, as one line, or None.

    Qt aborts the process (no exception) when its platform plugin cannot load, so the usual
    causes are checked first.
    """
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return None
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        return (
            "no graphical display found (DISPLAY/WAYLAND_DISPLAY not set); "
            "run it from a desktop session, or use `candlewick run` in a terminal"
        )
    if (
        os.environ.get("DISPLAY")
        and not os.environ.get("WAYLAND_DISPLAY")
        and ctypes.util.find_library("xcb-cursor") is None
    ):
        return (
            "Qt needs the xcb-cursor library to open a window: install it "
            "(Debian/Ubuntu: sudo apt install libxcb-cursor0; Fedora: sudo dnf install "
            "xcb-util-cursor) and start Candlewick again"
        )
    return None


def settings_for(paths: AppPaths) -> QSettings:
    paths.config.mkdir(parents=True, exist_ok=True)
    return QSettings(str(paths.config / "window.ini"), QSettings.Format.IniFormat)


def on_demand_params(
    settings: QSettings, saved: ModelSettingsStore
) -> Callable[[LibraryEntry], LoadParams]:
    """The load settings of a library model an API request loads on demand: the Local
    server's slots and context as last started, with the settings saved for the model over
    them (a saved context is each slot's)."""
    file, fmt = settings.fileName(), settings.format()
    default = ServeSettings()

    def params(entry: LibraryEntry) -> LoadParams:
        # An object of its own: the catalog is read on the server's threads, and one
        # QSettings object is not to be shared between threads (the file's cache is).
        st = QSettings(file, fmt)
        slots = [default.parallel, default.ctx_per_slot]
        for i, key in enumerate(("server/parallel", "server/ctx")):
            with contextlib.suppress(ValueError):  # a hand-edited file: keep the default
                slots[i] = int(str(st.value(key, slots[i])))
        base = server_params(slots[0], slots[1])
        return saved.get(entry.path).load_params(base, slots=slots[0], keys=SERVED_KEYS)

    return params


def make_estimator() -> Estimator | None:
    """The engine's memory estimate adapted to the widget (None: the widget says so)."""
    from app.ui.memory_adapter import engine_estimator

    try:
        return engine_estimator()
    except (OSError, RuntimeError) as e:  # hardware probing failed: show no numbers
        logging.getLogger("candlewick").warning("memory estimate unavailable: %s", e)
        return None


def gpu_probe() -> Callable[[], list[tuple[str, int, int]]]:
    """(name, used, total) bytes per GPU llama.cpp can use, for the performance panel. A
    machine without one is probed once, not on every panel tick."""
    from engine.memory.hardware import llama_devices

    def probe() -> list[tuple[str, int, int]]:
        try:
            return [(d.name, d.total_bytes - d.free_bytes, d.total_bytes) for d in llama_devices()]
        except (OSError, RuntimeError, AttributeError):
            return []

    return probe if probe() else list


def add_model_manager(
    window: MainWindow, library: ModelLibrary, speed: SpeedService | None = None
) -> ModelStore:
    """The Hub / downloads view: the Downloads page of the rail. Returns the model store
    the Local server pulls through, with the same download manager: its pulls are listed
    on this page as they run."""
    from app.services.download_manager import DownloadManager
    from app.services.hub import HubClient, default_fit, header_speed
    from app.services.secrets import TokenStore
    from app.services.server_models import LibraryModelStore
    from app.ui.model_manager import ModelManagerView

    tokens = TokenStore()
    # `speed`: each file's decode speed predicted on this machine, beside its fit.
    hub = HubClient(
        token=tokens.get, fit=default_fit(), speed=header_speed(speed) if speed else None
    )
    downloads = DownloadManager(library.downloads_state, hub)
    view = ModelManagerView(hub, downloads, library, tokens)
    view.load_requested.connect(window.load_path)
    view.library_changed.connect(window.refresh_library)
    # A rename in the library table: its list shows the new name too (after the rename,
    # which is queued the same way and connected first).
    window.library_model.rename_requested.connect(
        view.refresh_library, Qt.ConnectionType.QueuedConnection
    )
    view.status_changed.connect(lambda text: window.statusBar().showMessage(text, 5000))

    def shutdown() -> None:
        view.shutdown()
        downloads.close()

    window.add_page("downloads", view, shutdown=shutdown)
    return LibraryModelStore(library, downloads)


def add_benchmark(window: MainWindow, paths: AppPaths, speed: SpeedService) -> None:
    """The Benchmark page: a workload on the model the chat has loaded (Run is
    off while a reply is generated; the chat pauses while a benchmark runs), and
    Compare quants over the library's files (the chat pauses while they are scored)."""
    from PySide6.QtCore import Qt as _Qt

    from app.ui.bench_page import BenchPage
    from app.ui.bench_view import BenchView
    from app.ui.bench_worker import BenchHost, BenchWorker
    from app.ui.quant_compare_view import QuantCompareView
    from app.ui.quant_worker import QuantHost, QuantServices, QuantWorker

    c = window.controller
    # While another model loads, the one the chat had is being freed: nothing to run.
    view = BenchView(
        BenchHost(BenchWorker(window.engine.worker.host)),
        loaded=lambda: None if c.loading is not None else c.loaded,
    )
    w = window.engine.worker
    q = _Qt.ConnectionType.QueuedConnection  # after the controller has updated `loaded`
    for signal in (w.progress, w.loaded, w.unloaded, w.load_cancelled, w.failed):
        signal.connect(view.refresh_model, q)
    c.engine_changed.connect(view.refresh_model, q)  # a rename in the library too
    c.busy_changed.connect(view.set_chat_busy)
    pause = "A benchmark is running: the chat waits until it ends or is cancelled"
    view.running_changed.connect(lambda running: c.set_paused(pause if running else None))

    def record_speed(running: bool) -> None:
        # A finished run's one-request decode speed: "measured" for Compare quants.
        info = view.loaded
        if running or view.result is None or info is None or getattr(info, "remote", None):
            return
        from app.services.quant_facts import record_bench_speed

        with contextlib.suppress(OSError):  # the file gone since: nothing to keep
            record_bench_speed(speed, Path(info.path), view.result)

    view.running_changed.connect(record_speed)
    services = QuantServices(
        window.library,
        speed,
        paths.cache / "quality",
        QuantCompareView.saved_path(paths.data),
        FirstLoads(paths.cache),
    )
    quants = QuantCompareView(QuantHost(QuantWorker(services)))
    scoring = "Quants are being compared: the chat waits until that ends or is cancelled"
    quants.running_changed.connect(lambda running: c.set_paused(scoring if running else None))
    page = BenchPage(view, quants)
    window.add_page("benchmark", page, shortcut="Ctrl+Shift+B", shutdown=page.shutdown)


def add_server_panel(window: MainWindow, store: ModelStore | None = None) -> ServerPanel:
    """The Local server page: serve the chat's loaded model over the
    OpenAI/Ollama API (the engine thread's model host finds it); stopped when the app
    quits or the model is unloaded. `store`: Ollama's pulls, copies and created models."""
    from PySide6.QtCore import Qt as _Qt

    from app.services.secrets import SecretStore
    from app.ui.server_panel import ServerPanel

    panel = ServerPanel(
        loaded=lambda: window.controller.loaded,
        secrets=SecretStore(),
        estimator=window.library_panel.estimate.estimator,
        settings=window.settings,
        model_host=window.engine.worker.host,
        model_store=store,
    )
    w = window.engine.worker
    q = _Qt.ConnectionType.QueuedConnection  # after the controller has updated `loaded`
    for signal in (w.loaded, w.unloaded, w.load_cancelled, w.failed):
        signal.connect(panel.refresh_model, q)
    window.controller.engine_changed.connect(panel.refresh_model, q)  # a rename too
    window.add_page(
        "server",
        panel,
        shortcut="Ctrl+Shift+H",
        shutdown=panel.shutdown,
        quit_warning=panel.quit_warning,
    )
    return panel


def add_loaded_models(window: MainWindow) -> LoadedModelsView:
    """The Loaded models window (Tools menu): every model in the app's host (the chat's and
    those API requests loaded on demand), their memory and keep-alive; pin and eject."""
    from app.ui.loaded_models import LoadedModelsView

    view = LoadedModelsView(
        window.engine.worker.host,
        title=lambda h: window.model_name(h.path) if h.path else None,
        eject_chat=window.controller.eject,
    )
    window.add_tool_window("Loaded models…", view, "Ctrl+Shift+M", view.shutdown)
    return view


def add_tray(window: MainWindow, panel: ServerPanel, loaded: LoadedModelsView) -> None:
    """The tray icon while the Local server serves (Show window, the server on or off, the
    loaded models, Quit), and the window hidden to it on close when the Local server page's
    "Keep serving when the window is closed" is on. No icon where there is no system tray."""
    from app.ui.tray import ServerTray

    def unload(name: str) -> bool:
        loaded.refresh()  # the window lists the host's models as they are now
        return loaded.eject(name)

    tray = ServerTray(
        window,
        panel,
        window.engine.worker.host,
        unload=unload,
        title=lambda h: (window.model_name(h.path) if h.path else None) or h.name,
    )
    window.add_closer(tray.shutdown)


def add_mcp_servers(window: MainWindow, paths: AppPaths) -> None:
    """The MCP servers dialog (Tools menu): the tool servers the chat may use, their
    settings (tokens in the keyring) and the tools each one offers."""
    from app.services.mcp_config import FILE_NAME, McpConfigStore
    from app.services.secrets import SecretStore
    from app.ui.mcp_dialog import McpServersDialog
    from app.ui.tool_runner import ToolRunner

    store = McpConfigStore(paths.config / FILE_NAME, SecretStore())
    dialog = McpServersDialog(store)
    runner = ToolRunner(store)
    turns = window.controller.use_tools(runner)
    window.chat_view.tool_decision.connect(turns.decide)
    window.chat_view.tool_cancel.connect(turns.cancel_tool)
    settings = window.chat_settings
    if settings is not None:  # the chat's own choice of servers, from the dialog's list
        settings.set_tool_servers(lambda: [s.name for s in runner.servers() if s.enabled])
        dialog.changed.connect(settings.refresh_tools)

    def shutdown() -> None:
        dialog.done(0)  # a test still waiting on a server gives up (its server is stopped)
        runner.shutdown()  # running calls are cancelled, the servers stopped

    window.add_tool_window("MCP servers…", dialog, "Ctrl+Shift+T", shutdown)


def documents_panel(
    paths: AppPaths, library: ModelLibrary, models: EmbeddingModels
) -> tuple[DocumentsPanel | None, str | None]:
    """The Documents tab over the documents index (the one `candlewick docs` uses), or None
    and why it cannot be opened (the app still opens, without it)."""
    try:
        store = RagStore(index_path(paths))
    except (StoreError, sqlite3.Error, OSError) as e:
        return None, f"Your document collections cannot be opened: {e}"
    panel = DocumentsPanel(
        store,
        library,
        embedding_loader(models),
        default_embedding=DefaultEmbedding(paths.models),
    )
    return panel, None


def add_speech(window: MainWindow) -> None:
    """Answers read aloud (Read aloud, a chat's auto-read, Tools → Voice…) and hands-free."""
    from app.ui.speech_setup import add_speech as install

    install(window)


def add_documents(window: MainWindow, paths: AppPaths, models: EmbeddingModels) -> None:
    """Chats grounded in document collections: the index's collections in Chat settings,
    searched with the embedding models the Documents tab shares."""
    from app.services.documents import index_path, open_documents
    from app.services.retrieval import Retriever

    retriever = Retriever(lambda: open_documents(paths), models=models)
    window.controller.use_documents(retriever)
    if window.chat_settings is not None:
        # Listing them never creates an index that is not there yet.
        window.chat_settings.set_collections(
            lambda: retriever.names() if index_path(paths).exists() else []
        )
        window.chat_settings.set_rerankers(lambda: library_rerankers(window.library_model))

    def close() -> None:
        window.controller.close_documents()  # a search under way ends first
        retriever.close()
        models.close()  # after the Documents tab's indexing too (a late closer)

    window.add_closer(close)


def library_rerankers(model: LibraryModel) -> list[tuple[str, Path]]:
    """The library's rerankers as the chat settings offer them: (name, file)."""
    entries = (model.entry(row) for row in range(model.rowCount()))
    return [(e.name, e.path) for e in entries if e.error is None and is_reranker(e)]


def library_selection(panel: LibraryPanel) -> LibrarySelection:
    """The model selected in the library with the panel's load settings (None: none is)."""

    def selection() -> tuple[Path, LoadParams] | None:
        path = panel.selected_path()
        return None if path is None else (path, panel.load_params())

    return selection


def library_names(model: LibraryModel) -> ModelName:
    """The library's name for a model file (None: the file is not listed)."""

    def name(path: Path) -> str | None:
        for row in range(model.rowCount()):
            e = model.entry(row)
            if e.path == path:
                return e.name
        return None

    return name


def open_store(paths: AppPaths) -> tuple[ChatStore | None, set[int], str | None]:
    """The chat history and the conversations whose answers a crash cut off (now marked
    interrupted); or None and why (the app still opens, without history)."""
    try:
        store = ChatStore(default_store_path(paths.data))
        cut = {m.conversation_id for m in store.recover_interrupted()}
    except ChatStoreError as e:
        return None, set(), f"Chats will not be saved: {e}"
    return store, cut, None


def build_window(
    paths: AppPaths | None = None,
    *,
    library: ModelLibrary | None = None,
    worker: EngineWorker | None = None,
    estimator: Estimator | None = None,
    sampling: SamplingParams | None = None,
    model_manager: bool = False,
    connections: ConnectionStore | None = None,
) -> MainWindow:
    """Create the chat store, the engine thread, the library panel, the chat's controller
    (which reads the panel's selection) and the main window; the caller shows it and,
    at the end, calls `window.shutdown()`. `model_manager` adds the Hub / downloads tab;
    `connections`: the saved remote engines (default: the app's config folder, keys in the
    system keyring)."""
    paths = (paths or AppPaths.default()).ensure()
    library = library or ModelLibrary(paths.models)
    store, cut, problem = open_store(paths)
    first_loads = FirstLoads(paths.cache)
    settings = settings_for(paths)
    model_settings = ModelSettingsStore.for_paths(paths)
    own_host: ModelHost | None = None
    if worker is None:
        # The app's one host: the chat's model, and library models API requests name,
        # loaded on demand (checked in a child process on a file's first load).
        host = ModelHost(
            library_catalog(
                library, on_demand_params(settings, model_settings), loaded=lambda: host.hosted()
            ),
            loader=lambda spec: Model(spec.path, spec.params, first_loads=first_loads),
        )
        own_host = host
        worker = EngineWorker(probing_factory(first_loads), host=host)
    engine = EngineHost(worker)
    library_model = LibraryModel()
    panel = LibraryPanel(
        library_model,
        estimator or make_estimator(),
        settings=settings,
        model_settings=model_settings,
    )
    controller = ChatController(
        engine,
        ChatModel(),
        library=library_selection(panel),
        connections=connections or ConnectionStore(paths.config / CONNECTIONS_FILE),
        sampling=sampling,
        store=store,
        model_name=library_names(library_model),
    )
    # Loaded through the app's host: counted against its budget, listed with the others.
    embedding_models = EmbeddingModels(host=worker.host, first_loads=first_loads)
    documents, no_documents = documents_panel(paths, library, embedding_models)
    if documents is not None:
        # Indexing holds while the chat answers: both on the same cores halve the chat.
        controller.busy_changed.connect(documents.set_chat_busy)
    window = MainWindow(
        controller, library, panel, settings, gpu_probe=gpu_probe(), documents=documents
    )
    if documents is not None:
        window.add_closer(documents.store.close)
    if own_host is not None:
        # After the engine thread (the chat's model is gone): the models loaded on demand
        # and the host's keep-alive thread.
        window.add_closer(own_host.close)
    if store is not None:
        window.add_closer(store.close)
        # After a crash, show the conversation whose answer was cut off, with "Continue".
        recent = [c for c in store.conversations() if c.id in cut]
        if recent:
            window.open_conversation(max(recent, key=lambda c: c.updated_at).id)
        else:
            window.reopen_last_conversation()
    if problem or no_documents:
        window.show_error(problem or no_documents or "")
    # Predicted decode speeds (Hub files, the model bar) and the speeds the chat measures.
    speed = SpeedService(paths.data)
    window.set_speed_service(speed)
    model_store = add_model_manager(window, library, speed) if model_manager else None
    add_benchmark(window, paths, speed)
    server_panel = add_server_panel(window, model_store)
    add_tray(window, server_panel, add_loaded_models(window))
    add_mcp_servers(window, paths)
    add_documents(window, paths, embedding_models)
    add_speech(window)
    return window


def autosend(window: MainWindow, text: str) -> None:
    """Test hook (CANDLEWICK_AUTOSEND): send `text` once the window runs, with a long answer
    budget so a test can kill the app mid-answer."""
    from PySide6.QtCore import QTimer

    window.controller.sampling = dataclasses.replace(window.controller.sampling, max_tokens=4096)
    QTimer.singleShot(0, lambda: window.controller.send(text))


def run_app(argv: Sequence[str] | None = None) -> int:
    problem = platform_problem()
    if problem:
        print(f"candlewick: error: {problem}", file=sys.stderr)
        return 2
    # Fractional scale factors (150%) drawn as they are, not rounded to 1x or 2x.
    existing = QApplication.instance()
    if existing is None:
        QGuiApplication.setHighDpiScaleFactorRoundingPolicy(
            Qt.HighDpiScaleFactorRoundingPolicy.PassThrough
        )
    app = existing or QApplication(list(argv or sys.argv))
    share_the_interpreter()
    QApplication.setApplicationName("Candlewick")
    QApplication.setApplicationDisplayName("Candlewick")
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    window = build_window(model_manager=True)
    window.show()
    window.activateWindow()
    window.focus_input()
    if os.environ.get("CANDLEWICK_AUTOSEND"):
        autosend(window, os.environ["CANDLEWICK_AUTOSEND"])
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    try:
        with loop:
            loop.run_until_complete(closed.wait())
    finally:
        window.shutdown()
        asyncio.set_event_loop(None)
    return 0


__all__ = ["build_window", "platform_problem", "run_app"]
