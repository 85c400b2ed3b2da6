"""MCP servers: add, edit, remove, import and test the tool servers the chat can use.

A server is a local command (stdio: command, arguments, environment, working folder) or a
Streamable HTTP URL with an optional bearer token. The token goes to the keyring through the
store and never into the config file; environment values are secrets too, so the form shows
them masked unless "Show" is ticked. "Test" lists the tools of the server as the form has it,
saved or not, with a throwaway `McpHub` on a worker thread; each tool can be marked "always
allow" once the server is saved.

Nothing here opens a modal dialog on a path tests drive: the import text box is reached through
`ask_import_text`, which a test replaces, and `import_text` does the work.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.services.mcp_client import McpClientError, McpHub, ToolInfo
from app.services.mcp_config import (
    HttpTransport,
    ImportReport,
    McpConfigError,
    McpConfigStore,
    McpServer,
    StdioTransport,
    Transport,
    account,
)
from app.services.secrets import SecretStore
from app.ui.background import Background

# Builds the hub a test runs on: the one server to test, and where its token is read from.
HubFactory = Callable[[Sequence[McpServer], SecretStore], McpHub]

# The connections dialog's colors, not imported: that module pulls in the remote engines.
OK_COLOR = "#2e7d32"
ERROR_COLOR = "#c62828"
TEST_TIMEOUT_S = 30.0
ENV_MASK = "\u2022" * 6
TOKEN_SAVED = "saved (leave empty to keep it)"
# Tools table columns.
COL_ALLOW, COL_NAME, COL_DESCRIPTION, COL_PARAMETERS = range(4)


def _default_hub(servers: Sequence[McpServer], secrets: SecretStore) -> McpHub:
    return McpHub(servers, secrets=secrets, start_timeout_s=TEST_TIMEOUT_S)


# -- form text <-> settings (Qt-free helpers, tested directly) ---------------------------------


def split_args(text: str, *, windows: bool = os.name == "nt") -> list[str]:
    """A command line's arguments, split like a shell would. On Windows backslashes are path
    separators, not escapes, so the non-POSIX splitter is used and only quotes are removed."""
    try:
        if windows:
            return [
                a[1:-1] if len(a) >= 2 and a[0] == a[-1] == '"' else a
                for a in shlex.split(text, posix=False)
            ]
        return shlex.split(text)
    except ValueError as e:
        raise McpConfigError(f"the arguments do not parse: {e}") from None


def join_args(args: Sequence[str], *, windows: bool = os.name == "nt") -> str:
    """The inverse of `split_args`, for showing saved arguments in the one-line field."""
    return subprocess.list2cmdline(list(args)) if windows else shlex.join(args)


def parse_env(text: str) -> dict[str, str]:
    """NAME=VALUE lines (blank lines and # comments skipped). Errors name the line, never its
    text: it may hold a secret."""
    env: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, eq, value = stripped.partition("=")
        if not eq or not key.strip():
            raise McpConfigError(f"environment line {n}: expected NAME=VALUE")
        env[key.strip()] = value
    return env


def format_env(env: Mapping[str, str], *, masked: bool) -> str:
    return "\n".join(f"{k}={ENV_MASK if masked else v}" for k, v in env.items())


def _type_name(spec: Any) -> str:
    if not isinstance(spec, Mapping):
        return "any"
    kind = spec.get("type")
    if isinstance(kind, str):
        items = spec.get("items")
        if kind == "array" and isinstance(items, Mapping) and "type" in items:
            return f"array of {_type_name(items)}"
        return kind
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    for key in ("anyOf", "oneOf"):
        options = spec.get(key)
        if isinstance(options, list) and options:
            names = dict.fromkeys(_type_name(o) for o in options)  # ordered, no repeats
            return " | ".join(names)
    if "enum" in spec:
        return "enum"
    return "object" if "$ref" in spec or "properties" in spec else "any"


def describe_parameters(schema: Mapping[str, Any]) -> str:
    """A tool's parameters from its input JSON schema: "a: integer (required), b: string"."""
    props = schema.get("properties")
    if not isinstance(props, Mapping) or not props:
        return "none"
    required = schema.get("required")
    needed = set(required) if isinstance(required, list) else set()
    return ", ".join(
        f"{name}: {_type_name(spec)}" + (" (required)" if name in needed else "")
        for name, spec in props.items()
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


class _FormSecrets(SecretStore):
    """What a test's hub reads the token from: the one typed in the form, else the token saved
    for the server being edited (it may be renamed in the form, hence the mapping)."""

    def __init__(
        self, store: McpConfigStore, name: str, typed: str | None, saved_name: str | None
    ) -> None:
        super().__init__()
        self._account = account(name)
        self._typed = typed
        self._store = store
        self._saved_name = saved_name

    def get(self, acct: str) -> str | None:
        if acct != self._account:
            return None
        if self._typed:
            return self._typed
        return self._store.token(self._saved_name) if self._saved_name else None


class McpServersDialog(QDialog):
    changed = Signal()  # a server was saved, removed, imported, enabled or disabled
    tested = Signal(bool, str)  # a test ended: ok, the line shown

    def __init__(
        self,
        store: McpConfigStore,
        hub_factory: HubFactory | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("MCP servers")
        self.store = store
        self.hub_factory = hub_factory or _default_hub
        self.background = Background(self)
        # Replaceable by tests: asks for pasted mcpServers JSON; None when cancelled.
        self.ask_import_text: Callable[[], str | None] = self._ask_import_text
        self._editing: str | None = None  # the saved name being edited; None: a new one
        self._enabled = True
        self._always_allow: frozenset[str] = frozenset()
        self._env: dict[str, str] = {}  # the truth while the env box shows masked values
        self._generation = 0  # bumped when the form shows another server: stale tests drop
        self._cancel = threading.Event()
        self.load_error: str | None = None  # why the file could not be read, if it could not

        self.list = QListWidget()
        self.list.setAccessibleName("MCP servers")
        self.list.currentItemChanged.connect(self._on_selected)
        self.list.itemChanged.connect(self._on_item_changed)
        self.add_button = self._button("Add", "Add an MCP server", self.new_server)
        self.remove_button = self._button("Remove", "Remove the MCP server", self.remove_current)
        self.import_button = self._button(
            "Import…", "Import mcpServers JSON", self.import_from_user
        )

        self.name = self._line("Name", "e.g. files")
        self.transport = QComboBox()
        self.transport.setAccessibleName("Transport")
        self.transport.addItem("stdio (a local command)", "stdio")
        self.transport.addItem("Streamable HTTP", "http")
        self.transport.currentIndexChanged.connect(self._on_transport)

        self.command = self._line("Command", "e.g. npx or /usr/bin/python3")
        self.arguments = self._line("Arguments", "e.g. -y @modelcontextprotocol/server-memory")
        self.arguments.setToolTip(
            "One line, split like a shell does: quote arguments that contain spaces"
        )
        self.env = QPlainTextEdit()
        self.env.setAccessibleName("Environment")
        self.env.setPlaceholderText("NAME=VALUE, one a line (tick Show to edit)")
        self.env.setMaximumHeight(80)
        self.show_env = QCheckBox("Show")
        self.show_env.setAccessibleName("Show environment values")
        self.show_env.setToolTip("Show the values to read or edit them")
        self.show_env.toggled.connect(self._on_show_env)
        self.cwd = self._line("Working folder", "optional")
        env_row = QHBoxLayout()
        env_row.addWidget(self.env, 1)
        env_row.addWidget(self.show_env, 0, Qt.AlignmentFlag.AlignTop)

        self.url = self._line("URL", "e.g. http://127.0.0.1:8000/mcp")
        self.token = self._line("Bearer token", "none")
        self.token.setEchoMode(QLineEdit.EchoMode.Password)

        self.test_button = self._button("Test", "Test the MCP server", self.test)
        self.save_button = self._button("Save", "Save the MCP server", self.save)
        self.status = QLabel()
        self.status.setAccessibleName("MCP server status")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.problems = QListWidget()
        self.problems.setAccessibleName("Import problems")
        self.problems.setMaximumHeight(90)
        self.problems.hide()
        self.tools = QTableWidget(0, 4)
        self.tools.setAccessibleName("Tools on the server")
        self.tools.setHorizontalHeaderLabels(["Always allow", "Tool", "Description", "Parameters"])
        self.tools.verticalHeader().hide()
        self.tools.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.tools.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = self.tools.horizontalHeader()
        for col in (COL_ALLOW, COL_NAME):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(COL_DESCRIPTION, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(COL_PARAMETERS, QHeaderView.ResizeMode.Stretch)
        self.tools.itemChanged.connect(self._on_tool_changed)

        left = QVBoxLayout()
        left.addWidget(self.list, 1)
        row = QHBoxLayout()
        row.addWidget(self.add_button)
        row.addWidget(self.remove_button)
        left.addLayout(row)
        left.addWidget(self.import_button)
        # One form for both transports, the other's rows hidden: the labels stay aligned.
        form = self.form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow("Transport", self.transport)
        form.addRow("Command", self.command)
        form.addRow("Arguments", self.arguments)
        form.addRow("Environment", env_row)
        form.addRow("Working folder", self.cwd)
        form.addRow("URL", self.url)
        form.addRow("Bearer token", self.token)
        self._stdio_rows: list[QWidget | QHBoxLayout] = [
            self.command,
            self.arguments,
            env_row,
            self.cwd,
        ]
        self._http_rows = [self.url, self.token]
        actions = QHBoxLayout()
        actions.addWidget(self.test_button)
        actions.addStretch(1)
        actions.addWidget(self.save_button)
        right = QVBoxLayout()
        right.addLayout(form)
        right.addLayout(actions)
        right.addWidget(self.status)
        right.addWidget(self.problems)
        right.addWidget(QLabel("Tools on the server"))
        right.addWidget(self.tools, 1)
        body = QHBoxLayout()
        body.addLayout(left, 1)
        body.addLayout(right, 3)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addLayout(body, 1)
        lay.addWidget(close)
        self.resize(900, 580)
        self.refresh()
        if self.list.count():
            self.list.setCurrentRow(0)
        else:
            self.new_server()
        if self.load_error:  # showing the form cleared it
            self.show_status(False, self.load_error)

    def _line(self, name: str, placeholder: str) -> QLineEdit:
        w = QLineEdit()
        w.setAccessibleName(name)
        w.setPlaceholderText(placeholder)
        return w

    def _button(self, text: str, name: str, slot: Callable[[], object]) -> QPushButton:
        b = QPushButton(text)
        b.setAccessibleName(name)
        b.clicked.connect(lambda: slot())  # not the `checked` argument clicked carries
        return b

    # -- the list ----------------------------------------------------------------------------

    def refresh(self, select: str | None = None) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        self.load_error = None
        try:
            servers = self.store.servers()
        except McpConfigError as e:
            servers = []
            self.load_error = _one_line(str(e))
            self.show_status(False, self.load_error)
        for s in servers:
            item = QListWidgetItem(s.name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if s.enabled else Qt.CheckState.Unchecked)
            item.setToolTip(s.describe())  # env values and secret arguments masked
            self.list.addItem(item)
        if select is not None:
            # Selected without reloading the form: it shows this server already.
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
            server = self.store.get(item.text())
            has_token = (
                isinstance(server.transport, HttpTransport)
                and self.store.token(server.name) is not None
            )
        except McpConfigError as e:
            self.show_status(False, str(e))
            return
        self.show_server(server, has_token)

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        """The enabled checkbox of a server: saved at once."""
        name, on = item.text(), item.checkState() == Qt.CheckState.Checked
        try:
            self.store.set_enabled(name, on)
        except (McpConfigError, OSError) as e:
            self.list.blockSignals(True)
            item.setCheckState(Qt.CheckState.Unchecked if on else Qt.CheckState.Checked)
            self.list.blockSignals(False)
            self.show_status(False, str(e))
            return
        if name == self._editing:
            self._enabled = on
        self.show_status(True, f"{name} turned {'on' if on else 'off'}")
        self.changed.emit()

    def show_server(self, server: McpServer, has_token: bool) -> None:
        self._generation += 1
        self._editing = server.name
        self._enabled = server.enabled
        self._always_allow = server.always_allow
        self.name.setText(server.name)
        t = server.transport
        stdio = t if isinstance(t, StdioTransport) else StdioTransport("")
        self.command.setText(stdio.command)
        self.arguments.setText(join_args(stdio.args))
        self.cwd.setText(stdio.cwd or "")
        self._env = dict(stdio.env)
        self.show_env.blockSignals(True)
        self.show_env.setChecked(False)  # values leave the widget when another server shows
        self.show_env.blockSignals(False)
        self._show_env_text(masked=True)
        self.url.setText(t.url if isinstance(t, HttpTransport) else "")
        self.token.clear()
        self.token.setPlaceholderText(TOKEN_SAVED if has_token else "none")
        self.transport.setCurrentIndex(max(self.transport.findData(t.kind), 0))
        self._on_transport()
        self.tools.setRowCount(0)
        self.problems.clear()
        self.problems.hide()
        self.status.clear()
        self.remove_button.setEnabled(True)

    def new_server(self) -> None:
        """An empty form for a new server (stdio)."""
        self.list.blockSignals(True)
        self.list.setCurrentRow(-1)
        self.list.clearSelection()
        self.list.blockSignals(False)
        self.show_server(McpServer("", StdioTransport("")), has_token=False)
        self._editing = None
        self.remove_button.setEnabled(False)
        self.name.setFocus()

    # -- the form ----------------------------------------------------------------------------

    def _on_transport(self) -> None:
        stdio = self.transport.currentData() == "stdio"
        for row in self._stdio_rows:
            self.form.setRowVisible(row, stdio)
        for field in self._http_rows:
            self.form.setRowVisible(field, not stdio)

    def _show_env_text(self, *, masked: bool) -> None:
        self.env.setPlainText(format_env(self._env, masked=masked))
        # Typed values would show: edited only while shown (and masked text is no value).
        self.env.setReadOnly(masked)

    def _on_show_env(self, shown: bool) -> None:
        if shown:
            self._show_env_text(masked=False)
            return
        try:
            self._env = parse_env(self.env.toPlainText())
        except McpConfigError as e:
            self.show_env.blockSignals(True)
            self.show_env.setChecked(True)  # keep what was typed in view, to be fixed
            self.show_env.blockSignals(False)
            self.show_status(False, str(e))
            return
        self._show_env_text(masked=True)

    def form_env(self) -> dict[str, str]:
        """The environment as the form has it: the text while shown, else the values kept
        aside when it was masked."""
        if self.show_env.isChecked():
            return parse_env(self.env.toPlainText())
        return dict(self._env)

    def form_server(self) -> McpServer:
        """The server as the form has it (not validated; raises McpConfigError when the
        arguments or the environment do not parse)."""
        transport: Transport
        if self.transport.currentData() == "stdio":
            transport = StdioTransport(
                command=self.command.text().strip(),
                args=tuple(split_args(self.arguments.text())),
                env=self.form_env(),
                cwd=self.cwd.text().strip() or None,
            )
        else:
            transport = HttpTransport(self.url.text().strip())
        return McpServer(self.name.text().strip(), transport, self._enabled, self._always_allow)

    def save(self) -> bool:
        """Save the form (a new server, or changes to the one selected); a typed token goes to
        the keyring. False (with the reason shown, the form as it was) when it cannot."""
        token = self.token.text().strip()
        try:
            server = self.form_server()
            if self._editing is None:
                self.store.add(server)
            else:
                self.store.update(self._editing, server)
        except (McpConfigError, OSError) as e:
            self.show_status(False, _one_line(str(e)))
            return False
        self._editing = server.name
        stdio = server.transport if isinstance(server.transport, StdioTransport) else None
        self._env = dict(stdio.env) if stdio else {}
        self.refresh(select=server.name)
        self._update_allow_cells()
        self.changed.emit()
        # The token after the server: a token refused leaves a saved server, and the next
        # save (with the token fixed) updates it rather than adding it twice.
        try:
            result = None
            if stdio is not None:
                self.store.set_token(server.name, None)  # no orphan token for stdio
            elif token:
                result = self.store.set_token(server.name, token)
        except (McpConfigError, OSError) as e:
            self.show_status(False, f"Saved {server.name}, but not its token: {_one_line(str(e))}")
            return False
        if result is not None:  # saved: the field goes back to saying so, the token leaves it
            self.token.clear()
            self.token.setPlaceholderText(TOKEN_SAVED)
        self.show_status(
            True, f"Saved {server.name}" + (f"; {result.message}" if result is not None else "")
        )
        return True

    def remove_current(self) -> None:
        name = self._editing
        if name is None:
            return
        try:
            self.store.remove(name)
        except (McpConfigError, OSError) as e:
            self.show_status(False, _one_line(str(e)))
            return
        self.refresh()
        self.changed.emit()
        if self.list.count():
            self.list.setCurrentRow(0)
        else:
            self.new_server()
        self.show_status(True, f"Removed {name}")

    # -- import ------------------------------------------------------------------------------

    def import_from_user(self) -> None:
        text = self.ask_import_text()
        if text is not None and text.strip():
            self.import_text(text)

    def import_text(self, text: str) -> ImportReport | None:
        """Add the servers of pasted `{"mcpServers": {...}}` JSON; shows what was added and a
        line per entry that was not (or only in part). None when nothing could be read."""
        try:
            report = self.store.import_mcp_servers(text)
        except (McpConfigError, OSError) as e:
            self.show_status(False, f"Import failed: {_one_line(str(e))}")
            return None
        self.refresh(select=self._editing)
        if report.added:
            found = self.list.findItems(report.added[0], Qt.MatchFlag.MatchExactly)
            if found:
                self.list.setCurrentItem(found[0])  # shows it in the form
            self.changed.emit()
        self.problems.clear()
        self.problems.addItems(report.problems)
        self.problems.setVisible(bool(report.problems))
        added = ", ".join(report.added) if report.added else "nothing"
        notes = len(report.problems)
        self.show_status(
            bool(report.added),
            f"Imported {added}"
            + (f"; {notes} problem{'s' if notes != 1 else ''} (below)" if notes else ""),
        )
        return report

    def _ask_import_text(self) -> str | None:
        box = QDialog(self)
        box.setWindowTitle("Import MCP servers")
        text = QPlainTextEdit()
        text.setAccessibleName("mcpServers JSON")
        text.setPlaceholderText(
            "Paste a Claude Desktop or LM Studio config:\n"
            '{"mcpServers": {"name": {"command": "...", "args": []}}}'
        )
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(box.accept)
        buttons.rejected.connect(box.reject)
        lay = QVBoxLayout(box)
        lay.addWidget(text)
        lay.addWidget(buttons)
        box.resize(560, 360)
        ok = box.exec() == QDialog.DialogCode.Accepted.value
        pasted = text.toPlainText()
        box.deleteLater()
        return pasted if ok else None

    # -- test --------------------------------------------------------------------------------

    def test(self) -> None:
        """List the tools of the server as the form has it, off the GUI thread, on a hub of its
        own that is closed afterwards."""
        try:
            server = self.form_server()
            # Tested as asked, even when turned off; a name only if the form has none yet.
            server = replace(server, name=server.name or "server", enabled=True)
            server.validate()
        except McpConfigError as e:
            self._test_failed(_one_line(str(e)))
            return
        token = self.token.text().strip() or None
        secrets = _FormSecrets(self.store, server.name, token, self._editing)
        factory, cancel, generation = self.hub_factory, self._cancel, self._generation

        def list_tools() -> list[ToolInfo]:
            hub = factory([server], secrets)
            try:
                return hub.list_tools(server.name, cancel=cancel, timeout_s=TEST_TIMEOUT_S)
            finally:
                hub.close()  # here, not on the GUI thread: stopping a server takes a moment

        self.test_button.setEnabled(False)
        self.tools.setRowCount(0)
        self.show_status(None, f"Testing {server.name}…")
        self.background.run(
            list_tools,
            lambda result, error: self._tested(generation, result, error),
            name="candlewick-mcp-test",
        )

    def _tested(
        self, generation: int, tools: list[ToolInfo] | None, error: BaseException | None
    ) -> None:
        self.test_button.setEnabled(True)
        if generation != self._generation:
            return  # the form shows another server now
        if error is not None or tools is None:
            msg = (
                str(error)
                if isinstance(error, McpClientError | McpConfigError)
                else f"test failed: {type(error).__name__}: {error}"
            )
            self._test_failed(_one_line(msg))
            return
        self.show_tools(tools)
        msg = f"{len(tools)} tool{'s' if len(tools) != 1 else ''} on {self.name.text().strip()}"
        self.show_status(True, msg)
        self.tested.emit(True, msg)

    def _test_failed(self, msg: str) -> None:
        self.show_status(False, msg)
        self.tested.emit(False, msg)

    def show_tools(self, tools: Sequence[ToolInfo]) -> None:
        self.tools.blockSignals(True)
        self.tools.setRowCount(len(tools))
        for row, tool in enumerate(tools):
            allow = QTableWidgetItem()
            allow.setData(Qt.ItemDataRole.UserRole, tool.name)
            allow.setCheckState(
                Qt.CheckState.Checked
                if tool.name in self._always_allow
                else Qt.CheckState.Unchecked
            )
            self.tools.setItem(row, COL_ALLOW, allow)
            params = describe_parameters(tool.input_schema)
            summary = tool.description.strip().splitlines()[0] if tool.description.strip() else ""
            for col, text, tip in (
                (COL_NAME, tool.name, tool.name),
                (COL_DESCRIPTION, summary, tool.description),
                (COL_PARAMETERS, params, params),
            ):
                cell = QTableWidgetItem(text)
                cell.setToolTip(tip)
                self.tools.setItem(row, col, cell)
        self.tools.blockSignals(False)
        self._update_allow_cells()

    def tool_names(self) -> list[str]:
        cells = (self.tools.item(r, COL_NAME) for r in range(self.tools.rowCount()))
        return [c.text() for c in cells if c is not None]

    def tool_row(self, name: str) -> int:
        return self.tool_names().index(name)

    def _update_allow_cells(self) -> None:
        """ "Always allow" is a setting of a saved server: greyed out until the server is."""
        saved = self._editing is not None
        self.tools.blockSignals(True)
        for row in range(self.tools.rowCount()):
            cell = self.tools.item(row, COL_ALLOW)
            if cell is None:
                continue
            flags = Qt.ItemFlag.ItemIsUserCheckable | Qt.ItemFlag.ItemIsSelectable
            cell.setFlags(flags | Qt.ItemFlag.ItemIsEnabled if saved else flags)
            cell.setToolTip(
                "Run this tool without asking each time" if saved else "Save the server first"
            )
        self.tools.blockSignals(False)

    def _on_tool_changed(self, cell: QTableWidgetItem) -> None:
        if cell.column() != COL_ALLOW or self._editing is None:
            return
        tool = str(cell.data(Qt.ItemDataRole.UserRole))
        allowed = cell.checkState() == Qt.CheckState.Checked
        try:
            self.store.set_always_allow(self._editing, tool, allowed)
        except (McpConfigError, OSError) as e:
            self.tools.blockSignals(True)
            cell.setCheckState(Qt.CheckState.Unchecked if allowed else Qt.CheckState.Checked)
            self.tools.blockSignals(False)
            self.show_status(False, _one_line(str(e)))
            return
        self._always_allow = self._always_allow | {tool} if allowed else self._always_allow - {tool}
        self.show_status(True, f"{tool} {'runs without asking' if allowed else 'asks first'}")
        self.changed.emit()

    def show_status(self, ok: bool | None, text: str) -> None:
        color = {True: OK_COLOR, False: ERROR_COLOR}.get(ok) if ok is not None else None
        self.status.setStyleSheet(f"color: {color};" if color else "")
        mark = {True: "\u2713 ", False: "\u2717 "}.get(ok) if ok is not None else ""
        self.status.setText(f"{mark}{text}")

    # -- closing -----------------------------------------------------------------------------

    def done(self, result: int) -> None:
        # A test waiting on a server that does not answer gives up at once (the cancel event)
        # and stops its server; give that a moment, then leave it (a daemon thread).
        self._cancel.set()
        self.background.wait(timeout_s=3.0)
        # Fresh ones, in case the dialog is shown again rather than deleted.
        self._cancel = threading.Event()
        self.background = Background(self)
        super().done(result)


__all__ = [
    "HubFactory",
    "McpServersDialog",
    "describe_parameters",
    "format_env",
    "join_args",
    "parse_env",
    "split_args",
]
