"""Logs that survive the session and a crash handler that says where they are.

A desktop app started from a menu has no terminal: an uncaught exception would vanish with it.
`setup_logging` writes a rotating log in the per-OS log folder; `install` routes uncaught
exceptions (main thread, other threads, Qt slots) into that log and shows a dialog naming the
file. Native crashes (a segfault inside llama.cpp) cannot be caught in Python; `faulthandler`
writes their Python stack to `faults.log` next to the log so there is still a trace.
"""

from __future__ import annotations

import faulthandler
import logging
import logging.handlers
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

LOG_NAME = "candlewick.log"
FAULT_NAME = "faults.log"
MAX_BYTES = 1 << 20  # 1 MiB per file, 5 old files kept: bounded, yet a week of normal use
BACKUPS = 5

log = logging.getLogger("candlewick.crash")

Notify = Callable[[str, Path], None]


def setup_logging(
    log_dir: Path, *, level: int = logging.INFO, max_bytes: int = MAX_BYTES, backups: int = BACKUPS
) -> logging.Handler:
    """Attach a rotating file handler to the root logger; returns it (to remove it later)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        log_dir / LOG_NAME, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(level)
    root = logging.getLogger()
    if root.level > level or root.level == logging.NOTSET:
        # The file wants more detail than the terminal: handlers already there (stderr) keep
        # the level they showed before, only the file gets the extra lines.
        for h in root.handlers:
            if h.level == logging.NOTSET:
                h.setLevel(root.level)
        root.setLevel(level)
    root.addHandler(handler)
    return handler


def crash_message(exc: BaseException, log_file: Path) -> str:
    return (
        f"Candlewick hit an unexpected error and may not work correctly:\n\n"
        f"{type(exc).__name__}: {exc}\n\n"
        f"The details were written to:\n{log_file}\n\n"
        "Please include that file when you report the problem."
    )


def stderr_notify(message: str, log_file: Path) -> None:
    first = message.split("\n\n")[1] if "\n\n" in message else message
    print(f"candlewick: internal error: {first} (details in {log_file})", file=sys.stderr)


@dataclass
class CrashHandler:
    """Uncaught exceptions -> the log file + `notify(message, log_file)`.

    `notify` must be safe to call from any thread; `qt_notify` makes one that hops to the GUI
    thread before it shows a dialog.
    """

    log_file: Path
    notify: Notify = stderr_notify
    _fault_file: IO[str] | None = None
    _previous: tuple[Any, Any] | None = None
    _faults_were_on: bool = False

    def handle(
        self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            return
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        log.critical("uncaught exception\n%s", text.rstrip())
        try:
            self.notify(crash_message(exc, self.log_file), self.log_file)
        except Exception:  # a broken dialog must not hide the original error
            log.exception("could not show the crash dialog")

    def _thread_hook(self, args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None:
            self.handle(args.exc_type, args.exc_value, args.exc_traceback)

    def install(self) -> CrashHandler:
        self._previous = (sys.excepthook, threading.excepthook)
        sys.excepthook = self.handle
        threading.excepthook = self._thread_hook
        self._faults_were_on = faulthandler.is_enabled()
        try:
            self._fault_file = (self.log_file.parent / FAULT_NAME).open("a", encoding="utf-8")
            faulthandler.enable(self._fault_file)
        except OSError as e:  # a read-only log folder: keep running without the fault trace
            log.warning("cannot write %s: %s", FAULT_NAME, e)
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            sys.excepthook, threading.excepthook = self._previous
            self._previous = None
        if self._fault_file is not None:
            faulthandler.disable()
            self._fault_file.close()
            self._fault_file = None
            if self._faults_were_on and sys.__stderr__ is not None:
                faulthandler.enable(sys.__stderr__)


def install(log_dir: Path, notify: Notify | None = None) -> CrashHandler:
    """Rotating log + crash handler in one call."""
    setup_logging(log_dir)
    return CrashHandler(log_dir / LOG_NAME, notify or stderr_notify).install()


def install_for_gui() -> CrashHandler | None:
    """What the desktop start-up calls: logs in the per-OS log folder, crashes in a dialog.

    Never stops the app from starting: without a writable log folder it runs unlogged.
    """
    from app.services.paths import AppPaths

    try:
        return install(AppPaths.default().logs, qt_notify())
    except OSError as e:
        print(f"candlewick: warning: no log file ({e})", file=sys.stderr)
        return None


def crash_box(message: str, log_file: Path) -> Any:
    """The dialog: the error in a line, the log file's location, a button to open its folder."""
    from PySide6.QtCore import Qt, QUrl
    from PySide6.QtGui import QDesktopServices
    from PySide6.QtWidgets import QMessageBox

    box = QMessageBox(QMessageBox.Icon.Critical, "Candlewick: unexpected error", message)
    box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # copy the path
    open_button = box.addButton("Open log folder", QMessageBox.ButtonRole.ActionRole)
    box.addButton(QMessageBox.StandardButton.Close)

    def open_folder() -> None:
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(log_file.parent)))

    open_button.clicked.connect(open_folder)
    return box


def qt_notify(parent: Any = None) -> Notify:
    """A notify that shows `crash_box` on the GUI thread, from whichever thread crashed.

    Falls back to stderr when no QApplication exists (the crash came before or after Qt).
    """
    from PySide6.QtCore import QObject, Signal
    from PySide6.QtWidgets import QApplication

    class _Bridge(QObject):
        crashed = Signal(str, str)

    bridge = _Bridge(parent)
    boxes: list[Any] = []  # keep open dialogs alive until the user closes them

    def show(message: str, log_file: str) -> None:
        box = crash_box(message, Path(log_file))
        boxes.append(box)
        box.finished.connect(lambda _r: boxes.remove(box))
        box.open()

    # Queued: the signal may be emitted from a worker thread; the box opens on the GUI thread.
    bridge.crashed.connect(show)

    def notify(message: str, log_file: Path) -> None:
        if QApplication.instance() is None:
            stderr_notify(message, log_file)
            return
        bridge.crashed.emit(message, str(log_file))

    notify.bridge = bridge  # type: ignore[attr-defined]  # keeps the QObject alive
    notify.boxes = boxes  # type: ignore[attr-defined]  # tests look at the open dialogs
    return notify
