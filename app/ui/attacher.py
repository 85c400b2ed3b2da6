"""The composer's attachments: the Attach button (a file picker), files dropped on the
input, pictures and file links pasted into it, each checked before it joins the tray.

A file the model cannot take, or that cannot be read, is refused at once with one line
(`refused`, shown in the window): nothing typed is touched, and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QObject, Signal
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog, QPushButton, QWidget

from app.services.attachments import AttachmentError, NewAttachment
from app.ui.attachment_tray import AttachmentTray
from app.ui.chat_media import ACCEPTED, KindCheck, read_attachment, read_file
from engine.errors import EngineError

# Asks for files to attach (the Attach button): the paths chosen, [] when cancelled.
FileChooser = Callable[[QWidget], list[Path]]


def choose_with_dialog(parent: QWidget) -> list[Path]:
    names, _ = QFileDialog.getOpenFileNames(parent, "Attach images or audio", "", ACCEPTED)
    return [Path(n) for n in names]


def png_bytes(image: QImage) -> bytes:
    """A pasted picture as a PNG file's bytes (lossless)."""
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buf, "PNG")  # type: ignore[call-overload]  # the stubs want bytes; Qt a str
    buf.close()
    return bytes(data.data())


class Attacher(QObject):
    refused = Signal(str)  # one line: why a file was not attached

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self._parent = parent
        self.tray = AttachmentTray()
        # Words, not a paperclip glyph: not every desktop has a font that draws one.
        self.button = QPushButton("Attach…")
        self.button.setToolTip("Attach images (PNG, JPEG, WebP, GIF, BMP) or WAV audio")
        self.button.setAccessibleName("Attach files")
        self.button.clicked.connect(self.choose)
        self.check: KindCheck | None = None  # the window sets the controller's
        self.audio_rate: Callable[[], int] = lambda: 0
        self.chooser: FileChooser = choose_with_dialog
        self._pasted = 0

    def items(self) -> list[NewAttachment]:
        return self.tray.items()

    def clear(self) -> None:
        self.tray.clear()

    def choose(self) -> None:
        self.add_paths(self.chooser(self._parent))

    def add_paths(self, paths: Sequence[Path]) -> None:
        for p in paths:
            self._add(self._file_reader(p))

    def _file_reader(self, path: Path) -> Callable[[], NewAttachment]:
        return lambda: read_file(path, self.audio_rate(), self.check)

    def add_image(self, image: QImage) -> None:
        """A picture pasted from the clipboard (it has no file name: "pasted-N.png")."""
        self._pasted += 1
        data = png_bytes(image)
        name = f"pasted-{self._pasted}.png"
        self._add(lambda: read_attachment(name, data, self.audio_rate(), self.check))

    def _add(self, read: Callable[[], NewAttachment]) -> None:
        try:
            item = read()
        except (AttachmentError, EngineError) as e:  # MediaError is an EngineError
            self.refused.emit(str(e))
            return
        self.tray.add(item)


__all__ = ["Attacher", "FileChooser", "png_bytes"]
