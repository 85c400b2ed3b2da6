"""Write a file whole or not at all: a temporary file beside the target, flushed to the disk,
then renamed over it (`os.replace` is atomic within one file system). On any failure the
temporary file is removed and the error is raised as it came; the target stays as it was.
The engine's saved states and results use it, and so does the app (`app.services.atomic_write`)."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(path: Path | str, *, mode: int = 0o666) -> Iterator[BinaryIO]:
    """A binary file to write `path`'s new content into; renamed into place when the block
    ends without an error. `mode`: its permissions from its creation (0o600 for a secret),
    less the umask (os.open, where mkstemp would always give 0600)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            # On the disk before the rename: a crash then leaves the old file or the new one.
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_bytes_atomic(path: Path | str, data: bytes, *, mode: int = 0o666) -> None:
    """`data` in `path`, whole or not at all."""
    with atomic_file(path, mode=mode) as f:
        f.write(data)


def write_text_atomic(
    path: Path | str, text: str, *, encoding: str = "utf-8", mode: int = 0o666
) -> None:
    """`text` in `path`, whole or not at all."""
    write_bytes_atomic(path, text.encode(encoding), mode=mode)


__all__ = ["atomic_file", "write_bytes_atomic", "write_text_atomic"]
