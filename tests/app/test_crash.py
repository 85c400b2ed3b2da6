"""The crash handler and the rotating log: real files, real threads, a real dialog."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import crash


@pytest.fixture
def file_logging(tmp_path: Path) -> Iterator[Path]:
    handler = crash.setup_logging(tmp_path / "logs", max_bytes=2000, backups=2)
    yield tmp_path / "logs"
    logging.getLogger().removeHandler(handler)
    handler.close()


def boom() -> None:
    raise ValueError("the model file vanished")


def test_uncaught_exception_is_logged_with_traceback_and_notified(file_logging: Path) -> None:
    seen: list[tuple[str, Path]] = []
    handler = crash.CrashHandler(
        file_logging / crash.LOG_NAME, lambda m, p: seen.append((m, p))
    ).install()
    try:
        try:
            boom()
        except ValueError:
            sys.excepthook(*sys.exc_info())  # what the interpreter does with an uncaught one
    finally:
        handler.uninstall()
    text = (file_logging / crash.LOG_NAME).read_text()
    assert "uncaught exception" in text
    assert "in boom" in text and "ValueError: the model file vanished" in text
    [(message, path)] = seen
    assert path == file_logging / crash.LOG_NAME
    assert "ValueError: the model file vanished" in message
    assert str(file_logging / crash.LOG_NAME) in message
    assert sys.excepthook is not handler.handle


def test_exception_in_a_thread_reaches_the_handler(file_logging: Path) -> None:
    seen: list[str] = []
    handler = crash.CrashHandler(
        file_logging / crash.LOG_NAME, lambda m, p: seen.append(m)
    ).install()
    try:
        t = threading.Thread(target=boom, name="worker")
        t.start()
        t.join()
    finally:
        handler.uninstall()
    assert len(seen) == 1 and "the model file vanished" in seen[0]
    assert "in boom" in (file_logging / crash.LOG_NAME).read_text()


def test_a_failing_notifier_does_not_hide_the_error(file_logging: Path) -> None:
    def broken(_m: str, _p: Path) -> None:
        raise RuntimeError("no display")

    handler = crash.CrashHandler(file_logging / crash.LOG_NAME, broken)
    try:
        boom()
    except ValueError:
        handler.handle(*sys.exc_info())  # type: ignore[arg-type]
    text = (file_logging / crash.LOG_NAME).read_text()
    assert "the model file vanished" in text and "could not show the crash dialog" in text


def test_log_rotates_and_keeps_a_bounded_number_of_files(file_logging: Path) -> None:
    log = logging.getLogger("candlewick.test")
    for i in range(200):
        log.warning("line %d %s", i, "x" * 40)
    files = sorted(p.name for p in file_logging.iterdir())
    assert files == ["candlewick.log", "candlewick.log.1", "candlewick.log.2"]
    assert all((file_logging / f).stat().st_size <= 2000 for f in files)
    assert "line 199" in (file_logging / "candlewick.log").read_text()


def test_file_gets_info_while_the_terminal_keeps_its_level(tmp_path: Path) -> None:
    root = logging.getLogger()
    stream = logging.StreamHandler()
    old_level = root.level
    root.addHandler(stream)
    root.setLevel(logging.WARNING)
    handler = crash.setup_logging(tmp_path)
    try:
        logging.getLogger("candlewick.test").info("loaded a model")
        assert "loaded a model" in (tmp_path / crash.LOG_NAME).read_text()
        assert stream.level == logging.WARNING
    finally:
        root.removeHandler(handler)
        root.removeHandler(stream)
        handler.close()
        root.setLevel(old_level)


def test_stderr_notice_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    crash.stderr_notify(
        crash.crash_message(ValueError("bad"), tmp_path / "c.log"), tmp_path / "c.log"
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "ValueError: bad" in err and str(tmp_path / "c.log") in err


@pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")
def test_dialog_opens_on_the_gui_thread_for_a_worker_crash(
    qtbot: object, qapp: object, file_logging: Path
) -> None:
    from PySide6.QtWidgets import QMessageBox

    notify = crash.qt_notify()
    handler = crash.CrashHandler(file_logging / crash.LOG_NAME, notify).install()
    try:
        t = threading.Thread(target=boom, name="engine")
        t.start()
        t.join()
        boxes: list[QMessageBox] = notify.boxes  # type: ignore[attr-defined]
        qtbot.waitUntil(lambda: len(boxes) == 1)  # type: ignore[attr-defined]
        box = boxes[0]
        assert box.thread() is qapp.thread()  # type: ignore[attr-defined]
        assert str(file_logging / crash.LOG_NAME) in box.text()
        assert "Open log folder" in [b.text() for b in box.buttons()]
        box.done(0)
        qtbot.waitUntil(lambda: not boxes)  # type: ignore[attr-defined]
    finally:
        handler.uninstall()
