"""The main window: a navigation rail and its pages, as chat apps lay them out.

Chat (the conversations sidebar, the chat with its model bar on top, the chat settings
drawer and the performance panel: `app.ui.chat_page`), Models (the library with its load
settings, memory estimate and Load / Cancel / Eject), Downloads, Documents, Local server and
Benchmark. Everything it shows is handed in (the chat's controller, with its engine host,
chat model and store; the library and its panel; settings); app/main.py builds those and
adds the other pages (`add_page`). Geometry, the panels' state and the colour scheme are
kept in the given QSettings.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, Qt
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMenu,
    QStackedWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.services.chat_exchange import import_data, write_export
from app.services.chat_store import ChatStoreError
from app.services.library import DEFAULT_MODEL_ID, LibraryError, ModelLibrary
from app.services.speed_records import SpeedService
from app.ui.appearance import SCHEMES, apply_scheme
from app.ui.appearance import SETTINGS_KEY as SCHEME_KEY
from app.ui.chat_page import LABELS as PANEL_LABELS
from app.ui.chat_page import ChatPage
from app.ui.chat_settings import ChatSettingsPanel
from app.ui.chat_view import ChatView
from app.ui.controller import ChatController
from app.ui.conversation_list import ConversationList
from app.ui.documents_panel import DocumentsPanel
from app.ui.engine_picker import Binding, EnginePicker, binding_of
from app.ui.library_model import tagged_name
from app.ui.library_panel import LibraryPanel
from app.ui.model_bar import ModelBar
from app.ui.nav_rail import NavRail
from app.ui.perf_panel import GpuProbe, PerfPanel, no_gpus
from app.ui.quit_guard import QuitQuestion, QuitWarning, ask_with_message_box, may_quit
from app.ui.shortcuts import install_shortcuts
from app.ui.side_panels import page_of, scrolled
from app.ui.worker import LoadedModel
from engine.host.stats import GenerationStats
from engine.settings import LoadParams

TITLE = "Candlewick"
# The settings key of the conversation on screen when the window last closed.
LAST_CONVERSATION = "chats/last"
# Which of the chat page's panels the user showed or hid (`ChatPage.state`).
CHAT_PANELS = "window/chat_panels"
# The rail's pages, top to bottom: key -> (label, icon, tooltip).
PAGES = {
    "chat": ("Chat", "chat", "The conversations and the chat"),
    "models": ("Models", "models", "The library: load settings, memory estimate, Load and Eject"),
    "downloads": ("Downloads", "downloads", "Search the Hub and download models"),
    "documents": ("Documents", "documents", "Collections of your documents for the chat"),
    "server": ("Local server", "server", "Serve the chat's model over the OpenAI/Ollama API"),
    "benchmark": ("Benchmark", "benchmark", "Measure the chat's model"),
}


class ErrorBanner(QFrame):
    """Errors shown in the window, readable, dismissable."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("errorBanner")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet(
            "#errorBanner { background: #fdecea; border: 1px solid #c62828; }"
            "#errorBanner QLabel { color: #8e0000; }"
        )
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setAccessibleName("Error message")
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QToolButton()
        close.setText("✕")
        close.setAccessibleName("Dismiss error")
        close.clicked.connect(self.hide)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 4, 4, 4)
        lay.addWidget(self.label, 1)
        lay.addWidget(close)
        self.hide()

    def show_message(self, text: str) -> None:
        self.label.setText(text)
        self.show()


class MainWindow(QMainWindow):
    def __init__(
        self,
        controller: ChatController,
        library: ModelLibrary,
        library_panel: LibraryPanel,
        settings: QSettings,
        gpu_probe: GpuProbe = no_gpus,
        parent: QWidget | None = None,
        *,
        documents: DocumentsPanel | None = None,
    ) -> None:
        """`controller`: the chat's (its engine host, chat model, store and remote
        connections are the window's); `library_panel`: the library's table and load
        settings, whose selection the controller reads; `documents`: the Documents tab."""
        super().__init__(parent)
        self.setWindowTitle(TITLE)
        self.controller = controller
        controller.setParent(self)
        self.engine = controller.engine
        self.library = library
        self.settings = settings
        self._closers: list[Callable[[], object]] = []
        self._tools_menu: QMenu | None = None
        self._late_closers: list[Callable[[], object]] = []
        # Work that quitting would stop, and how the user is asked (tests answer directly).
        self._quit_warnings: list[QuitWarning] = []
        self.ask_quit: QuitQuestion = ask_with_message_box

        self.library_panel = library_panel
        self.library_model = library_panel.model
        self.chat_model = controller.chat
        self.chat_view = ChatView(self.chat_model)
        # Remote engines: which engine this chat uses, above the chat.
        self.connections = connections = controller.connections
        self.engine_picker = EnginePicker(connections) if connections is not None else None
        self.perf_panel = PerfPanel(gpu_probe)
        self.banner = ErrorBanner()
        self.store = store = controller.store
        # Without a store (embedding, some tests) the chat lives only in memory.
        self.conversation_list = ConversationList(store) if store else None
        self.chat_settings = ChatSettingsPanel(store, self.controller.sampling) if store else None

        # The chat's model: picked, its fit and state shown, loaded and ejected above the chat.
        self.speed: SpeedService | None = None  # set_speed_service
        self.model_bar = ModelBar(
            self.library_model, library_panel.estimate.estimator, library_panel.load_params
        )
        self.chat_page = ChatPage(
            self.chat_view,
            self.model_bar,
            self.perf_panel,
            sidebar=self.conversation_list,
            drawer=self.chat_settings,
            engine_row=self.engine_picker,
        )
        self.perf_area = self.chat_page.areas["perf"]
        self.rail = NavRail()
        self.pages = QStackedWidget()
        self.pages.setObjectName("pages")
        self._page_of: dict[str, QWidget] = {}  # key -> the stack's widget (its scroll area)
        self._go_actions: list[QAction] = []
        self._tools_actions: list[QAction] = []
        self._panel_actions: list[QAction] = []
        self.rail.current_changed.connect(self.show_page)
        self.add_page("chat", self.chat_page, scroll=False)
        self.add_page("models", self.library_panel)
        # The collections of the user's documents (None: their index could not be opened).
        self.documents = documents
        if documents is not None:
            # Cancels indexing at shutdown; the next run resumes.
            self.add_page("documents", documents, shutdown=documents.shutdown)
            # Laid out for a side column: its rows of buttons read badly a window wide.
            documents.setMaximumWidth(760)
        central = QWidget()
        outer = QHBoxLayout(central)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)
        outer.addWidget(self.rail)
        line = QFrame()
        line.setFrameShape(QFrame.Shape.VLine)
        line.setFrameShadow(QFrame.Shadow.Sunken)
        outer.addWidget(line)
        body = QWidget()
        lay = QVBoxLayout(body)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.banner)
        lay.addWidget(self.pages, 1)
        outer.addWidget(body, 1)
        self.setCentralWidget(central)
        self.model_label = QLabel("No model loaded")
        self.statusBar().addPermanentWidget(self.model_label)
        self.show_page("chat")

        self._wire()
        self._actions()
        install_shortcuts(self)  # the chat's keys, the command palette
        self.refresh_library()
        self.restore_state()

    # -- wiring ----------------------------------------------------------------------------

    def _wire(self) -> None:
        w = self.engine.worker
        lp, pp, c = self.library_panel, self.perf_panel, self.controller
        lp.load_requested.connect(self._load)
        # Queued: the library is re-read after the name's editor has closed.
        self.library_model.rename_requested.connect(
            self.rename_model, Qt.ConnectionType.QueuedConnection
        )
        lp.cancel_requested.connect(c.cancel_load)
        lp.eject_requested.connect(c.eject)
        w.progress.connect(lp.set_progress)
        w.progress.connect(self.model_bar.set_progress)
        mb = self.model_bar
        lp.selection_changed.connect(mb.set_selected)
        mb.model_chosen.connect(self.choose_model)
        mb.load_requested.connect(self._load_selected)
        mb.cancel_requested.connect(c.cancel_load)
        mb.eject_requested.connect(c.eject)
        mb.settings_requested.connect(lambda: self.show_page("models"))
        self.chat_page.panels_changed.connect(self._sync_panel_actions)
        w.loaded.connect(self._on_loaded)
        w.load_cancelled.connect(self._on_unloaded)  # the old model was freed first
        w.unloaded.connect(self._on_unloaded)
        c.streaming_reply.connect(pp.follow)  # the chat's reply, no other, moves the panel
        w.started.connect(pp.on_started)
        w.tokens.connect(pp.on_tokens)
        w.reasoning.connect(pp.on_tokens)  # thinking tokens are generated tokens too
        w.finished.connect(pp.on_finished)
        w.finished.connect(self._record_speed)
        w.failed.connect(pp.on_failed)
        w.failed.connect(self._on_failed)
        self.chat_view.send_requested.connect(self._send)
        self.chat_view.stop_requested.connect(c.stop)
        # Attachments: checked against the engine that would answer; thumbnails of sent
        # ones read from the chat's files.
        att = self.chat_view.attacher
        att.check = c.attachment_refusal
        att.audio_rate = lambda: c.loaded.audio_rate if c.loaded is not None else 0
        att.refused.connect(self.show_error)
        self.chat_view.voice.notice.connect(self.show_error)
        self._closers.append(self.chat_view.voice.shutdown)
        self.chat_view.attachment_reader = c.attachment_data
        c.send_state_changed.connect(self.chat_view.set_busy)
        c.loading_started.connect(self._on_loading_started)
        c.error.connect(self.show_error)
        c.notice.connect(lambda text: self.statusBar().showMessage(text, 5000))
        c.context_changed.connect(self.chat_view.set_context)
        c.context_note.connect(self.chat_view.show_context_note)
        self.chat_view.message_action.connect(self._message_action)
        self.chat_view.edit_requested.connect(self._edit)
        cl, cs = self.conversation_list, self.chat_settings
        if cl is not None and cs is not None:
            cl.conversation_selected.connect(self.open_conversation)
            cl.new_chat_requested.connect(self.new_chat)
            cl.conversation_deleted.connect(self._on_conversation_deleted)
            cl.error.connect(self.show_error)
            cl.notice.connect(lambda text: self.statusBar().showMessage(text, 5000))
            self.chat_view.export_requested.connect(cl.export)
            c.conversations_changed.connect(self._on_conversations_changed)
            cs.changed.connect(c.set_chat_settings)
            cs.changed.connect(lambda _settings: self._show_system_prompt())
            c.engine_changed.connect(
                lambda info: cs.set_engine_caveat(None if info is None else info.repeat_caveat)
            )
        ep = self.engine_picker
        if ep is not None:
            ep.chosen.connect(self._on_engine_chosen)
            ep.manage_requested.connect(self.open_connections)
            lp.selection_changed.connect(
                # With what it reads besides text: "SmolVLM (vision)".
                lambda entry: ep.set_local_name(tagged_name(entry) if entry is not None else "")
            )
            self._closers.append(ep.shutdown)
            ep.refresh()

    def add_shortcut(
        self,
        text: str,
        keys: QKeySequence | QKeySequence.StandardKey | str,
        slot: Callable[[], object],
    ) -> QAction:
        """An action that `keys` trigger anywhere in the window (in no menu unless added)."""
        a = QAction(text, self)
        a.setShortcut(QKeySequence(keys))
        a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        a.triggered.connect(slot)
        self.addAction(a)
        return a

    def _actions(self) -> None:
        action = self.add_shortcut
        self.new_chat_action = action("New chat", QKeySequence.StandardKey.New, self.new_chat)
        self.focus_input_action = action("Focus input", "Ctrl+L", self.focus_input)
        self.stop_action = action("Stop", "Esc", self.controller.stop)
        self.quit_action = action("Quit", QKeySequence.StandardKey.Quit, self.close)
        menu = self.menuBar().addMenu("&Chat")
        for a in (self.new_chat_action, self.focus_input_action, self.stop_action):
            menu.addAction(a)
        if self.store is not None:
            menu.addSeparator()
            menu.addAction("Export all chats as JSON…", lambda: self._ask_export("json"))
            menu.addAction("Export all chats as Markdown…", lambda: self._ask_export("md"))
            menu.addAction("Import chats from JSON…", self._ask_import)
        menu.addSeparator()
        menu.addAction(self.quit_action)
        self._view_menu = view = self.menuBar().addMenu("&View")
        self._go_menu = view.addMenu("&Go to")
        for a in self._go_actions:  # the pages added before the menus existed
            self._go_menu.addAction(a)
        view.addSeparator()
        for key in self.chat_page.areas:
            a = QAction(f"Show {PANEL_LABELS[key].lower()} panel", self)
            a.setCheckable(True)
            a.triggered.connect(lambda checked, k=key: self._toggle_panel(k, checked))
            self.addAction(a)
            view.addAction(a)
            a.setData(key)
            self._panel_actions.append(a)
        view.addSeparator()
        scheme_menu = view.addMenu("&Appearance")
        group = QActionGroup(self)
        self.scheme_actions: dict[str, QAction] = {}
        for scheme in SCHEMES:
            a = QAction(scheme.capitalize(), self)
            a.setCheckable(True)
            a.triggered.connect(lambda _checked=False, sc=scheme: self.set_scheme(sc))
            group.addAction(a)
            scheme_menu.addAction(a)
            self.scheme_actions[scheme] = a

    def actions_for_palette(self) -> list[QAction]:
        """The window's commands for a command palette: each QAction has its text and
        shortcut; triggering it does what the menu entry does."""
        return [
            self.new_chat_action,
            self.focus_input_action,
            self.stop_action,
            *self._go_actions,
            *self._panel_actions,
            *self.scheme_actions.values(),
            *self._tools_actions,
        ]

    def add_page(
        self,
        key: str,
        widget: QWidget,
        *,
        label: str | None = None,
        shortcut: str | None = None,
        shutdown: Callable[[], object] | None = None,
        quit_warning: QuitWarning | None = None,
        scroll: bool = True,
    ) -> QAction:
        """A page of the rail (`key`: one of PAGES, or a new one with `label`), in a scroll
        area unless `scroll` is False; View → Go to has it. `shutdown` runs when the window
        shuts down (before the engine thread ends); `quit_warning` says what quitting would
        stop (the user is asked first)."""
        title, icon, tip = PAGES.get(key, (label or key, key, label or key))
        if quit_warning is not None:
            self._quit_warnings.append(quit_warning)
        if shutdown is not None:
            self._closers.append(shutdown)
        holder = scrolled(widget) if scroll else widget
        holder.setObjectName(f"page_{key}")
        self.pages.addWidget(holder)
        self._page_of[key] = holder
        rank = list(PAGES).index(key) if key in PAGES else len(PAGES)
        self.rail.add(key, title, icon, tip, rank)
        a = QAction(title, self)
        number = len(self._go_actions) + 1
        keys = shortcut or (f"Ctrl+{number}" if number <= 9 else "")
        if keys:
            a.setShortcut(QKeySequence(keys))
        a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        a.triggered.connect(lambda _checked=False, k=key: self.show_page(k))
        self.addAction(a)
        self._go_actions.append(a)
        if hasattr(self, "_go_menu"):
            self._go_menu.addAction(a)
        return a

    def page(self, key: str) -> QWidget | None:
        """The widget shown on the page `key` (not its scroll area)."""
        holder = self._page_of.get(key)
        if holder is None:
            return None
        from PySide6.QtWidgets import QScrollArea

        return page_of(holder) if isinstance(holder, QScrollArea) else holder

    def page_keys(self) -> list[str]:
        """The rail's pages, top to bottom."""
        return self.rail.keys()

    def current_page(self) -> str:
        return self.rail.current()

    def show_page(self, key: str) -> None:
        holder = self._page_of.get(key)
        if holder is None:
            return
        self.pages.setCurrentWidget(holder)
        self.rail.set_current(key)
        if key == "chat":
            self.model_bar.refresh_fit()  # the load settings may have changed meanwhile

    def show_page_of(self, widget: QWidget) -> bool:
        """Show the page whose widget is `widget` (False: none is)."""
        for key in self._page_of:
            if self.page(key) is widget:
                self.show_page(key)
                return True
        return False

    def reveal(self, widget: QWidget) -> bool:
        """Bring `widget` into view: its page, or on the Chat page its panel opened (the
        conversations, the chat settings). False: the window does not show it."""
        if self.show_page_of(widget):
            return True
        for key, area in self.chat_page.areas.items():
            if area.isAncestorOf(widget):
                self.show_page("chat")
                if not self.chat_page.shown(key):
                    self.chat_page.set_wish(key, True)
                return True
        return False

    def _toggle_panel(self, key: str, shown: bool) -> None:
        self.show_page("chat")
        self.chat_page.set_wish(key, shown)

    def _sync_panel_actions(self) -> None:
        for a in self._panel_actions:
            a.setChecked(self.chat_page.shown(str(a.data())))

    def set_scheme(self, scheme: str) -> None:
        """The colour scheme ('system', 'light', 'dark'), applied and remembered."""
        scheme = scheme if scheme in SCHEMES else "system"
        apply_scheme(scheme)
        self.settings.setValue(SCHEME_KEY, scheme)
        self.scheme_actions[scheme].setChecked(True)

    def add_side_tab(
        self, title: str, widget: QWidget, shutdown: Callable[[], object] | None = None
    ) -> None:
        """Another view of models (downloads, the hub) as a page of the rail; `shutdown`
        runs when the window shuts down (before the engine thread ends)."""
        key = "downloads" if title.lower().startswith("download") else title.lower()
        self.add_page(key, widget, label=title, shutdown=shutdown)

    def add_tool_window(
        self,
        title: str,
        widget: QWidget,
        shortcut: str,
        shutdown: Callable[[], object] | None = None,
        quit_warning: QuitWarning | None = None,
    ) -> QAction:
        """A view in a window of its own (Loaded models, MCP servers), opened from the Tools
        menu; it is this window's child, so it closes with it. `shutdown` runs at shutdown;
        `quit_warning` says what quitting would stop (the user is asked first)."""
        if quit_warning is not None:
            self._quit_warnings.append(quit_warning)
        widget.setParent(self, Qt.WindowType.Window)
        if self._tools_menu is None:
            self._tools_menu = self.menuBar().addMenu("&Tools")
        a = QAction(title, self)
        a.setShortcut(QKeySequence(shortcut))
        a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)

        def show() -> None:
            widget.show()
            widget.raise_()
            widget.activateWindow()

        a.triggered.connect(show)
        self.addAction(a)
        self._tools_menu.addAction(a)
        self._tools_actions.append(a)
        if shutdown is not None:
            self._closers.append(shutdown)
        return a

    def load_path(self, path: Path) -> None:
        """Load a model file (from another view) with the current load settings."""
        self.refresh_library()
        for row in range(self.library_model.rowCount()):
            if self.library_model.entry(row).path == path:
                self.library_panel.select(self.library_model.entry(row).id)
        self._load(path, self.library_panel.load_params())

    def set_speed_service(self, service: SpeedService | None) -> None:
        """Predicted and measured decode speeds beside the model bar's fit badge; from now
        on each chat reply's decode speed on a local model is recorded."""
        self.speed = service
        self.model_bar.set_speed_source(service.view_for_file if service else None)

    def _record_speed(self, _rid: int, stats: GenerationStats) -> None:
        loaded, service = self.controller.loaded, self.speed
        if service is None or loaded is None or loaded.remote is not None:
            return
        if stats.measured_on != "engine" or stats.draft_tokens:  # drafting: another speed
            return
        try:
            if service.record_measured(Path(loaded.path), stats.gen_tps, stats.n_eval):
                self.model_bar.refresh_speed()
        except OSError as e:  # a read-only data folder: the chat goes on
            self.statusBar().showMessage(f"Could not record the decode speed: {e}", 5000)

    def add_closer(self, close: Callable[[], object]) -> None:
        """Run `close` at shutdown once the engine thread has ended (e.g. close the store)."""
        self._late_closers.append(close)

    def shutdown(self) -> None:
        """End background work: side views first, then the engine thread. Safe to call twice."""
        closers, self._closers = self._closers, []
        for close in closers:
            close()
        self.engine.shutdown()
        self.controller.detach_store()
        late, self._late_closers = self._late_closers, []
        for close in late:
            close()

    # -- actions ---------------------------------------------------------------------------

    def refresh_library(self) -> None:
        selected = self.library_panel.selected_entry()
        keep = (
            selected.id
            if selected
            else str(self.settings.value("library/selected", DEFAULT_MODEL_ID))
        )
        self.library_model.set_entries(self.library.entries())
        if not self.library_panel.select(keep):
            self.library_panel.select(DEFAULT_MODEL_ID)
        self.model_bar.set_selected(self.library_panel.selected_entry())

    def focus_input(self) -> None:
        self.chat_view.input.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def show_error(self, message: str) -> None:
        self.banner.show_message(message)

    def _load(self, path: Path, params: LoadParams) -> None:
        self.controller.load(path, params)  # the library shows it loading once it starts

    def _load_selected(self) -> None:
        """The model bar's Load: as the library's own button, with its checks; where they
        stop it (a draft model that does not suit), the Models page says why."""
        if self.library_panel.load_button.isEnabled():
            self.library_panel.load_button.click()
        else:
            self.show_page("models")

    def choose_model(self, entry_id: str) -> None:
        """The model bar's pick: select it in the library and load it, as chat apps do
        (a model loaded already is kept)."""
        if not self.library_panel.select(entry_id):
            return
        entry = self.library_panel.selected_entry()
        loaded = self.controller.loaded
        if entry is not None and (loaded is None or loaded.path != entry.path):
            self._load_selected()

    def _on_loading_started(self, key: object) -> None:
        if isinstance(key, Path):
            self.library_panel.set_loading(True)
            self.model_bar.set_loading(True)

    def _send(self, text: str) -> None:
        self.banner.hide()
        attached = self.chat_view.attacher.items()
        if self.controller.send(text, attached):
            self.chat_view.attacher.clear()
        elif attached and not self.chat_view.input.toPlainText():
            self.chat_view.input.setPlainText(text)  # not sent: nothing is lost

    def model_name(self, path: Path) -> str | None:
        """The library's name for a model file (None: the file is not listed)."""
        names = self.controller.model_name
        return names(path) if names is not None else None

    def rename_model(self, entry_id: str, name: str) -> bool:
        """Give a library model the user's name ('' = back to the derived one): stored by
        the library, shown at once wherever the app names the model."""
        try:
            self.library.rename(entry_id, name)
        except LibraryError as e:
            self.show_error(f"Could not rename the model: {e}")
            return False
        self.refresh_library()
        self.controller.model_renamed()
        info = self.controller.loaded
        if info is not None and info.remote is None:
            self._on_loaded(info)
        return True

    def _on_loaded(self, info: LoadedModel) -> None:
        # The controller heard it first and named it as the library does.
        loaded = self.controller.loaded
        info = loaded if loaded is not None and loaded.path == info.path else info
        self.perf_panel.on_loaded(info)
        if info.remote is not None:  # the local model was freed for it
            self.library_panel.set_loaded(None)
            self.model_label.setText(f"Remote: {info.name}")
            self.model_bar.set_loaded(None, f"Remote: {info.name}")
            return
        self.library_panel.set_loaded(info)
        self.model_label.setText(f"{info.name} · ctx {info.n_ctx:,}")
        selected = self.library_panel.selected_path()
        self.model_bar.set_loaded(
            info.path,
            f"Loaded · ctx {info.n_ctx:,}" if info.path == selected else f"Loaded: {info.name}",
        )

    def _on_unloaded(self) -> None:
        self.library_panel.set_loaded(None)
        self.perf_panel.on_unloaded()
        self.model_label.setText("No model loaded")
        self.model_bar.set_loaded(None, "")

    def _on_failed(self, _rid: int, _message: str) -> None:
        if self.controller.loaded is None:
            self.library_panel.set_loaded(None)
            self.model_label.setText("No model loaded")
            self.model_bar.set_loaded(None, "")

    # -- conversations ---------------------------------------------------------------------

    def open_connections(self) -> QWidget | None:
        """The remote connections dialog (non-modal); the engine list follows its changes."""
        from app.ui.connections_dialog import ConnectionsDialog

        if self.connections is None:
            return None
        dialog = ConnectionsDialog(self.connections, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        if self.engine_picker is not None:
            dialog.changed.connect(self.engine_picker.refresh)
        dialog.changed.connect(self.controller.connections_changed)
        dialog.open()
        return dialog

    def _on_engine_chosen(self, binding: Binding) -> None:
        self.controller.set_engine(binding)

    def new_chat(self) -> None:
        self.controller.new_chat()
        if self.engine_picker is not None:  # a new chat keeps the engine in use
            self.controller.set_engine(self.engine_picker.binding())
        self.chat_view.show_context_note("")
        self._show_system_prompt()
        if self.chat_settings is not None:
            self.chat_settings.set_settings({})
        if self.conversation_list is not None:
            self.conversation_list.set_current(None)

    def open_conversation(self, conversation_id: int) -> None:
        try:
            self.controller.open_conversation(conversation_id)
        except ChatStoreError as e:
            self.show_error(str(e))
            return
        self.chat_view.show_context_note("")
        self._show_system_prompt()
        if self.chat_settings is not None:
            self.chat_settings.set_settings(self.controller.chat_settings)
        if self.engine_picker is not None:
            self.engine_picker.set_binding(binding_of(self.controller.chat_settings))
        if self.conversation_list is not None:
            self.conversation_list.set_current(conversation_id)
        self._remember_conversation()

    def _show_system_prompt(self) -> None:
        self.chat_view.set_system_prompt(
            str(self.controller.chat_settings.get("system_prompt") or "")
        )

    def _on_conversations_changed(self) -> None:
        self._remember_conversation()
        if self.conversation_list is not None:
            self.conversation_list.set_current(self.controller.conversation_id)
            self.conversation_list.refresh()

    def _on_conversation_deleted(self, conversation_id: int) -> None:
        if self.controller.conversation_id == conversation_id:
            self.new_chat()

    def _message_action(self, name: str, row: int) -> None:
        c = self.controller
        if name in ("prev", "next"):
            c.switch_branch(row, -1 if name == "prev" else 1)
        elif name == "regenerate":
            c.regenerate(row)
        elif name == "continue":
            c.continue_reply(row)
        elif name == "delete":
            c.delete_message(row)
        self._on_conversations_changed()

    def _edit(self, row: int, text: str) -> None:
        self.controller.edit(row, text)

    def export_chats(self, path: Path, fmt: str) -> None:
        """All conversations to `path` as JSON (lossless) or Markdown (readable)."""
        if self.store is None:
            return
        try:
            n = write_export(self.store, Path(path), fmt)  # atomic: no half-written file
        except OSError as e:
            self.show_error(f"Could not export to {path}: {e.strerror or e}")
            return
        self.statusBar().showMessage(f"Exported {n} chats to {path}", 5000)

    def import_chats(self, path: Path) -> list[int]:
        if self.store is None:
            return []
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            ids = import_data(self.store, data)
        except (OSError, UnicodeDecodeError) as e:
            self.show_error(f"Could not read {path}: {e}")
            return []
        except json.JSONDecodeError as e:
            self.show_error(f"{Path(path).name} is not JSON ({e.msg}, line {e.lineno})")
            return []
        except ChatStoreError as e:
            self.show_error(f"Could not import {Path(path).name}: {e}")
            return []
        self._on_conversations_changed()
        self.statusBar().showMessage(f"Imported {len(ids)} chats", 5000)
        return ids

    def _ask_export(self, fmt: str) -> None:
        name = "candlewick-chats." + ("md" if fmt == "md" else "json")
        path, _ = QFileDialog.getSaveFileName(self, "Export chats", name)
        if path:
            self.export_chats(Path(path), fmt)

    def _ask_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import chats", "", "JSON (*.json)")
        if path:
            self.import_chats(Path(path))

    # -- persistence -----------------------------------------------------------------------

    def restore_state(self) -> None:
        geo = self.settings.value("window/geometry")
        if isinstance(geo, QByteArray) and not geo.isEmpty():
            self.restoreGeometry(geo)
        else:
            self.resize(1360, 860)
        self.chat_page.set_state(str(self.settings.value(CHAT_PANELS, "")))
        self._sync_panel_actions()
        scheme = str(self.settings.value(SCHEME_KEY, "system"))
        if scheme in ("light", "dark"):
            self.set_scheme(scheme)  # "system": the palette Qt was given, untouched
        else:
            self.scheme_actions["system"].setChecked(True)

    def save_state(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue(CHAT_PANELS, self.chat_page.state())
        entry = self.library_panel.selected_entry()
        if entry is not None:
            self.settings.setValue("library/selected", entry.id)
        self._remember_conversation()
        self.settings.sync()

    def _remember_conversation(self) -> None:
        """Keep the conversation on screen for the next start (not an empty new chat)."""
        if self.controller.conversation_id is not None:
            self.settings.setValue(LAST_CONVERSATION, self.controller.conversation_id)

    def reopen_last_conversation(self) -> bool:
        """Open the conversation that was on screen when the app last closed, if it is still
        in the store (a new chat left empty does not replace it)."""
        store = self.controller.store
        try:
            last = int(str(self.settings.value(LAST_CONVERSATION, "")))
        except ValueError:
            return False
        if store is None or last not in {c.id for c in store.conversations()}:
            return False
        self.open_conversation(last)
        return self.controller.conversation_id == last

    def closeEvent(self, e: QCloseEvent) -> None:
        if not may_quit(self, self._quit_warnings, self.ask_quit):
            e.ignore()
            return
        self.save_state()
        self.controller.stop()
        super().closeEvent(e)
