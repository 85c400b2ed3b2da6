"""Write a file whole or not at all: a file a person exports (a chat) never stays half-written
under its real name, and a file it replaces stays as it was when the write fails."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def write_text_atomic(
    path: Path | str, text: str, *, encoding: str = "utf-8", mode: int = 0o666
) -> None:
    """Write `text` to a temporary file in `path`'s folder, flush it to the disk, then rename
    it over `path` (`os.replace` is atomic within one file system). On any failure the
    temporary file is removed and the error (an `OSError` for a full disk, a missing folder,
    no permission) is raised as it came. `mode`: the file's permissions from its creation
    (0o600 for a secret), less the umask."""
    write_bytes_atomic(path, text.encode(encoding), mode=mode)


def write_bytes_atomic(path: Path | str, data: bytes, *, mode: int = 0o666) -> None:
    """`write_text_atomic` for bytes."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
    # os.open with 0o666 by default: the umask applies, so the export gets the permissions a
    # plain write would have given it (mkstemp's files are 0600).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            # On the disk before the rename: a crash then leaves the old file or the new one.
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


__all__ = ["write_bytes_atomic", "write_text_atomic"]
