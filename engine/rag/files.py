"""Walking a collection's folders: the files to index, and those passed over with a reason.

`walk` never raises for what it finds on disk: a folder that cannot be listed, disappears
mid-walk or is reached again through a symlink becomes a `Skipped` with a one-line reason,
so one bad folder never stops the indexing of the rest. Folders are tracked by
(st_dev, st_ino), which catches symlink loops and bind mounts that paths alone would not.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.rag.extract import supported

MAX_FILE_BYTES = 50 * 1024 * 1024

# Folders of tools and caches: never documents, and often huge. Skipped without a word, like
# every hidden (dot) folder or file.
IGNORED_DIRS = frozenset(
    {"node_modules", "__pycache__", "venv", "site-packages", "__MACOSX", "$RECYCLE.BIN"}
)


@dataclass(frozen=True)
class Found:
    """A file to consider: regular, supported and within the size limit."""

    path: Path  # absolute, resolved
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Skipped:
    """A file or folder passed over, with a one-line reason for the user."""

    path: Path
    reason: str


def format_size(n: int) -> str:
    """A byte count the way a user reads it: "2.0 GB", "50 MB", "512 bytes"."""
    if n < 1024:
        return f"{n} bytes"
    value = float(n)
    for unit in ("KB", "MB", "GB", "TB"):
        value /= 1024
        if value < 1024 or unit == "TB":
            break
    return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"


def _os_reason(e: OSError) -> str:
    if isinstance(e, PermissionError):
        return "permission denied"
    if isinstance(e, FileNotFoundError):
        return "disappeared"
    return (e.strerror or type(e).__name__).lower()


def _ignored(name: str) -> bool:
    return name.startswith(".") or name in IGNORED_DIRS


class _Walker:
    """One walk's memory: the folders and files already reached, by device and inode."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.dirs: set[tuple[int, int]] = set()
        self.files: set[tuple[int, int]] = set()

    def root(self, root: Path) -> Iterator[Found | Skipped]:
        path = Path(os.path.abspath(root))
        try:
            st = path.stat()
        except FileNotFoundError:
            yield Skipped(path, "not found")
            return
        except RuntimeError:  # Path.stat on a symlink loop in older Pythons
            yield Skipped(path, "symlink loop")
            return
        except OSError as e:
            yield Skipped(path, "symlink loop" if _is_loop(e) else _os_reason(e))
            return
        if stat.S_ISDIR(st.st_mode):
            yield from self.tree(path.resolve(), st)
        else:
            yield from self.file(path.resolve(), st)

    def tree(self, top: Path, top_st: os.stat_result) -> Iterator[Found | Skipped]:
        if (top_st.st_dev, top_st.st_ino) in self.dirs:
            yield Skipped(top, "folder already included")
            return
        self.dirs.add((top_st.st_dev, top_st.st_ino))
        stack = [top]
        while stack:
            folder = stack.pop()
            subfolders: list[Path] = []
            for entry in self._list(folder):
                if isinstance(entry, Skipped):
                    yield entry
                    continue
                listed, path, st = entry
                if stat.S_ISDIR(st.st_mode):
                    key = (st.st_dev, st.st_ino)
                    if key in self.dirs:
                        # A link to a folder that holds it would be walked forever; one to
                        # any other folder already seen would list its files twice.
                        loop = listed != path and folder.is_relative_to(path)
                        reason = "symlink loop" if loop else "folder already included"
                        yield Skipped(listed, reason)
                    else:
                        self.dirs.add(key)
                        subfolders.append(path)
                else:
                    yield from self.file(path, st)
            # Reversed so the stack pops them in name order.
            stack.extend(reversed(subfolders))

    def _list(self, folder: Path) -> Iterator[Skipped | tuple[Path, Path, os.stat_result]]:
        """The entries of one folder, in name order, each stat'ed through symlinks.

        Each comes as its path in the folder, its resolved path (another one for a symlink)
        and its stat.
        """
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            yield Skipped(folder, "folder disappeared")
            return
        except NotADirectoryError:
            yield Skipped(folder, "folder replaced by a file")
            return
        except OSError as e:
            yield Skipped(folder, _os_reason(e))
            return
        for entry in entries:
            if _ignored(entry.name):
                continue
            path = Path(entry.path)
            try:
                st = os.stat(path)  # follows symlinks
            except FileNotFoundError:
                broken = entry.is_symlink()
                yield Skipped(path, "broken symlink" if broken else "disappeared")
                continue
            except OSError as e:
                yield Skipped(path, "symlink loop" if _is_loop(e) else _os_reason(e))
                continue
            yield path, (path.resolve() if entry.is_symlink() else path), st

    def file(self, path: Path, st: os.stat_result) -> Iterator[Found | Skipped]:
        if not stat.S_ISREG(st.st_mode):
            yield Skipped(path, "not a regular file")
            return
        if not supported(path):
            yield Skipped(path, "not a supported format")
            return
        if st.st_size > self.max_bytes:
            limit = format_size(self.max_bytes)
            yield Skipped(path, f"too large ({format_size(st.st_size)} > {limit} limit)")
            return
        key = (st.st_dev, st.st_ino)
        if key in self.files:
            return  # the same file reached again through a link: listed once
        self.files.add(key)
        yield Found(path, st.st_size, st.st_mtime_ns)


def _is_loop(e: OSError) -> bool:
    return e.errno == errno.ELOOP


def walk(roots: Sequence[Path], *, max_bytes: int = MAX_FILE_BYTES) -> Iterator[Found | Skipped]:
    """Every file under `roots` (folders or single files), each once: Found or Skipped.

    Symlinks to files are followed; a symlink into a folder already visited is not (a loop
    or a second path to the same files). Hidden entries and tool folders are left out
    silently; everything else passed over is reported.
    """
    walker = _Walker(max_bytes)
    for root in roots:
        yield from walker.root(root)
