"""Images and audio attached to chat messages, kept as content-addressed files.

A file is named by the SHA-256 of its bytes (`<folder>/<first two hex digits>/<hash>`) in a
folder beside the chat database, so the same picture sent twice is stored once. A message
refers to its attachments by hash (`Attachment`: hash, the name it was sent under, its kind).

Crash safety: a file is written whole (`write_bytes_atomic`: a temporary name, synced, then
renamed) *before* the message that refers to it is committed. A crash in between leaves a file
no message refers to: nothing shows it (a message lists what it shows), and `sweep` removes it
on the next start once it is older than `ORPHAN_GRACE_S` (a grace period, so that a second
process opening the store never removes a file another is about to refer to). A file is
removed as soon as the last message referring to it is deleted (`ChatStore`).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from app.services.atomic_write import write_bytes_atomic

AttachmentKind = Literal["image", "audio"]
KINDS: tuple[AttachmentKind, ...] = ("image", "audio")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
AUDIO_SUFFIXES = (".wav",)
MAX_BYTES = 64 << 20  # a bigger file is refused when attached
ORPHAN_GRACE_S = 3600.0
_HASH = re.compile(r"^[0-9a-f]{64}$")


class AttachmentError(ValueError):
    """An attachment that cannot be kept or read back; `str()` is one line for the user."""


@dataclass(frozen=True)
class Attachment:
    """What a message keeps of one attached file."""

    sha256: str
    name: str
    kind: AttachmentKind

    def to_dict(self) -> dict[str, str]:
        return {"sha256": self.sha256, "name": self.name, "kind": self.kind}

    @classmethod
    def from_dict(cls, d: Any) -> Attachment:
        """An attachment record (a message's, an export's); AttachmentError for a bad one."""
        if not isinstance(d, dict):
            raise AttachmentError("an attachment is not an object")
        sha, name, kind = d.get("sha256"), d.get("name"), d.get("kind")
        if not isinstance(sha, str) or not _HASH.match(sha):
            raise AttachmentError("an attachment needs its SHA-256 (64 hex digits)")
        if kind not in KINDS:
            raise AttachmentError(f"unknown attachment kind {kind!r}")
        return cls(sha, name if isinstance(name, str) and name else sha[:12], kind)


def attachments_of(value: Any) -> list[Attachment]:
    """A message's attachment records as `Attachment`s (AttachmentError for a bad one)."""
    if not value:
        return []
    if not isinstance(value, list):
        raise AttachmentError("attachments must be a list")
    return [Attachment.from_dict(d) for d in value]


def kind_of(name: str, data: bytes = b"") -> AttachmentKind | None:
    """What a file is, by its bytes (a pasted picture has no name) or else its name: an
    image (PNG, JPEG, WebP, GIF, BMP), audio (WAV), or None (not something a chat takes)."""
    head = data[:16]
    if head.startswith((b"\x89PNG", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")) or (
        head[:4] == b"RIFF" and head[8:12] == b"WEBP"
    ):
        return "image"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "audio"
    suffix = Path(name).suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix in AUDIO_SUFFIXES:
        return "audio"
    return None


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class AttachmentFiles:
    """The content-addressed files of one chat store."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, sha256: str) -> Path:
        if not _HASH.match(sha256):
            raise AttachmentError(f"not an attachment hash: {sha256[:70]!r}")
        return self.folder / sha256[:2] / sha256

    def put(self, data: bytes) -> str:
        """Keep `data` (written whole before this returns); its hash. OSError as it came."""
        if len(data) > MAX_BYTES:
            raise AttachmentError(
                f"the file is {len(data) >> 20} MB; the most a chat keeps is {MAX_BYTES >> 20} MB"
            )
        sha = sha256_of(data)
        target = self.path(sha)
        if not target.is_file() or target.stat().st_size != len(data):
            target.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(target, data)
        return sha

    def read(self, sha256: str) -> bytes:
        """The bytes of an attachment; AttachmentError (one line) when missing or changed."""
        try:
            data = self.path(sha256).read_bytes()
        except OSError as e:
            raise AttachmentError(f"the attached file is missing ({e.strerror})") from None
        if sha256_of(data) != sha256:
            raise AttachmentError("the attached file was changed on disk")
        return data

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def remove(self, hashes: Collection[str]) -> None:
        for sha in hashes:
            with contextlib.suppress(OSError, AttachmentError):
                self.path(sha).unlink()
                self.path(sha).parent.rmdir()  # only when it was the last of its folder

    def sweep(self, referenced: Collection[str], older_than_s: float = ORPHAN_GRACE_S) -> int:
        """Remove files no message refers to (and a crashed write's leftovers), older than
        `older_than_s`; how many went."""
        if not self.folder.is_dir():
            return 0
        cutoff = time.time() - older_than_s
        gone = 0
        for f in self.folder.glob("*/*"):
            try:
                if f.name in referenced or f.stat().st_mtime > cutoff:
                    continue
                f.unlink()
                gone += 1
            except OSError:
                continue
        for d in self.folder.glob("*"):
            with contextlib.suppress(OSError):
                d.rmdir()  # empty ones only
        return gone


@dataclass(frozen=True)
class NewAttachment:
    """A file attached in the composer, not sent yet: kept (`ChatStore.save_attachment`)
    when its message is sent."""

    name: str
    kind: AttachmentKind
    data: bytes


__all__ = [
    "Attachment",
    "AttachmentError",
    "AttachmentFiles",
    "AttachmentKind",
    "NewAttachment",
    "attachments_of",
    "kind_of",
]
