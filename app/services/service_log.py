"""The background service's log file: what `candlewick serve --log-file` prints, kept in a file
as well as on its own stderr (the journal, under systemd), so `candlewick service logs` works
on a machine without journald. Qt-free.

The file is bounded: past `MAX_BYTES` at start it is renamed to `NAME.1` (one old file kept).
Each line gets the time it was written; stderr keeps the lines as they are (the journal adds
its own time).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

MAX_BYTES = 4 * 1024 * 1024
POLL_S = 0.25


class TeeStream:
    """A text stream that writes to `primary` and, line by line with a time stamp, to the
    file `log` (flushed per line, so a crash loses no finished line)."""

    def __init__(self, primary: TextIO, log: TextIO, clock: Callable[[], float] = time.time):
        self.primary = primary
        self.log = log
        self._clock = clock
        self._at_line_start = True
        self._lock = threading.Lock()  # serve prints from the loader and the server threads

    def write(self, text: str) -> int:
        with self._lock:
            self.primary.write(text)
            for part in text.splitlines(keepends=True):
                if self._at_line_start:
                    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self._clock()))
                    self.log.write(f"{stamp} ")
                self.log.write(part)
                self._at_line_start = part.endswith("\n")
            self.log.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self.primary.flush()
            self.log.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return self.primary.encoding or "utf-8"

    def fileno(self) -> int:  # faulthandler and subprocesses write to the real stream
        return self.primary.fileno()


def rotate(path: Path, max_bytes: int = MAX_BYTES) -> None:
    """`path` renamed to `path.1` (replacing it) once it has grown past `max_bytes`."""
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_size > max_bytes:
            os.replace(path, path.with_name(path.name + ".1"))


@contextlib.contextmanager
def logging_to(path: Path, max_bytes: int = MAX_BYTES) -> Iterator[None]:
    """stderr written to `path` too while inside: serve's messages, its warnings, and the
    log records of handlers already writing to stderr."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rotate(path, max_bytes)
    with path.open("a", encoding="utf-8") as log:
        original = sys.stderr
        tee = TeeStream(original, log)
        handlers = [
            h
            for h in logging.getLogger().handlers
            if isinstance(h, logging.StreamHandler) and h.stream is original
        ]
        sys.stderr = tee
        for h in handlers:
            h.setStream(tee)
        try:
            yield
        finally:
            for h in handlers:
                h.setStream(original)
            sys.stderr = original


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of `path` (without line ends); [] for a missing file."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in deque(f, maxlen=lines)]
    except FileNotFoundError:
        return []


def follow(
    path: Path, stop: Callable[[], bool] = lambda: False, poll_s: float = POLL_S
) -> Iterator[str]:
    """Lines appended to `path` from now on, as they come (without line ends), until `stop()`
    says so; a rotated or truncated file is read again from its start."""
    f: TextIO | None = None
    inode = -1
    pending = ""
    skip_existing = True  # the tail was printed already: the lines there now are not new
    try:
        while not stop():
            try:
                st = path.stat()
            except FileNotFoundError:
                st = None
            if st is not None and (f is None or st.st_ino != inode or st.st_size < f.tell()):
                if f is not None:
                    f.close()
                f = path.open(encoding="utf-8", errors="replace")
                if skip_existing:
                    f.seek(0, os.SEEK_END)
                inode, pending = st.st_ino, ""
            skip_existing = False
            chunk = f.read() if f is not None else ""
            if not chunk:
                time.sleep(poll_s)
                continue
            pending += chunk
            *done, pending = pending.split("\n")
            yield from done
    finally:
        if f is not None:
            f.close()


__all__ = ["TeeStream", "follow", "logging_to", "rotate", "tail"]
