"""Free space on a disk, and the margin that downloads and imports leave free on it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

# Kept free beyond the file itself so a download or an import never fills the disk to the
# last byte.
DISK_MARGIN = 64 * 1024 * 1024

# Free bytes where a path is (injected so tests can play a full disk).
FreeSpace = Callable[[Path], int]


def free_disk_space(path: Path) -> int:
    """Free bytes on the file system that holds `path` (or its nearest existing parent)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


__all__ = ["DISK_MARGIN", "FreeSpace", "free_disk_space"]
