"""The Server panel: serve the chat's model over the OpenAI/Ollama-compatible HTTP API.

Start serves the model the chat has loaded (`app.services.local_server`): on a background
thread, it gives the model's context the server's slots beside the chat's; nothing here blocks
the GUI thread on the model or the network. While the server runs (and the panel is visible) a
timer polls its state twice a second: slots, queue, KV cache use and new request-log rows.
Security is `candlewick serve`'s: 127.0.0.1 by default, no network bind without a key, and
the key is shown masked, kept in the system keyring and never written to the log.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QPersistentModelIndex,
    QSettings,
    QSize,
    Qt,
    QTimer,
    Signal,
    Slot,
)
from PySide6.QtGui import QColor, QGuiApplication, QHideEvent, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.services.local_server import (
    KEY_ACCOUNT,
    LOG_ROWS,
    LocalServer,
    ServeSettings,
    check_port_free,
    new_api_key,
)
from app.services.model_catalog import CHAT_OWNER
from app.services.secrets import SecretStore
from app.ui.background import Background
from app.ui.estimate import Estimator
from app.ui.library_model import human_bytes
from app.ui.loaded_models import unloads_in
from app.ui.worker import LoadedModel
from engine.errors import EngineError, LoadCancelled
from engine.host.host import ModelHost
from engine.host.host_entry import HostedModel
from engine.model.naming import model_slug
from engine.server import ServerError, is_loopback
from engine.server.model_store import ModelStore
from engine.server.request_log import RequestRecord
from engine.settings import LoadParams

POLL_MS = 500
KEEP_SERVING = "server/keep_serving"  # closing the window hides it while the server runs
DEFAULT_SIZE = QSize(960, 680)  # as a window: the settings and ~15 rows of the request log
NO_MODEL_TIP = "Load a model in the library first: the server serves the chat's model"
REMOTE_TIP = "The chat uses a remote server: this panel serves models loaded on this computer"
MEMORY_NOTE = (
    "The server answers from the model the chat has loaded: nothing is loaded again, and "
    "its weights (and any layers on a GPU) are shared. Starting it gives the model's context "
    "one sequence per slot plus the chat's own, which the chat keeps to itself; stopping it "
    "gives the memory back. Chat and API requests are decoded together."
)
HOSTS = (
    ("127.0.0.1", "127.0.0.1 — this computer only"),
    ("0.0.0.0", "0.0.0.0 — all network interfaces (needs a key)"),
)
Ctx = QModelIndex | QPersistentModelIndex


class RequestLogModel(QAbstractTableModel):
    """The last `max_rows` answered requests, oldest first. Holds no headers: no key."""

    COLUMNS = ("Time", "Client", "Method", "Path", "Status", "Tokens in/out", "Latency")

    def __init__(self, max_rows: int = LOG_ROWS, parent: Any = None) -> None:
        super().__init__(parent)
        self.max_rows = max_rows
        self._rows: list[RequestRecord] = []

    def add(self, records: Sequence[RequestRecord]) -> None:
        records = list(records)[-self.max_rows :]
        if not records:
            return
        drop = len(self._rows) + len(records) - self.max_rows
        if drop > 0:
            self.beginRemoveRows(QModelIndex(), 0, drop - 1)
            del self._rows[:drop]
            self.endRemoveRows()
        first = len(self._rows)
        self.beginInsertRows(QModelIndex(), first, first + len(records) - 1)
        self._rows.extend(records)
        self.endInsertRows()

    def clear(self) -> None:
        self.beginResetModel()
        self._rows.clear()
        self.endResetModel()

    def record(self, row: int) -> RequestRecord:
        return self._rows[row]

    def rowCount(self, parent: Ctx = QModelIndex()) -> int:  # noqa: B008 (Qt's signature)
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: Ctx = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if (
            role == Qt.ItemDataRole.DisplayRole
            and orientation == Qt.Orientation.Horizontal
            and 0 <= section < len(self.COLUMNS)
        ):
            return self.COLUMNS[section]
        return None

    def data(self, index: Ctx, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        r, col = self._rows[index.row()], index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return _cell(r, col)
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (4, 5, 6):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ForegroundRole and col == 4 and r.status >= 400:
            return QColor("#c62828")
        return None


def _cell(r: RequestRecord, col: int) -> str:
    if col == 0:
        return time.strftime("%H:%M:%S", time.localtime(r.at))
    if col == 1:
        return r.client
    if col == 2:
        return r.method
    if col == 3:
        return r.path
    if col == 4:
        return str(r.status)
    if col == 5:
        if r.completion_tokens is None:
            return "—"
        return f"{r.prompt_tokens or 0} / {r.completion_tokens}"
    return f"{r.latency_s * 1000:.0f} ms" if r.latency_s < 10 else f"{r.latency_s:.1f} s"


def curl_example(url: str, model_id: str, with_key: bool) -> str:
    """A command that works as shown once CANDLEWICK_API_KEY holds the key (never the key
    itself, so the line can be shown and copied freely)."""
    auth = ' -H "Authorization: Bearer $CANDLEWICK_API_KEY"' if with_key else ""
    body = json.dumps({"model": model_id, "messages": [{"role": "user", "content": "Hello!"}]})
    return f"curl {url}/v1/chat/completions{auth} -H \"Content-Type: application/json\" -d '{body}'"


def models_line(hosted: Sequence[HostedModel]) -> str:
    """The models in the host, as the server sees them: "smollm2 (chat), gemma (loading)"."""
    if not hosted:
        return "none loaded · requests load library models on demand"
    parts = []
    for h in hosted:
        if h.state != "ready":
            parts.append(f"{h.name} (loading)")
        elif h.owner == CHAT_OWNER:
            parts.append(f"{h.name} (chat)")
        elif h.in_flight:
            parts.append(f"{h.name} ({h.in_flight} in flight)")
        elif h.pinned:
            parts.append(f"{h.name} (pinned)")
        elif h.expires_in_s is not None:
            parts.append(f"{h.name} (idle, unloads in {unloads_in(h)})")
        else:
            parts.append(h.name)
    return ", ".join(parts)


def model_line(name: str, model_id: str) -> str:
    """The model the server serves: its name for people, and the id API clients send."""
    return f"Model: {name} · API model id: {model_id}"


class ServerPanel(QWidget):
    """`running_changed(bool)`: the server started (True) or stopped (False)."""

    running_changed = Signal(bool)

    def __init__(
        self,
        loaded: Callable[[], LoadedModel | None],
        secrets: SecretStore | None = None,
        estimator: Estimator | None = None,
        settings: QSettings | None = None,
        model_host: ModelHost | None = None,
        parent: QWidget | None = None,
        model_store: ModelStore | None = None,
    ) -> None:
        """`settings`: where host, port, slots and context are remembered (not the key);
        `model_host`: where the chat's loaded model is found (the engine thread's);
        `model_store`: the library's pulls, copies and created models (Ollama's)."""
        super().__init__(parent)
        self._store = settings
        self.setWindowTitle("Local server")
        self._loaded_fn = loaded
        self.secrets = secrets or SecretStore()
        self.estimator = estimator
        self.model_host = model_host or ModelHost()
        self.model_store = model_store
        self.server: LocalServer | None = None  # starting, running or stopping
        self._serving_name = ""  # the name of the model it serves, for people
        self._note_shown = ""  # the server's last note, once shown in the status line
        self.phase = "stopped"  # stopped | starting | running | stopping
        self._cancel: threading.Event | None = None  # set to cancel the load in progress
        self._bg = Background(self)
        self.log_model = RequestLogModel(parent=self)
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self.poll)
        self._build()
        self._key_read = False  # the keyring is asked once the panel is first shown
        self._restore()
        self.refresh_model()

    # -- layout ----------------------------------------------------------------------------

    def _build(self) -> None:
        self.model_label = QLabel()
        self.model_label.setWordWrap(True)
        self.host = QComboBox()
        self.host.setEditable(True)
        self.host.setAccessibleName("Host")
        for value, label in HOSTS:
            self.host.addItem(label, value)
        self.host.setToolTip(
            "127.0.0.1: only programs on this computer can connect. "
            "0.0.0.0: other devices on the network can, with the key."
        )
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(8080)
        self.port.setAccessibleName("Port")
        self.parallel = QSpinBox()
        self.parallel.setRange(1, 64)
        self.parallel.setValue(4)
        self.parallel.setAccessibleName("Parallel slots")
        self.parallel.setToolTip("Requests decoded together; more wait in a queue")
        self.ctx = QSpinBox()
        self.ctx.setRange(256, 262144)
        self.ctx.setSingleStep(256)
        self.ctx.setValue(4096)
        self.ctx.setSuffix(" tokens")
        self.ctx.setAccessibleName("Context per slot")
        self.require_key = QCheckBox("Require an API key")
        self.require_key.setChecked(True)
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setAccessibleName("API key")
        self.show_key = QPushButton("Show")
        self.show_key.setCheckable(True)
        self.show_key.toggled.connect(self._toggle_key)
        self.copy_key = QPushButton("Copy key")
        self.copy_key.clicked.connect(lambda: self._copy(self.key_edit.text()))
        self.new_key = QPushButton("New key")
        self.new_key.setToolTip("Replace the key with a new random one")
        self.new_key.clicked.connect(lambda: self.key_edit.setText(new_api_key()))
        self.require_key.toggled.connect(self._sync_controls)
        # Enough of the key to see it (shown) beside its three buttons, in a narrow window.
        self.key_edit.setMinimumWidth(self.key_edit.fontMetrics().horizontalAdvance("x" * 16))
        key_row = QHBoxLayout()
        key_row.addWidget(self.key_edit, 1)
        for b in (self.show_key, self.copy_key, self.new_key):
            key_row.addWidget(b)

        form = QFormLayout()
        form.addRow("Host", self.host)
        form.addRow("Port", self.port)
        form.addRow("Parallel slots", self.parallel)
        form.addRow("Context per slot", self.ctx)
        form.addRow(self.require_key)
        form.addRow("Key", key_row)
        self.keep_serving = QCheckBox("Keep serving when the window is closed")
        self.keep_serving.setToolTip(
            "Closing the window hides it to the system tray while the server runs; "
            "the tray icon's menu shows it again or quits"
        )
        form.addRow(self.keep_serving)
        self.memory = QLabel()
        self.memory.setWordWrap(True)
        self.memory.setAccessibleName("Memory")
        settings = QGroupBox("Settings")
        sl = QVBoxLayout(settings)
        sl.addLayout(form)
        sl.addWidget(self.memory)

        self.start_button = QPushButton("Start server")
        self.start_button.clicked.connect(self.toggle)
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)  # busy: recreating the context takes a moment
        self.progress.hide()
        self.status = QLabel("Stopped")
        self.status.setWordWrap(True)
        self.status.setAccessibleName("Server status")
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        run_row = QHBoxLayout()
        run_row.addWidget(self.start_button)
        run_row.addWidget(self.progress, 1)

        self.url = QLineEdit()
        self.url.setReadOnly(True)
        # Most of the URL in view when it sits beside the settings.
        self.url.setMinimumWidth(self.url.fontMetrics().horizontalAdvance("http://127.0.0.1:8080"))
        self.url.setAccessibleName("Server URL")
        self.copy_url = QPushButton("Copy URL")
        self.copy_url.clicked.connect(lambda: self._copy(self.url.text()))
        url_row = QHBoxLayout()
        url_row.addWidget(self.url, 1)
        url_row.addWidget(self.copy_url)
        self.curl = QLineEdit()
        self.curl.setReadOnly(True)
        self.curl.setAccessibleName("Example request")
        self.copy_curl = QPushButton("Copy")
        self.copy_curl.clicked.connect(lambda: self._copy(self.curl.text()))
        curl_row = QHBoxLayout()
        curl_row.addWidget(self.curl, 1)
        curl_row.addWidget(self.copy_curl)
        self.slots = QLabel("—")
        self.slots.setAccessibleName("Slots")
        self.kv = QProgressBar()
        self.kv.setRange(0, 1000)
        self.kv.setFormat("KV cache —")
        self.kv.setAccessibleName("KV cache use")
        self.models = QLabel("—")
        self.models.setWordWrap(True)
        self.models.setAccessibleName("Loaded models")
        self.models.setToolTip(
            "Every model the server can answer from now. Requests naming "
            "another library model load it on demand (Tools → Loaded "
            "models… to pin or eject one)."
        )
        live = QGroupBox("Server")
        ll = QFormLayout(live)
        ll.addRow("URL", url_row)
        ll.addRow("Example", curl_row)
        ll.addRow("Models", self.models)
        ll.addRow("Slots", self.slots)
        ll.addRow("KV cache", self.kv)

        self.log_view = QTableView()
        self.log_view.setModel(self.log_model)
        self.log_view.setAccessibleName("Request log")
        self.log_view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        rows = self.log_view.verticalHeader()
        rows.hide()
        rows.setMinimumSectionSize(1)
        rows.setDefaultSectionSize(self.log_view.fontMetrics().height() + 8)  # one line each
        # Every column as wide as its text, the path takes the rest (elided): Status and
        # the figures stay in view in a narrow window.
        header = self.log_view.horizontalHeader()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        self.log_view.setWordWrap(False)
        self.log_view.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        log_box = QGroupBox(f"Requests (last {LOG_ROWS})")
        QVBoxLayout(log_box).addWidget(self.log_view)

        # The settings beside the running server's figures: stacked, they left the request
        # log (which gets the rest of the height) two rows in a 700 px high window.
        running = QVBoxLayout()
        running.addLayout(run_row)
        running.addWidget(self.status)
        running.addWidget(live)
        running.addStretch(1)
        top = QHBoxLayout()
        top.addWidget(settings, 3)
        top.addLayout(running, 2)
        lay = QVBoxLayout(self)
        lay.addWidget(self.model_label)
        lay.addLayout(top)
        lay.addWidget(log_box, 1)
        for w in (self.parallel, self.ctx):
            w.valueChanged.connect(self._update_memory)

    def _restore(self) -> None:
        st = self._store
        if st is None:
            return
        host = str(st.value("server/host", "127.0.0.1"))
        i = self.host.findData(host)
        if i >= 0:
            self.host.setCurrentIndex(i)
        else:
            self.host.setEditText(host)
        for key, box in (("port", self.port), ("parallel", self.parallel), ("ctx", self.ctx)):
            with contextlib.suppress(ValueError):  # a hand-edited file: keep the default
                box.setValue(int(str(st.value(f"server/{key}", box.value()))))
        self.require_key.setChecked(str(st.value("server/require_key", "true")) == "true")
        self.keep_serving.setChecked(str(st.value(KEEP_SERVING, "false")) == "true")
        self.keep_serving.toggled.connect(self._save_keep_serving)

    def _save_keep_serving(self, on: bool) -> None:
        """Saved at once: it decides what closing the window does, running or not."""
        if self._store is not None:
            self._store.setValue(KEEP_SERVING, "true" if on else "false")
            self._store.sync()

    def _save(self, s: ServeSettings) -> None:
        st = self._store
        if st is None:
            return
        for key, value in (
            ("host", s.host),
            ("port", s.port),
            ("parallel", s.parallel),
            ("ctx", s.ctx_per_slot),
            ("require_key", "true" if s.api_key else "false"),
        ):
            st.setValue(f"server/{key}", value)
        st.sync()

    # -- state -----------------------------------------------------------------------------

    @property
    def loaded(self) -> LoadedModel | None:
        info = self._loaded_fn()
        return info if info is not None and info.remote is None else None

    def _start_problem(self) -> str | None:
        info = self._loaded_fn()
        if info is not None and info.remote is not None:
            return REMOTE_TIP
        return NO_MODEL_TIP if info is None else None

    @Slot()
    def refresh_model(self) -> None:
        """The chat's model changed (loaded, ejected): what Start would serve."""
        server = self.server
        if self.phase == "running" and server is not None and server.stopped_because:
            self._on_stopped(None, None)  # unloading the model stopped the server
            self._set_status(f"Stopped: {server.stopped_because}")
            return
        info = self.loaded
        if self.phase == "stopped":
            self.model_label.setText(
                model_line(info.name, self.settings().model_id) if info else "No model loaded"
            )
        elif self.server is not None:
            # The chat switched, ejected or renamed its model: the server goes on.
            self._serving_name = info.name if info is not None else ""
            if self.phase == "running":
                self._show_serving(self.server)
                self._show_models(self.server)
        self._sync_controls()
        self._update_memory()

    def _sync_controls(self) -> None:
        stopped = self.phase == "stopped"
        problem = self._start_problem() if stopped else None
        self.start_button.setText(
            "Start server" if stopped else "Cancel" if self.phase == "starting" else "Stop server"
        )
        self.start_button.setEnabled(problem is None and self.phase != "stopping")
        self.start_button.setToolTip(problem or "")
        for w in (self.host, self.port, self.parallel, self.ctx, self.require_key, self.new_key):
            w.setEnabled(stopped)
        self.key_edit.setReadOnly(not stopped)
        self.key_edit.setEnabled(self.require_key.isChecked())

    def settings(self) -> ServeSettings:
        info = self.loaded
        text = self.host.currentText().strip()
        i = self.host.findText(text)  # a listed choice, or an address typed in
        host = self.host.itemData(i) if i >= 0 else text
        return ServeSettings(
            host=str(host),
            port=self.port.value(),
            api_key=self.key_edit.text().strip() if self.require_key.isChecked() else None,
            parallel=self.parallel.value(),
            ctx_per_slot=self.ctx.value(),
            model_id=(info.model_id or model_slug(info.name)) if info else "default",
        )

    def _update_memory(self) -> None:
        info = self.loaded
        text = MEMORY_NOTE
        if info is not None and self.estimator is not None:
            base = info.params or LoadParams()
            try:
                grown = self.estimator(info.path, self.settings().load_params(base))
                chat = self.estimator(info.path, base)
            except (OSError, ValueError, EngineError) as e:
                text += f" (No estimate: {e})"
            else:
                kv = max(grown.kv - chat.kv, 0)
                compute = max(grown.compute + grown.output - chat.compute - chat.output, 0)
                text = (
                    f"Extra memory for the server: about {human_bytes(kv + compute)} "
                    f"(KV cache {human_bytes(kv)}, compute {human_bytes(compute)}); the "
                    f"weights ({human_bytes(chat.weights)}) are shared. " + MEMORY_NOTE
                )
        self.memory.setText(text)

    # -- start / stop ----------------------------------------------------------------------

    @Slot()
    def toggle(self) -> None:
        if self.phase == "stopped":
            self.start()
        else:
            self.stop()

    def start(self) -> bool:
        """Start serving the chat's model; False (with a one-line message) when it cannot."""
        info = self.loaded
        if self.phase != "stopped" or info is None:
            return False
        self.ensure_key()
        settings = self.settings()
        try:
            server = LocalServer(
                self.model_host,
                info.host_key,
                settings,
                title=info.name,
                store=self.model_store,
            )
            check_port_free(settings.host, settings.port)
        except (ServerError, EngineError) as e:
            self._set_status(f"Cannot start: {e}", error=True)
            return False
        self._save(settings)
        self._serving_name = info.name
        if settings.api_key:
            saved = self.secrets.set(KEY_ACCOUNT, settings.api_key)
            self.key_edit.setToolTip(f"The key is {saved.message}")
        cancel = self._cancel = threading.Event()
        self.server = server
        self.log_model.clear()
        self._set_phase("starting")
        self._set_status(f"Making room for {settings.parallel} requests beside the chat…")
        self.progress.show()

        def work() -> None:
            server.start()
            if cancel.is_set():  # Cancel pressed after the last progress step
                server.stop()
                raise LoadCancelled("cancelled")

        self._bg.run(work, self._on_started, name="candlewick-server-load")
        return True

    def stop(self) -> None:
        """Cancel the load, or stop the running server (off the GUI thread)."""
        if self.phase == "starting" and self._cancel is not None:
            self._cancel.set()
            self._set_status("Cancelling…")
            return
        server = self.server
        if self.phase != "running" or server is None:
            return
        self._set_phase("stopping")
        self._set_status("Stopping…")
        self._bg.run(server.stop, self._on_stopped, name="candlewick-server-stop")

    def _on_started(self, _result: object, error: BaseException | None) -> None:
        self.progress.hide()
        server = self.server
        if error is None and server is not None and server.stopped_because:
            error = EngineError(server.stopped_because)  # unloaded as it started
        if error is not None or server is None:
            self.server = None
            self._set_phase("stopped")
            if isinstance(error, LoadCancelled):
                self._set_status("Stopped (cancelled while loading)")
            else:
                self._set_status(f"Could not start: {_one_line(error)}", error=True)
            self.running_changed.emit(False)
            return
        self._set_phase("running")
        key = server.settings.api_key
        where = server.state.config.host
        note = (
            ""
            if is_loopback(where)
            else f" (listening on {where}: other devices can connect with the key)"
        )
        self._set_status(
            f"Serving {self._serving_name} at {server.url}{note}"
            + ("; key required" if key else "; no key required")
        )
        self.url.setText(server.url)
        self.curl.setText(curl_example(server.url, server.settings.model_id, bool(key)))
        self.curl.setCursorPosition(0)
        self._show_serving(server)
        self._update_timer()
        self.poll()
        self.running_changed.emit(True)

    def _show_serving(self, server: LocalServer) -> None:
        info = self.loaded
        if info is None or not self._serving_name:
            self.model_label.setText(
                "The chat has no model loaded · requests name a library model, loaded on demand"
            )
        else:
            model_id = info.model_id or server.settings.model_id
            self.model_label.setText(
                f"{model_line(self._serving_name, model_id)} · "
                f"{server.settings.parallel} slots of {server.settings.ctx_per_slot:,} tokens"
            )
        if self.curl.text() and info is not None and info.model_id:
            self.curl.setText(
                curl_example(server.url, info.model_id, bool(server.settings.api_key))
            )
            self.curl.setCursorPosition(0)

    def _show_models(self, server: LocalServer) -> None:
        """The models the server answers from now, and what changed (the chat's went)."""
        self.models.setText(models_line(self.model_host.hosted()))
        note = server.note
        if note and note != self._note_shown:
            self._note_shown = note
            self._set_status(note)

    def _on_stopped(self, _result: object, error: BaseException | None) -> None:
        self.server = None
        self._set_phase("stopped")
        self._timer.stop()
        self.url.clear()
        self.curl.clear()
        self.slots.setText("—")
        self.kv.setValue(0)
        self.kv.setFormat("KV cache —")
        self._set_status(
            "Stopped" if error is None else f"Stopped: {_one_line(error)}", error=error is not None
        )
        self.refresh_model()
        self.running_changed.emit(False)

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        self._sync_controls()
        self._update_timer()

    def _set_status(self, text: str, *, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setStyleSheet("color: #c62828;" if error else "")

    # -- live view -------------------------------------------------------------------------

    def _update_timer(self) -> None:
        if self.phase == "running" and self.isVisible():
            if not self._timer.isActive():
                self._timer.start()
        else:
            self._timer.stop()

    @Slot()
    def poll(self) -> None:
        """Slots, queue and KV use from the scheduler; new rows from the request log."""
        server = self.server
        if server is None:
            return
        if server.stopped_because:
            self.refresh_model()
            return
        self.log_model.add(server.request_log.drain())
        if self.log_model.rowCount():
            self.log_view.scrollToBottom()
        self._show_models(server)
        snap = server.snapshot()
        if snap is None:
            self.slots.setText(f"— · {server.request_log.total} requests served")
            self.kv.setValue(0)
            self.kv.setFormat("KV cache —")
            return
        self.slots.setText(
            f"{snap.busy_slots} of {snap.n_slots} busy · {snap.queue_depth} "
            f"waiting · {server.request_log.total} requests served"
        )
        ratio = snap.kv_used / snap.kv_capacity if snap.kv_capacity else 0.0
        self.kv.setValue(int(ratio * 1000))
        self.kv.setFormat(f"{snap.kv_used:,} of {snap.kv_capacity:,} cells ({ratio:.1%})")

    def ensure_key(self) -> None:
        """The saved key, or a new random one the first time."""
        if not self._key_read:
            self._key_read = True
            if not self.key_edit.text():
                self.key_edit.setText(self.secrets.get(KEY_ACCOUNT) or new_api_key())

    def showEvent(self, e: QShowEvent) -> None:
        if self.isWindow() and not self.testAttribute(Qt.WidgetAttribute.WA_Resized):
            # Shown for the first time, at no size of its own: room for the request log.
            screen = self.screen().availableGeometry()
            self.resize(
                self.sizeHint()
                .expandedTo(DEFAULT_SIZE)
                .boundedTo(QSize(screen.width() * 9 // 10, screen.height() * 9 // 10))
            )
        super().showEvent(e)
        self.ensure_key()
        self._update_timer()
        if self.phase == "running":
            self.poll()

    def hideEvent(self, e: QHideEvent) -> None:
        super().hideEvent(e)
        self._update_timer()

    # -- helpers ---------------------------------------------------------------------------

    def _toggle_key(self, shown: bool) -> None:
        self.key_edit.setEchoMode(
            QLineEdit.EchoMode.Normal if shown else QLineEdit.EchoMode.Password
        )
        self.show_key.setText("Hide" if shown else "Show")

    @staticmethod
    def _copy(text: str) -> None:
        clipboard = QGuiApplication.clipboard()
        if text and clipboard is not None:
            clipboard.setText(text)

    def quit_warning(self) -> str:
        """What quitting the app would stop now ('' = nothing)."""
        server = self.server
        if self.phase == "running" and server is not None:
            return (
                f"The Local server is serving {self._serving_name} at {server.url}. "
                "Quitting stops it, and programs using it lose their connection."
            )
        if self.phase == "starting":
            return "The Local server is starting. Quitting stops it."
        return ""

    def shutdown(self) -> None:
        """Stop the server and join its threads (the app is quitting). Safe to call twice."""
        self._timer.stop()
        if self._cancel is not None:
            self._cancel.set()
        server = self.server
        self._bg.wait(60)
        if server is not None:
            server.stop()
        self.server = None
        self.phase = "stopped"


def _one_line(error: BaseException | None) -> str:
    return " ".join(str(error).split()) or type(error).__name__
