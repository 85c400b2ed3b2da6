"""Images and audio in the chat, apart from the widgets: whether the engine that would answer
reads them, reading a file the user attaches, and where a sent attachment's bytes are kept.

An attachment is checked when it is attached, so a problem shows before anything is sent
and nothing typed is lost: a kind the model cannot read (a model loaded without a projector,
or with one for the other modality), a file that is not an image or a WAV, too big, or that
does not decode (`MediaError`, in its one line).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from app.services.attachments import (
    MAX_BYTES,
    Attachment,
    AttachmentError,
    NewAttachment,
    kind_of,
    sha256_of,
)
from app.services.chat_store import ChatStore, ChatStoreError
from engine.errors import EngineError
from engine.media.audio import decode_wav
from engine.media.images import decode_image
from engine.model.projector_file import check_projector

WORDS = {"image": "images", "audio": "audio"}
ACCEPTED = "Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp);;WAV audio (*.wav)"


def refusal(kind: str, reads: Collection[str]) -> str | None:
    """Why a model that reads `reads` ("image", "audio") cannot take a `kind` attachment."""
    if kind in reads:
        return None
    what = WORDS.get(kind, kind)
    if not reads:
        return f"This model reads text only: load it with its projector (mmproj) to send {what}"
    other = " and ".join(WORDS[k] for k in sorted(reads) if k in WORDS)
    return f"This model's projector reads {other} only: it cannot take {what}"


def projector_reads(mmproj: str | None) -> frozenset[str]:
    """What a model loaded with the projector `mmproj` will read (nothing without one)."""
    if not mmproj:
        return frozenset()
    try:
        p = check_projector(mmproj)
    except EngineError:
        return frozenset()
    return frozenset(k for k, has in (("image", p.vision), ("audio", p.audio)) if has)


# Why an attachment of a kind ("image", "audio") cannot be sent now (None: it can).
KindCheck = Callable[[str], str | None]


def read_attachment(
    name: str, data: bytes, audio_rate: int = 0, check: KindCheck | None = None
) -> NewAttachment:
    """A file the user attached, checked (its kind by `check` first, then that it decodes):
    AttachmentError or MediaError, one line each."""
    kind = kind_of(name, data)
    if kind is None:
        raise AttachmentError(
            f"{name} is neither an image (PNG, JPEG, WebP, GIF, BMP) nor WAV audio"
        )
    why = check(kind) if check is not None else None
    if why is not None:
        raise AttachmentError(why)
    if len(data) > MAX_BYTES:
        raise AttachmentError(f"{name} is over {MAX_BYTES >> 20} MB, the most a chat takes")
    if kind == "image":
        decode_image(data, name)
    else:
        decode_wav(data, audio_rate or 16000, name)
    return NewAttachment(name, kind, data)


def read_file(path: Path, audio_rate: int = 0, check: KindCheck | None = None) -> NewAttachment:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise AttachmentError(f"{path.name} cannot be read: {e.strerror}") from None
    return read_attachment(path.name, data, audio_rate, check)


class SentMedia:
    """The bytes of the chat's sent attachments: the store's files, or (a chat with no
    store) held here for as long as the window is open."""

    def __init__(self) -> None:
        self._held: dict[str, bytes] = {}

    def keep(self, store: ChatStore | None, new: Sequence[NewAttachment]) -> list[Attachment]:
        """Keep the files of a message about to be sent (ChatStoreError: none is kept
        for the message, and it is not sent)."""
        if store is None:
            out = []
            for n in new:
                sha = sha256_of(n.data)
                self._held[sha] = n.data
                out.append(Attachment(sha, n.name, n.kind))
            return out
        return [store.save_attachment(n.data, n.name, n.kind) for n in new]

    def data(self, store: ChatStore | None, a: Attachment) -> bytes | None:
        """An attachment's bytes (None: its file is gone)."""
        held = self._held.get(a.sha256)
        if held is not None or store is None:
            return held
        try:
            return store.attachment_data(a)
        except ChatStoreError:
            return None


__all__ = ["ACCEPTED", "SentMedia", "projector_reads", "read_attachment", "read_file", "refusal"]
