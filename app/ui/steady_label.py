"""A one-line label for a figure that changes many times a second (tokens in use, speeds).

A plain `QLabel` asks its layouts for a new geometry on every `setText`, whatever the text; the
request climbs to the window, which lays out and repaints everything around it. Streaming at
110 tokens/s, the chat's context line alone made the whole main window lay itself out 48 times a
second (measured offscreen, 2 EPYC cores), time taken from llama.cpp's two decode threads.

A label whose minimum and maximum sizes are equal does not ask (Qt skips the request for a
fixed-size widget), so this one keeps itself fixed at the largest size its text has needed:
a longer text grows it (one layout), a shorter one leaves the space, and the same text does
nothing at all.
"""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QWidget


class SteadyLabel(QLabel):
    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setText(text)

    def setText(self, text: str) -> None:
        if text == self.text():
            return
        super().setText(text)
        need = self.sizeHint()
        have = self.minimumSize()
        if need.width() > have.width() or need.height() > have.height():
            self.setFixedSize(need.expandedTo(have))

    def clear(self) -> None:
        self.setText("")
