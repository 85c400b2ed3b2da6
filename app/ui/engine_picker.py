"""The engine a chat uses, above the chat: the local model selected in the library, or a model
on one of the saved remote connections.

The choice belongs to the conversation (it is saved in its settings as `engine`: None for the
local model, or {"connection": name, "model": id}); this widget shows it and lets the user
change it. Each connection's models are fetched off the GUI thread when the list is
refreshed; until they arrive (or when the server cannot be reached) the connection's default
model is offered, so a saved choice can always be shown.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget

from app.services.connections import ConnectionsError, ConnectionStore
from app.ui.background import Background
from engine.errors import EngineError

Binding = dict[str, str] | None  # None: the local model


def binding_of(settings: dict[str, Any]) -> Binding:
    """The engine binding kept in a conversation's settings (anything malformed: local)."""
    b = settings.get("engine")
    if isinstance(b, dict) and isinstance(b.get("connection"), str) and b["connection"]:
        return {"connection": b["connection"], "model": str(b.get("model") or "")}
    return None


def describe(binding: Binding, local_name: str = "") -> str:
    if binding is None:
        return f"This computer: {local_name}" if local_name else "This computer"
    model = binding["model"] or "first listed model"
    return f"{binding['connection']} · {model}"


class EnginePicker(QWidget):
    chosen = Signal(object)  # Binding: the user picked an engine for this chat
    manage_requested = Signal()  # "Connections…"

    def __init__(self, connections: ConnectionStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.connections = connections
        self.background = Background(self)
        self._models: dict[str, list[str]] = {}  # connection -> models the server listed
        self._errors: dict[str, str] = {}  # connection -> why its models are unknown
        self._local_name = ""
        self._binding: Binding = None
        self._generation = 0  # refreshes started; late answers of older ones are dropped

        self.combo = QComboBox()
        self.combo.setAccessibleName("Engine for this chat")
        self.combo.setToolTip(
            "Which engine answers in this chat: the local model selected "
            "in the library, or a model on a remote connection"
        )
        self.combo.setMinimumContentsLength(28)
        self.combo.activated.connect(self._on_activated)
        self.refresh_button = QToolButton()
        self.refresh_button.setText("\u21bb")
        self.refresh_button.setAccessibleName("Refresh the remote models")
        self.refresh_button.setToolTip("Ask each connection again which models it has")
        self.refresh_button.clicked.connect(self.refresh)
        self.manage_button = QPushButton("Connections…")
        self.manage_button.setAccessibleName("Manage remote connections")
        self.manage_button.clicked.connect(self.manage_requested)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(QLabel("Engine"))
        lay.addWidget(self.combo, 1)
        lay.addWidget(self.refresh_button)
        lay.addWidget(self.manage_button)
        self._rebuild()

    # -- state -------------------------------------------------------------------------------

    def binding(self) -> Binding:
        return self._binding

    def set_binding(self, binding: Binding) -> None:
        """Show a conversation's engine (no `chosen` signal)."""
        self._binding = dict(binding) if binding else None
        self._rebuild()

    def set_local_name(self, name: str) -> None:
        """The name of the model selected in the library, for the local entry."""
        self._local_name = name
        self._rebuild()

    def items(self) -> list[tuple[str, Binding]]:
        return [(self.combo.itemText(i), self.combo.itemData(i)) for i in range(self.combo.count())]

    def choose(self, binding: Binding) -> bool:
        """Pick an engine as the user would (emits `chosen`); False if it is not listed."""
        for i in range(self.combo.count()):
            if self.combo.itemData(i) == binding and self._enabled(i):
                self.combo.setCurrentIndex(i)
                self._on_activated(i)
                return True
        return False

    @property
    def fetching(self) -> int:
        return self.background.running

    # -- fetching ----------------------------------------------------------------------------

    def refresh(self) -> None:
        """Re-read the saved connections and ask each for its models (off the GUI thread)."""
        self._generation += 1
        gen = self._generation
        self._models.clear()
        self._errors.clear()
        try:
            names = self.connections.names()
        except ConnectionsError as e:
            names = []
            self.combo.setToolTip(str(e))
        for name in names:
            self._fetch(gen, name)
        self._rebuild()

    def _fetch(self, gen: int, name: str) -> None:
        def work() -> list[str]:
            return self.connections.engine(name).list_models()

        def done(models: Any, error: BaseException | None) -> None:
            self._fetched(gen, name, models, error)

        self.background.run(work, done, name="candlewick-list-models")

    def _fetched(
        self, gen: int, name: str, models: list[str] | None, error: BaseException | None
    ) -> None:
        if gen != self._generation:
            return
        if error is not None or models is None:
            self._errors[name] = (
                str(error)
                if isinstance(error, EngineError | ValueError)
                else f"{type(error).__name__}: {error}"
            )
        else:
            self._models[name] = list(models)
        self._rebuild()

    def _rebuild(self) -> None:
        self.combo.blockSignals(True)
        self.combo.clear()
        self.combo.addItem(describe(None, self._local_name), None)
        try:
            conns = self.connections.connections()
        except ConnectionsError:
            conns = []
        for c in conns:
            models = self._models.get(c.name)
            if models is None:
                # Not (yet) listed: offer the default model, and say why the list is missing.
                models = [c.model]
            for m in models:
                b = {"connection": c.name, "model": m}
                self.combo.addItem(describe(b), b)
            err = self._errors.get(c.name)
            if err:
                self.combo.addItem(f"{c.name}: {err}", "error")
                i = self.combo.count() - 1
                item = self._item_model().item(i)
                if item is not None:
                    item.setEnabled(False)
                    item.setToolTip(err)
        current = self._binding
        index = next(
            (i for i in range(self.combo.count()) if self.combo.itemData(i) == current), -1
        )
        if index < 0 and current is not None:
            # A chat bound to a connection (or model) that is gone: still show it.
            self.combo.addItem(describe(current) + " (not available)", dict(current))
            index = self.combo.count() - 1
        self.combo.setCurrentIndex(max(index, 0))
        self.combo.blockSignals(False)

    def _item_model(self) -> QStandardItemModel:
        model = self.combo.model()
        assert isinstance(model, QStandardItemModel)
        return model

    def _enabled(self, i: int) -> bool:
        item = self._item_model().item(i)
        return item is None or item.isEnabled()

    def _on_activated(self, i: int) -> None:
        data = self.combo.itemData(i)
        if data == "error":
            return
        binding: Binding = dict(data) if isinstance(data, dict) else None
        if binding != self._binding:
            self._binding = binding
            self.chosen.emit(binding)

    def shutdown(self) -> None:
        # A check still waiting on a server that does not answer is not worth a hung window:
        # give it a moment, then leave it (a daemon thread; its result is dropped).
        self.background.wait(timeout_s=2.0)
