"""The hash a downloaded blob is checked against, computed while its bytes arrive.

LFS files are named by their SHA-256; small files kept in git itself by their git blob SHA-1
(`sha1(b"blob <size>\\0" + bytes)`).
"""

from __future__ import annotations

import hashlib
import queue
import threading
from pathlib import Path
from typing import Protocol


class Hasher(Protocol):
    """What hashlib's hash objects offer and a download needs."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def resume_hasher(path: Path, have: int, *, git_sha1: bool, size: int) -> Hasher:
    """A hasher fed with the first `have` bytes of `path`: a resumed download is hashed once."""
    h: Hasher = hashlib.sha1(b"blob %d\0" % size) if git_sha1 else hashlib.sha256()
    if have:
        with open(path, "rb") as f:
            left = have
            while left > 0:
                block = f.read(min(left, 1 << 20))
                if not block:
                    break
                h.update(block)
                left -= len(block)
    return h


class BackgroundHasher:
    """Hashes chunks on its own thread while the next ones arrive: hashlib releases the GIL on
    big buffers, so verifying costs almost no download time (bounded queue: little memory)."""

    def __init__(self, hasher: Hasher) -> None:
        self._hasher = hasher
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=16)
        self._thread = threading.Thread(target=self._run, name="download-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            self._hasher.update(chunk)

    def update(self, chunk: bytes) -> None:
        self._queue.put(chunk)

    def finish(self) -> Hasher:
        """Wait until every chunk given is hashed; the hasher, to go on or to read."""
        self._queue.put(None)
        self._thread.join()
        return self._hasher


__all__ = ["BackgroundHasher", "Hasher", "resume_hasher"]
