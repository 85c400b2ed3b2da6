"""Remote connections: add, edit, remove and test the servers the chat can use.

Fields: name, base URL, API (openai | ollama), default model, API key (masked; saved in the
system keyring by the connection store, never in a file), TLS verification (on by default),
an optional CA file, and the two timeouts. "Test" checks the settings as they are in the form,
saved or not, off the GUI thread: the round trip and the models the server lists, or the one
line that says what went wrong. The models list fills the default model field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.services.connections import Connection, ConnectionsError, ConnectionStore
from app.ui.background import Background
from engine.errors import EngineError
from engine.remote.engines import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    CheckResult,
    RemoteEndpoint,
    RemoteEngine,
)
from engine.remote.streaming import APIS

OK_COLOR = "#2e7d32"
ERROR_COLOR = "#c62828"


class ConnectionsDialog(QDialog):
    changed = Signal()  # a connection was saved or removed
    tested = Signal(bool, str)  # a test ended: ok, the line shown

    def __init__(self, store: ConnectionStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Remote connections")
        self.store = store
        self.background = Background(self)
        self._editing: str | None = None  # the saved name being edited; None: a new one

        self.list = QListWidget()
        self.list.setAccessibleName("Connections")
        self.list.currentItemChanged.connect(self._on_selected)
        self.add_button = QPushButton("Add")
        self.add_button.setAccessibleName("Add a connection")
        self.add_button.clicked.connect(self.new_connection)
        self.remove_button = QPushButton("Remove")
        self.remove_button.setAccessibleName("Remove the connection")
        self.remove_button.clicked.connect(self.remove_current)

        self.name = self._line("Name", "e.g. Office GPU box")
        self.base_url = self._line("Base URL", "e.g. http://192.168.1.20:8080")
        self.api = QComboBox()
        self.api.setAccessibleName("API")
        for api in APIS:
            self.api.addItem(
                {"openai": "OpenAI-compatible (/v1)", "ollama": "Ollama (/api)"}.get(api, api), api
            )
        self.model = QComboBox()
        self.model.setEditable(True)
        self.model.setAccessibleName("Default model")
        self.model.setToolTip("Empty: the first model the server lists")
        self.api_key = self._line("API key", "none")
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.verify_tls = QCheckBox("Verify the server's TLS certificate")
        self.verify_tls.setAccessibleName("Verify TLS")
        self.verify_tls.setChecked(True)
        self.ca_file = self._line("CA file", "optional: a PEM file for a private CA")
        self.connect_timeout = self._seconds(DEFAULT_CONNECT_TIMEOUT_S, "Connect timeout")
        self.timeout = self._seconds(DEFAULT_TIMEOUT_S, "Timeout")
        self.timeout.setToolTip(
            "The longest the server may stay silent (before the first token and between tokens)"
        )

        self.save_button = QPushButton("Save")
        self.save_button.setAccessibleName("Save the connection")
        self.save_button.clicked.connect(self.save)
        self.test_button = QPushButton("Test")
        self.test_button.setAccessibleName("Test the connection")
        self.test_button.clicked.connect(self.test)
        self.status = QLabel()
        self.status.setAccessibleName("Connection status")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.models = QListWidget()
        self.models.setAccessibleName("Models on the server")
        self.models.setMaximumHeight(120)
        self.models.currentTextChanged.connect(
            lambda text: self.model.setCurrentText(text) if text else None
        )

        left = QVBoxLayout()
        left.addWidget(self.list, 1)
        row = QHBoxLayout()
        row.addWidget(self.add_button)
        row.addWidget(self.remove_button)
        left.addLayout(row)
        form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow("Base URL", self.base_url)
        form.addRow("API", self.api)
        form.addRow("Default model", self.model)
        form.addRow("API key", self.api_key)
        form.addRow("", self.verify_tls)
        form.addRow("CA file", self.ca_file)
        form.addRow("Connect timeout", self.connect_timeout)
        form.addRow("Timeout", self.timeout)
        actions = QHBoxLayout()
        actions.addWidget(self.test_button)
        actions.addStretch(1)
        actions.addWidget(self.save_button)
        right = QVBoxLayout()
        right.addLayout(form)
        right.addLayout(actions)
        right.addWidget(self.status)
        right.addWidget(QLabel("Models on the server"))
        right.addWidget(self.models)
        body = QHBoxLayout()
        body.addLayout(left, 1)
        body.addLayout(right, 2)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addLayout(body, 1)
        lay.addWidget(close)
        self.resize(760, 460)
        self.refresh()
        if self.list.count():
            self.list.setCurrentRow(0)
        else:
            self.new_connection()

    def _line(self, name: str, placeholder: str) -> QLineEdit:
        w = QLineEdit()
        w.setAccessibleName(name)
        w.setPlaceholderText(placeholder)
        return w

    def _seconds(self, value: float, name: str) -> QDoubleSpinBox:
        w = QDoubleSpinBox()
        w.setRange(0.5, 86400.0)
        w.setDecimals(1)
        w.setSuffix(" s")
        w.setValue(value)
        w.setAccessibleName(name)
        return w

    # -- the list ----------------------------------------------------------------------------

    def refresh(self, select: str | None = None) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        try:
            names = self.store.names()
        except ConnectionsError as e:
            names = []
            self.show_status(False, str(e))
        for name in names:
            self.list.addItem(QListWidgetItem(name))
        if select is not None:
            # Selected without reloading the form: it shows this connection already.
            found = self.list.findItems(select, Qt.MatchFlag.MatchExactly)
            if found:
                self.list.setCurrentItem(found[0])
        self.list.blockSignals(False)
        self.remove_button.setEnabled(self._editing is not None)

    def names(self) -> list[str]:
        return [self.list.item(i).text() for i in range(self.list.count())]

    def _on_selected(self, item: QListWidgetItem | None, _prev: object = None) -> None:
        if item is None:
            return
        try:
            conn = self.store.get(item.text())
            has_key = self.store.has_key(conn.name)
        except ConnectionsError as e:
            self.show_status(False, str(e))
            return
        self.show_connection(conn, has_key)

    def show_connection(self, conn: Connection, has_key: bool) -> None:
        self._editing = conn.name
        self.name.setText(conn.name)
        self.base_url.setText(conn.base_url)
        self.api.setCurrentIndex(max(self.api.findData(conn.api), 0))
        self.model.clear()
        self.model.setCurrentText(conn.model)
        self.api_key.clear()
        self.api_key.setPlaceholderText("saved (leave empty to keep it)" if has_key else "none")
        self.verify_tls.setChecked(conn.verify_tls)
        self.ca_file.setText(conn.ca_file or "")
        self.connect_timeout.setValue(conn.connect_timeout_s)
        self.timeout.setValue(conn.timeout_s)
        self.models.clear()
        self.status.clear()
        self.remove_button.setEnabled(True)

    def new_connection(self) -> None:
        """An empty form for a new connection."""
        self._editing = None
        self.list.blockSignals(True)
        self.list.setCurrentRow(-1)
        self.list.clearSelection()
        self.list.blockSignals(False)
        self.show_connection(Connection(name="", base_url=""), has_key=False)
        self._editing = None
        self.remove_button.setEnabled(False)
        self.name.setFocus()

    # -- the form ----------------------------------------------------------------------------

    def form_connection(self) -> Connection:
        """The connection as the form has it (not validated)."""
        api: Any = self.api.currentData()
        return Connection(
            name=self.name.text().strip(),
            base_url=self.base_url.text().strip(),
            api=api,
            model=self.model.currentText().strip(),
            verify_tls=self.verify_tls.isChecked(),
            ca_file=self.ca_file.text().strip() or None,
            connect_timeout_s=self.connect_timeout.value(),
            timeout_s=self.timeout.value(),
        )

    def save(self) -> bool:
        """Save the form (a new connection, or changes to the one selected); its key goes to
        the keyring when one was typed. False (with the reason shown) when it cannot."""
        conn = self.form_connection()
        key = self.api_key.text().strip()
        try:
            if self._editing is None:
                result = self.store.add(conn, key or None)
            else:
                self.store.update(self._editing, conn)
                result = self.store.set_api_key(conn.name, key) if key else None
        except (ConnectionsError, OSError) as e:
            self.show_status(False, str(e))
            return False
        self._editing = conn.name
        if key:  # saved: the field goes back to saying so, the key leaves the widget
            self.api_key.clear()
            self.api_key.setPlaceholderText("saved (leave empty to keep it)")
        self.refresh(select=conn.name)
        self.show_status(
            True, f"Saved {conn.name}" + (f"; {result.message}" if result is not None else "")
        )
        self.changed.emit()
        return True

    def remove_current(self) -> None:
        name = self._editing
        if name is None:
            return
        try:
            self.store.remove(name)
        except (ConnectionsError, OSError) as e:
            self.show_status(False, str(e))
            return
        self.refresh()
        self.changed.emit()
        if self.list.count():
            self.list.setCurrentRow(0)
        else:
            self.new_connection()
        self.show_status(True, f"Removed {name}")

    def _endpoint(self) -> RemoteEndpoint:
        """The form as an endpoint; the key typed, or else the saved one (read in the test's
        thread: a keyring may be slow)."""
        c = self.form_connection()
        return RemoteEndpoint(
            name=c.name or "connection",
            base_url=c.base_url,
            api=c.api,
            model=c.model,
            api_key=self.api_key.text().strip() or None,
            verify_tls=c.verify_tls,
            ca_file=c.ca_file,
            connect_timeout_s=c.connect_timeout_s,
            timeout_s=c.timeout_s,
        )

    def test(self) -> None:
        """Check the connection as the form has it, off the GUI thread."""
        ep = self._endpoint()
        saved = self._editing

        def check() -> CheckResult:
            endpoint = ep
            if endpoint.api_key is None and saved is not None:
                key = self.store.api_key(saved)
                if key:
                    endpoint = dataclasses.replace(endpoint, api_key=key)
            return RemoteEngine(endpoint).check()

        self.test_button.setEnabled(False)
        self.show_status(None, f"Testing {ep.base_url or 'the connection'}…")
        self.background.run(check, self._tested, name="candlewick-connection-test")

    def _tested(self, result: CheckResult | None, error: BaseException | None) -> None:
        self.test_button.setEnabled(True)
        if error is not None or result is None:
            msg = (
                str(error)
                if isinstance(error, EngineError | ConnectionsError)
                else f"test failed: {type(error).__name__}: {error}"
            )
            self.show_status(False, msg)
            self.tested.emit(False, msg)
            return
        self.models.clear()
        self.models.addItems(list(result.models))
        current = self.model.currentText()
        self.model.clear()
        self.model.addItems(list(result.models))
        self.model.setCurrentText(current)
        self.show_status(result.ok, result.message)
        self.tested.emit(result.ok, result.message)

    def show_status(self, ok: bool | None, text: str) -> None:
        color = {True: OK_COLOR, False: ERROR_COLOR}.get(ok) if ok is not None else None
        self.status.setStyleSheet(f"color: {color};" if color else "")
        mark = {True: "\u2713 ", False: "\u2717 "}.get(ok) if ok is not None else ""
        self.status.setText(f"{mark}{text}")

    # -- closing -----------------------------------------------------------------------------

    def done(self, result: int) -> None:
        # A check still waiting on a server that does not answer is not worth a hung window:
        # give it a moment, then leave it (a daemon thread; its result is dropped).
        self.background.wait(timeout_s=2.0)
        super().done(result)
