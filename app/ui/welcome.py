"""What an empty chat shows: which model will answer, a line of help and a few example
prompts. An example fills the composer and gives it the focus rather than sending at once,
so the user can adjust it first (and nothing loads a model by surprise)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QGridLayout, QLabel, QPushButton, QVBoxLayout, QWidget

# (what the button says, what it puts in the message box)
EXAMPLES = (
    (
        "Explain how a lighthouse works",
        "Explain how a lighthouse works, in three short paragraphs.",
    ),
    (
        "Write a palindrome check in Python",
        "Write a Python function that checks whether a string is a palindrome.",
    ),
    (
        "Compare tea and coffee in a table",
        "Compare tea and coffee in a table: caffeine, taste, origin.",
    ),
    ("Name a cosy bookshop by the sea", "Give me five names for a cosy bookshop by the sea."),
)
HELP = (
    "Type a message below and press Enter. Ctrl+K opens the command palette; "
    "Ctrl+N starts a new chat."
)


class WelcomePane(QWidget):
    example_chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("welcome")
        self.setAccessibleName("Welcome")
        self.title = QLabel("Candlewick")
        self.title.setObjectName("welcomeTitle")
        font = QFont(self.title.font())
        font.setPointSizeF(font.pointSizeF() * 1.6)
        font.setBold(True)
        self.title.setFont(font)
        self.title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.model_line = QLabel()
        self.model_line.setObjectName("welcomeModel")
        self.model_line.setAccessibleName("Model")
        self.model_line.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.model_line.setTextFormat(Qt.TextFormat.PlainText)
        self.model_line.setWordWrap(True)
        self.help_line = QLabel(HELP)
        self.help_line.setObjectName("welcomeHelp")
        self.help_line.setWordWrap(True)
        self.help_line.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.help_line.setEnabled(False)  # dimmed, from the palette
        self.example_buttons: list[QPushButton] = []
        grid = QGridLayout()
        grid.setSpacing(8)
        for i, (label, text) in enumerate(EXAMPLES):
            b = QPushButton(label)
            b.setObjectName("examplePrompt")
            b.setAccessibleName(f"Example: {label}")
            b.setToolTip(text)
            # An explicit minimum: a narrow chat clips the words rather than scrolling sideways.
            b.setMinimumSize(60, 40)
            b.clicked.connect(self._chooser(text))
            self.example_buttons.append(b)
            grid.addWidget(b, i // 2, i % 2)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 24, 12, 24)
        lay.addStretch(2)
        lay.addWidget(self.title)
        lay.addWidget(self.model_line)
        lay.addSpacing(6)
        lay.addWidget(self.help_line)
        lay.addSpacing(14)
        lay.addLayout(grid)
        lay.addStretch(3)
        # The welcome never makes the chat column wider than it would be without it: a narrow
        # window folds side panels by the chat's least width.
        for line in (self.help_line, self.model_line):
            line.setMinimumWidth(60)
        # Nor taller: in a short window the examples are cut rather than the window grown.
        self.setMinimumHeight(100)
        self.set_model_name("")

    def _chooser(self, text: str) -> Callable[[], None]:
        # A closure, not a lambda with defaults: PySide would pass `checked` into a default.
        return lambda: self.example_chosen.emit(text)

    def set_model_name(self, name: str) -> None:
        """The model that will answer ('' = none chosen yet)."""
        self.model_line.setText(
            f"Chatting with {name}" if name else "No model selected: choose one in the library"
        )


__all__ = ["EXAMPLES", "HELP", "WelcomePane"]
