"""Asking before quitting stops work the user started (the Local server).

The question is a plain function so that tests can answer it without a modal dialog.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtWidgets import QMessageBox, QWidget

# What would be lost by quitting now, in a sentence ('' = nothing).
QuitWarning = Callable[[], str]
# Asks the user with those sentences; True = quit anyway.
QuitQuestion = Callable[[QWidget, Sequence[str]], bool]


def ask_with_message_box(parent: QWidget, warnings: Sequence[str]) -> bool:
    box = QMessageBox(
        QMessageBox.Icon.Question, "Quit Candlewick?", "\n\n".join(warnings), parent=parent
    )
    quit_button = box.addButton("Quit", QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    return box.clickedButton() is quit_button


def may_quit(parent: QWidget, checks: Sequence[QuitWarning], ask: QuitQuestion) -> bool:
    """Whether to quit: yes when nothing would be lost, else what the user answers."""
    warnings = [w for w in (check() for check in checks) if w]
    return not warnings or ask(parent, warnings)


__all__ = ["QuitQuestion", "QuitWarning", "ask_with_message_box", "may_quit"]
