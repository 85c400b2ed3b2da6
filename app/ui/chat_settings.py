"""Per-chat settings: system prompt, sampling, context policy, structured output, and named
presets.

The drawer edits a plain dict (the conversation's `settings` in the store); `changed` carries
the whole dict after every edit. Only values that differ from the app's defaults are kept, so a
chat without changes follows the defaults.

Structured output is a JSON schema the chat's answers must follow. It is checked as it is
entered (`engine.decoding.constraints.json_schema`, which names what it cannot enforce); a
schema that does not pass shows why under the box, in one line, and is not kept: the chat
goes on with the last schema that passed (or free text).

Documents: the collections of the documents index this chat's answers are grounded in (a
checkable list), how many passages are searched for, the share of the context they may
take, and a reranker from the library that re-sorts what the search found. A collection
ticked in a chat and later removed from the index stays listed, marked, so it can be
unticked; so does a reranker the library no longer has.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase, QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.services.chat_settings import (
    DEFAULT_DOCS_BUDGET,
    DEFAULT_DOCS_K,
    DEFAULT_TOOL_ROUNDS,
    ChatSettings,
    SamplingOverrides,
)
from app.services.chat_store import ChatStore
from app.services.retrieval import RERANK_CANDIDATES
from engine.decoding import constraints
from engine.decoding.constraints import GrammarError
from engine.settings import SamplingParams

NO_COLLECTIONS = "No collections yet — add one with `candlewick docs add` or in the Documents tab"

# Every engine.host.context_policy policy (the first two kept where they were).
POLICIES = [
    ("drop_oldest", "Drop the oldest turns (keep the system prompt)"),
    ("stop", "Stop and say so"),
    ("truncate_middle", "Truncate the middle (keep the first exchange and the latest)"),
    ("summarise", "Summarise the earlier turns (the model writes it; you can edit it)"),
]


class ChatSettingsPanel(QWidget):
    changed = Signal(dict)

    def __init__(
        self,
        store: ChatStore,
        defaults: SamplingParams | None = None,
        parent: QWidget | None = None,
        *,
        tool_servers: Callable[[], Sequence[str]] | None = None,
        collections: Callable[[], Sequence[str]] | None = None,
        rerankers: Callable[[], Sequence[tuple[str, Path]]] | None = None,
    ) -> None:
        """`tool_servers`: the MCP servers turned on in the MCP servers dialog (each chat
        may turn some off for itself); `collections`: the collections in the documents
        index; `rerankers`: the library's rerankers, (name, file)."""
        super().__init__(parent)
        self.store = store
        self._tool_servers = tool_servers or list
        self._collection_names = collections or list
        self._reranker_models = rerankers or list
        self.defaults = defaults or SamplingParams()
        self._loading = False
        d = self.defaults
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setAccessibleName("System prompt")
        self.system_prompt.setPlaceholderText("e.g. You are a concise assistant.")
        self.system_prompt.setMaximumHeight(100)
        self.temperature = self._double(0.0, 2.0, 0.05, d.temperature, "Temperature")
        self.top_p = self._double(0.01, 1.0, 0.01, d.top_p, "Top-p")
        self.top_k = self._int(0, 1000, d.top_k, "Top-k")
        self.min_p = self._double(0.0, 1.0, 0.01, d.min_p, "Min-p")
        self.repeat_penalty = self._double(0.5, 2.0, 0.05, d.repeat_penalty, "Repeat penalty")
        self.max_tokens = self._int(1, 32768, d.max_tokens, "Max tokens")
        self.seed = self._int(-1, 2**31 - 1, -1 if d.seed is None else d.seed, "Seed")
        self.seed.setSpecialValueText("random")
        # Whether temperature 0 (or a fixed seed) repeats its answers with the engine in use.
        self.repeat_note = QLabel()
        self.repeat_note.setWordWrap(True)
        self.repeat_note.setAccessibleName("Repeatability")
        self._caveat: str | None = None  # None: no engine loaded
        self.policy = QComboBox()
        self.policy.setAccessibleName("When the context is full")
        for key, text in POLICIES:
            self.policy.addItem(text, key)
            self.policy.setItemData(self.policy.count() - 1, text, Qt.ItemDataRole.ToolTipRole)
        # Its longest choice made the whole tab 447 px wide, wider than a 1000 px window gives
        # it: the box shrinks to ~20 characters (cut with "…"; the list and tooltip are whole).
        self.policy.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.policy.setMinimumContentsLength(20)
        self.policy.setToolTip(self.policy.currentText())
        self.policy.currentTextChanged.connect(self.policy.setToolTip)
        # Structured output: a JSON schema, checked as it is entered.
        self.structured = QPlainTextEdit()
        self.structured.setAccessibleName("Structured output")
        self.structured.setPlaceholderText(
            'A JSON schema the answers must follow, e.g. {"type": "object", "properties": '
            '{"city": {"type": "string"}}, "required": ["city"]}. Empty: free text.'
        )
        self.structured.setToolTip(
            "Answers are generated to match this JSON schema and "
            "shown as JSON (a model on this computer only)"
        )
        self.structured.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.structured.setMaximumHeight(120)
        self.structured_error = QLabel()
        self.structured_error.setObjectName("structuredError")
        self.structured_error.setAccessibleName("Structured output problem")
        self.structured_error.setWordWrap(True)
        self.structured_error.setTextFormat(Qt.TextFormat.PlainText)
        self.structured_error.setStyleSheet("color: #c62828;")  # readable on light and dark
        self.structured_error.hide()
        self._schema: dict[str, Any] | None = None  # the last schema that passed
        # Tools (MCP servers) for this chat: every server on in the MCP dialog, unless
        # unticked here; and how many tool rounds an answer may take.
        self.tools = QListWidget()
        self.tools.setAccessibleName("Tools")
        self.tools.setToolTip(
            "The MCP servers whose tools the model may call in this chat "
            "(Tools → MCP servers… adds them). Every call asks you first."
        )
        self.tools.setMaximumHeight(90)
        self.no_tools = QLabel("No MCP servers: add one in Tools → MCP servers…")
        self.no_tools.setWordWrap(True)
        self.no_tools.setEnabled(False)
        self.tool_rounds = self._int(1, 64, DEFAULT_TOOL_ROUNDS, "Tool rounds")
        self.tool_rounds.setToolTip(
            "Tool calls the model may make, round after round, before its answer is stopped"
        )
        self._tools_off: list[str] = []
        # Documents: the collections answers are grounded in (none ticked: no retrieval).
        self.collections = QListWidget()
        self.collections.setAccessibleName("Collections")
        self.collections.setToolTip(
            "The question is searched in the ticked collections before the model answers; "
            "the passages found go in the prompt and are cited below the answer"
        )
        self.collections.setMaximumHeight(90)
        self.no_collections = QLabel(NO_COLLECTIONS)
        self.no_collections.setWordWrap(True)
        self.no_collections.setEnabled(False)
        self.no_collections.setTextFormat(Qt.TextFormat.PlainText)
        self.docs_k = self._int(1, 50, DEFAULT_DOCS_K, "Passages")
        self.docs_k.setToolTip("How many passages are searched for; those that fit go in")
        self.docs_budget = self._int(1, 75, DEFAULT_DOCS_BUDGET, "Passage budget")
        self.docs_budget.setSuffix(" % of the context")
        self.docs_budget.setToolTip(
            "The most the passages may take of the context (less when the conversation "
            "and the answer need the room)"
        )
        self._collections_on: list[str] = []
        self.docs_reranker = QComboBox()
        self.docs_reranker.setAccessibleName("Rerank with")
        self.docs_reranker.setToolTip(
            "A reranker re-sorts the passages found: it reads each of the best "
            f"{RERANK_CANDIDATES} with the question and scores how well it answers it. It "
            "costs time for every passage, before each answer"
        )
        self.docs_reranker.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.docs_reranker.setMinimumContentsLength(20)
        self._reranker: str | None = None  # the chat's reranker file
        # Answers read aloud as they stream (the voice: Tools → Voice…).
        self.auto_read = QCheckBox("Read answers aloud as they are written")
        self.auto_read.setAccessibleName("Auto-read answers")
        self.auto_read.setToolTip(
            "Each answer in this chat is spoken sentence by sentence while it streams "
            "(code blocks and citations are skipped)"
        )
        self.presets = QComboBox()
        self.presets.setAccessibleName("Presets")
        self.apply_preset_button = QPushButton("Apply")
        self.save_preset_button = QPushButton("Save as…")
        self.apply_preset_button.clicked.connect(
            lambda: self.apply_preset(self.presets.currentText())
        )
        self.save_preset_button.clicked.connect(self._ask_preset_name)

        form = QFormLayout()
        form.addRow("System prompt", self.system_prompt)
        for label, w in (
            ("Temperature", self.temperature),
            ("Top-p", self.top_p),
            ("", self.repeat_note),
            ("Top-k", self.top_k),
            ("Min-p", self.min_p),
            ("Repeat penalty", self.repeat_penalty),
            ("Max tokens", self.max_tokens),
            ("Seed", self.seed),
            ("Context full", self.policy),
        ):
            form.addRow(label, w)
        structured = QVBoxLayout()
        structured.setSpacing(2)
        structured.addWidget(self.structured)
        structured.addWidget(self.structured_error)
        form.addRow("Structured output", structured)
        tools = QVBoxLayout()
        tools.setSpacing(2)
        tools.addWidget(self.tools)
        tools.addWidget(self.no_tools)
        form.addRow("Tools", tools)
        form.addRow("Tool rounds", self.tool_rounds)
        docs = QVBoxLayout()
        docs.setSpacing(2)
        docs.addWidget(self.collections)
        docs.addWidget(self.no_collections)
        form.addRow("Documents", docs)
        form.addRow("Passages", self.docs_k)
        form.addRow("Passage budget", self.docs_budget)
        form.addRow("Rerank with", self.docs_reranker)
        form.addRow("Speech", self.auto_read)
        presets = QHBoxLayout()
        presets.addWidget(self.presets, 1)
        presets.addWidget(self.apply_preset_button)
        presets.addWidget(self.save_preset_button)
        form.addRow("Preset", presets)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addStretch(1)

        self.system_prompt.textChanged.connect(self._emit)
        for spin in (self.temperature, self.top_p, self.min_p, self.repeat_penalty):
            spin.valueChanged.connect(self._emit)
        for ispin in (self.top_k, self.max_tokens, self.seed):
            ispin.valueChanged.connect(self._emit)
        self.policy.currentIndexChanged.connect(self._emit)
        self.tool_rounds.valueChanged.connect(self._emit)
        self.tools.itemChanged.connect(self._on_tool_ticked)
        self.collections.itemChanged.connect(self._on_collection_ticked)
        self.docs_k.valueChanged.connect(self._emit)
        self.docs_budget.valueChanged.connect(self._emit)
        self.docs_reranker.currentIndexChanged.connect(self._on_reranker_chosen)
        self.auto_read.toggled.connect(self._emit)
        self.structured.textChanged.connect(self._check_schema)
        self.temperature.valueChanged.connect(self._show_repeat_note)
        self.seed.valueChanged.connect(self._show_repeat_note)
        self.refresh_presets()
        self.refresh_tools()
        self.refresh_collections()
        self._show_repeat_note()

    # -- documents -------------------------------------------------------------------------

    def set_collections(self, names: Callable[[], Sequence[str]]) -> None:
        """Where the collections come from (the documents index)."""
        self._collection_names = names
        self.refresh_collections()

    def collection_names(self) -> list[str]:
        """The collections the documents index has now."""
        return list(self._collection_names())

    def refresh_collections(self) -> None:
        """The index changed (or the chat did): list its collections, this chat's ticked; a
        ticked one the index no longer has stays, marked, so it can be unticked."""
        self._loading, was = True, self._loading
        try:
            self.collections.clear()
            names = self.collection_names()
            gone = [n for n in self._collections_on if n not in names]
            for name in names + gone:
                item = QListWidgetItem(name if name in names else f"{name} (removed)")
                item.setData(Qt.ItemDataRole.UserRole, name)
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                item.setCheckState(
                    Qt.CheckState.Checked
                    if name in self._collections_on
                    else Qt.CheckState.Unchecked
                )
                self.collections.addItem(item)
            has = self.collections.count() > 0
            self.collections.setVisible(has)
            self.no_collections.setVisible(not has)
            self.refresh_rerankers()
        finally:
            self._loading = was

    def set_rerankers(self, models: Callable[[], Sequence[tuple[str, Path]]]) -> None:
        """Where the rerankers come from (the library): (name, file) each."""
        self._reranker_models = models
        self.refresh_rerankers()

    def refresh_rerankers(self) -> None:
        """ "None" and the library's rerankers, this chat's chosen; one the library no
        longer has stays, marked, so the chat can be given another. Off while no collection
        is ticked: it re-sorts what their search finds."""
        self._loading, was = True, self._loading
        try:
            self.docs_reranker.clear()
            self.docs_reranker.addItem("None", None)
            for name, path in self._reranker_models():
                self.docs_reranker.addItem(name, str(path))
                self.docs_reranker.setItemData(
                    self.docs_reranker.count() - 1, str(path), Qt.ItemDataRole.ToolTipRole
                )
            if self._reranker is not None and self.docs_reranker.findData(self._reranker) < 0:
                gone = f"{Path(self._reranker).name} (not in the library)"
                self.docs_reranker.addItem(gone, self._reranker)
            self.docs_reranker.setCurrentIndex(
                max(0, self.docs_reranker.findData(self._reranker))
                if self._reranker is not None
                else 0
            )
            self.docs_reranker.setEnabled(bool(self._collections_on))
        finally:
            self._loading = was

    def _on_reranker_chosen(self, _index: int) -> None:
        if self._loading:
            return
        data = self.docs_reranker.currentData()
        self._reranker = str(data) if data else None
        self._emit()

    def _on_collection_ticked(self, item: QListWidgetItem) -> None:
        if self._loading:
            return
        name = str(item.data(Qt.ItemDataRole.UserRole))
        on = [n for n in self._collections_on if n != name]
        if item.checkState() == Qt.CheckState.Checked:
            on.append(name)
        self._collections_on = on
        self.docs_reranker.setEnabled(bool(on))
        self._emit()

    def showEvent(self, e: QShowEvent) -> None:
        # Collections added meanwhile (the command line, the Documents tab) show up.
        self.refresh_collections()
        super().showEvent(e)

    # -- tools -----------------------------------------------------------------------------

    def set_tool_servers(self, servers: Callable[[], Sequence[str]]) -> None:
        """Where the MCP servers come from (the app's MCP settings)."""
        self._tool_servers = servers
        self.refresh_tools()

    def refresh_tools(self) -> None:
        """The MCP servers changed (the dialog): list them, ticked unless this chat has them
        off."""
        self._loading, was = True, self._loading
        try:
            self.tools.clear()
            for name in self._tool_servers():
                item = QListWidgetItem(name)
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                item.setCheckState(
                    Qt.CheckState.Unchecked if name in self._tools_off else Qt.CheckState.Checked
                )
                self.tools.addItem(item)
            has = self.tools.count() > 0
            self.tools.setVisible(has)
            self.no_tools.setVisible(not has)
        finally:
            self._loading = was

    def _on_tool_ticked(self, item: QListWidgetItem) -> None:
        if self._loading:
            return
        name = item.text()
        off = [n for n in self._tools_off if n != name]
        if item.checkState() != Qt.CheckState.Checked:
            off.append(name)
        self._tools_off = off
        self._emit()

    def _double(self, lo: float, hi: float, step: float, value: float, name: str) -> QDoubleSpinBox:
        w = QDoubleSpinBox()
        w.setRange(lo, hi)
        w.setSingleStep(step)
        w.setDecimals(2)
        w.setValue(value)
        w.setAccessibleName(name)
        return w

    def _int(self, lo: int, hi: int, value: int, name: str) -> QSpinBox:
        w = QSpinBox()
        w.setRange(lo, hi)
        w.setValue(value)
        w.setAccessibleName(name)
        return w

    # -- repeatability ---------------------------------------------------------------------

    def set_engine_caveat(self, caveat: str | None) -> None:
        """The engine in use: '' when a reproducible request repeats its answer, else why it
        may not (`LoadedModel.repeat_caveat`); None when nothing is loaded."""
        self._caveat = caveat
        self._show_repeat_note()

    def _show_repeat_note(self) -> None:
        reproducible = self.temperature.value() <= 0 or self.seed.value() >= 0
        what = "Temperature 0" if self.temperature.value() <= 0 else "A fixed seed"
        if not reproducible or self._caveat is None:
            self.repeat_note.setVisible(False)
            return
        if self._caveat:
            text = f"{what} may still give another answer here: {self._caveat}."
        else:
            text = (
                f"{what}: Regenerate and Continue give the same text each time, also "
                "after a reload (a continued answer need not be what an uninterrupted "
                "one would have said)."
            )
        self.repeat_note.setText(text)
        self.repeat_note.setVisible(True)

    # -- values ----------------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """What differs from the defaults, as the store keeps it (`chat_settings`)."""
        return self.chat_settings().to_stored()

    def chat_settings(self) -> ChatSettings:
        """The drawer's values; a sampling value equal to the app's default is not set."""
        d = self.defaults
        values: dict[str, Any] = {
            "temperature": round(self.temperature.value(), 2),
            "top_p": round(self.top_p.value(), 2),
            "top_k": self.top_k.value(),
            "min_p": round(self.min_p.value(), 2),
            "repeat_penalty": round(self.repeat_penalty.value(), 2),
            "max_tokens": self.max_tokens.value(),
            "seed": None if self.seed.value() < 0 else self.seed.value(),
        }
        policy = self.policy.currentData()
        return ChatSettings(
            system_prompt=self.system_prompt.toPlainText().strip(),
            sampling=SamplingOverrides(**{k: v for k, v in values.items() if v != getattr(d, k)}),
            context_policy=policy if isinstance(policy, str) else "drop_oldest",  # type: ignore[arg-type]
            structured_output=self._schema,
            tools_off=tuple(sorted(self._tools_off)),
            tool_rounds=self.tool_rounds.value(),
            collections=tuple(self._collections_on),
            docs_k=self.docs_k.value(),
            docs_budget=self.docs_budget.value(),
            docs_reranker=self._reranker,
            auto_read=self.auto_read.isChecked(),
        )

    def set_settings(self, settings: ChatSettings | dict[str, Any]) -> None:
        """Show a conversation's settings (no `changed` signal)."""
        s = settings if isinstance(settings, ChatSettings) else ChatSettings.from_stored(settings)
        self._loading = True
        try:
            d = s.sampling.apply(self.defaults)
            self.system_prompt.setPlainText(s.system_prompt)
            self.temperature.setValue(d.temperature)
            self.top_p.setValue(d.top_p)
            self.top_k.setValue(d.top_k)
            self.min_p.setValue(d.min_p)
            self.repeat_penalty.setValue(d.repeat_penalty)
            self.max_tokens.setValue(d.max_tokens)
            self.seed.setValue(-1 if d.seed is None else d.seed)
            self.policy.setCurrentIndex(max(self.policy.findData(s.context_policy), 0))
            self._schema = s.schema
            self.structured.setPlainText(
                json.dumps(self._schema, indent=2) if self._schema is not None else ""
            )
            self._show_schema_problem(None)
            self._tools_off = list(s.tools_off)
            self.tool_rounds.setValue(s.tool_rounds)
            self.refresh_tools()
            self._collections_on = list(s.collections)
            self._reranker = s.docs_reranker
            self.docs_k.setValue(s.docs_k)
            self.docs_budget.setValue(s.docs_budget)
            self.auto_read.setChecked(s.auto_read)
            self.refresh_collections()
        finally:
            self._loading = False

    # -- structured output -----------------------------------------------------------------

    @property
    def schema(self) -> dict[str, Any] | None:
        """The schema in effect: the last one entered that passed the check."""
        return self._schema

    def _check_schema(self) -> None:
        if self._loading:
            return
        text = self.structured.toPlainText().strip()
        schema, problem = schema_problem(text)
        self._show_schema_problem(problem)
        if problem is None:
            self._schema = schema
            self._emit()

    def _show_schema_problem(self, problem: str | None) -> None:
        if problem is not None:
            kept = (
                "the chat keeps its previous schema"
                if self._schema is not None
                else "the chat keeps free text"
            )
            self.structured_error.setText(f"Not saved: {problem} ({kept})")
        self.structured_error.setVisible(problem is not None)

    def _emit(self) -> None:
        if not self._loading:
            self.changed.emit(self.settings())

    # -- presets ---------------------------------------------------------------------------

    def refresh_presets(self) -> None:
        current = self.presets.currentText()
        self.presets.clear()
        self.presets.addItems(list(self.store.presets()))
        self.presets.setCurrentText(current)
        self.apply_preset_button.setEnabled(self.presets.count() > 0)

    def save_preset(self, name: str) -> None:
        name = " ".join(name.split())
        if name:
            self.store.save_preset(name, self.settings())
            self.refresh_presets()
            self.presets.setCurrentText(name)

    def apply_preset(self, name: str) -> None:
        preset = self.store.presets().get(name)
        if preset is not None:
            self.set_settings(preset)
            self.changed.emit(self.settings())

    def _ask_preset_name(self) -> None:
        name, ok = QInputDialog.getText(self, "Save preset", "Preset name:")
        if ok:
            self.save_preset(name)


def schema_problem(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """(schema, None) for text that is empty (no schema) or a usable JSON schema; (None,
    one-line reason) otherwise. Never raises: what the user pasted is not our bug."""
    if not text:
        return None, None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not JSON: {e.msg} (line {e.lineno}, column {e.colno})"
    except RecursionError:
        return None, "not JSON: nested too deeply"
    if not isinstance(schema, dict):
        return None, "a schema must be a JSON object ({...})"
    try:
        constraints.json_schema(schema)
    except GrammarError as e:
        return None, str(e).splitlines()[0] if str(e) else "the schema cannot be used"
    except Exception as e:  # llguidance on something it did not expect: still one line
        first = str(e).strip().splitlines()
        return None, f"the schema cannot be used: {first[0] if first else type(e).__name__}"
    return schema, None


__all__ = [
    "NO_COLLECTIONS",
    "POLICIES",
    "ChatSettingsPanel",
    "schema_problem",
]
