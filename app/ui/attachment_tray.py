"""Thumbnails of attached images and audio: the composer's tray (each with a remove button, before
sending) and a sent message's strip (the files as they were sent)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QWidget

from app.services.attachments import Attachment, NewAttachment

TRAY_SIZE = 56  # pixels, the longer side of a thumbnail in the composer
SENT_SIZE = 96  # in a sent message

# A sent attachment's bytes (None: its file is gone).
AttachmentReader = Callable[[Attachment], bytes | None]


class Thumb(QFrame):
    """One attachment: a picture scaled down, or a note for a sound (and, in the composer,
    a button that removes it)."""

    remove_requested = Signal(object)  # self

    def __init__(
        self,
        name: str,
        kind: str,
        data: bytes | None,
        size: int,
        *,
        removable: bool,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.name = name
        self.kind = kind
        self.setObjectName("attachmentThumb")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setToolTip(name)
        self.setAccessibleName(f"Attached {kind}: {name}")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.setSpacing(2)
        self.picture = QLabel()
        self.picture.setAlignment(Qt.AlignmentFlag.AlignCenter)
        pixmap = QPixmap()
        if kind == "image" and data is not None and pixmap.loadFromData(data):
            self.picture.setPixmap(
                pixmap.scaled(
                    size,
                    size,
                    Qt.AspectRatioMode.KeepAspectRatio,
                    Qt.TransformationMode.SmoothTransformation,
                )
            )
        else:
            gone = data is None
            self.picture.setText(f"{'♪ ' if kind == 'audio' else ''}{name}" + (" (missing)" * gone))
            self.picture.setWordWrap(True)
            self.picture.setMaximumWidth(size * 2)
        lay.addWidget(self.picture)
        self.remove_button: QToolButton | None = None
        if removable:
            b = self.remove_button = QToolButton()
            b.setText("\u00d7")  # a multiplication sign: the usual close mark
            b.setAutoRaise(True)
            b.setToolTip(f"Remove {name}")
            b.setAccessibleName(f"Remove {name}")
            b.clicked.connect(lambda: self.remove_requested.emit(self))
            lay.addWidget(b, 0, Qt.AlignmentFlag.AlignTop)

    @property
    def has_picture(self) -> bool:
        pm = self.picture.pixmap()
        return pm is not None and not pm.isNull()


class _Row(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._lay = QHBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.setSpacing(4)
        self._lay.addStretch(1)
        self.thumbs: list[Thumb] = []

    def _add(self, thumb: Thumb) -> None:
        self._lay.insertWidget(len(self.thumbs), thumb)
        self.thumbs.append(thumb)
        self.setVisible(True)

    def _clear(self) -> None:
        for t in self.thumbs:
            self._lay.removeWidget(t)
            t.deleteLater()
        self.thumbs = []
        self.setVisible(False)


class AttachmentTray(_Row):
    """The composer's attachments, in the order they will be sent."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Attachments to send")
        self._items: list[NewAttachment] = []
        self.setVisible(False)

    def items(self) -> list[NewAttachment]:
        return list(self._items)

    def add(self, item: NewAttachment) -> None:
        thumb = Thumb(item.name, item.kind, item.data, TRAY_SIZE, removable=True)
        thumb.remove_requested.connect(self._remove)
        self._items.append(item)
        self._add(thumb)
        self.changed.emit()

    def _remove(self, thumb: Thumb) -> None:
        i = self.thumbs.index(thumb)
        del self._items[i]
        self.thumbs.pop(i)
        self._lay.removeWidget(thumb)
        thumb.deleteLater()
        self.setVisible(bool(self.thumbs))
        self.changed.emit()

    def clear(self) -> None:
        self._items = []
        self._clear()
        self.changed.emit()


class AttachmentStrip(_Row):
    """A sent message's attachments."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Attachments")
        self._shown: list[Attachment] = []
        self.setVisible(False)

    def show_attachments(self, attachments: Sequence[Attachment], read: AttachmentReader) -> None:
        if list(attachments) == self._shown:
            return
        self._clear()
        self._shown = list(attachments)
        for a in attachments:
            self._add(Thumb(a.name, a.kind, read(a), SENT_SIZE, removable=False))


__all__ = ["AttachmentReader", "AttachmentStrip", "AttachmentTray", "Thumb"]
