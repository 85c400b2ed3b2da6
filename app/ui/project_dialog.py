"""The project dialog: a project's name, the system prompt its new chats start with, and the
document collections they are grounded in. The same dialog creates and edits a project."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QWidget,
)

NO_COLLECTIONS = "No collections yet — add one in the Documents tab"


class ProjectDialog(QDialog):
    def __init__(
        self,
        collections: Sequence[str],
        parent: QWidget | None = None,
        *,
        name: str = "",
        system_prompt: str = "",
        ticked: Sequence[str] = (),
    ) -> None:
        """`collections`: those of the documents index; `ticked`: the project's (one the
        index no longer has stays listed, marked, so it can be unticked)."""
        super().__init__(parent)
        self.setWindowTitle("Edit project" if name else "New project")
        self.name = QLineEdit(name)
        self.name.setPlaceholderText("Project name")
        self.name.setAccessibleName("Project name")
        self.system_prompt = QPlainTextEdit(system_prompt)
        self.system_prompt.setAccessibleName("Project system prompt")
        self.system_prompt.setPlaceholderText("What every new chat in this project starts with")
        self.system_prompt.setTabChangesFocus(True)
        self.collections = QListWidget()
        self.collections.setAccessibleName("Project collections")
        self.collections.setMaximumHeight(110)
        names = list(collections)
        for n in [*names, *(t for t in ticked if t not in names)]:
            item = QListWidgetItem(n if n in names else f"{n} (removed)")
            item.setData(Qt.ItemDataRole.UserRole, n)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if n in ticked else Qt.CheckState.Unchecked)
            self.collections.addItem(item)
        self.no_collections = QLabel(NO_COLLECTIONS)
        self.no_collections.setWordWrap(True)
        self.no_collections.setEnabled(False)
        has = self.collections.count() > 0
        self.collections.setVisible(has)
        self.no_collections.setVisible(not has)
        note = QLabel("New chats in the project start with these; chats already in it keep theirs.")
        note.setWordWrap(True)
        note.setEnabled(False)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("Name:", self.name)
        form.addRow("System prompt:", self.system_prompt)
        form.addRow("Documents:", self.collections)
        form.addRow("", self.no_collections)
        form.addRow(note)
        form.addRow(self.buttons)
        self.name.textChanged.connect(self._check)
        self._check()
        self.resize(440, 360)

    def _check(self) -> None:
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        ok.setEnabled(bool(self.name.text().strip()))

    def ticked(self) -> list[str]:
        out = []
        for i in range(self.collections.count()):
            item = self.collections.item(i)
            if item.checkState() == Qt.CheckState.Checked:
                out.append(str(item.data(Qt.ItemDataRole.UserRole)))
        return out

    def values(self) -> tuple[str, str, list[str]]:
        """(name, system prompt, collections) as entered."""
        return self.name.text().strip(), self.system_prompt.toPlainText().strip(), self.ticked()
