"""The service's log file: stderr kept in it line by line, bounded, its tail and new lines."""

from __future__ import annotations

import io
import logging
import re
import sys
from pathlib import Path

import pytest

from app.services.service_log import TeeStream, follow, logging_to, rotate, tail

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "


def test_tee_stamps_each_line_of_the_file_and_leaves_the_stream_as_written() -> None:
    primary, log = io.StringIO(), io.StringIO()
    tee = TeeStream(primary, log, clock=lambda: 0.0)
    tee.write("first li")
    tee.write("ne\nsecond\nthi")
    tee.write("rd\n")
    assert primary.getvalue() == "first line\nsecond\nthird\n"
    lines = log.getvalue().splitlines()
    assert [re.sub(STAMP, "", line) for line in lines] == ["first line", "second", "third"]
    assert all(re.match(STAMP, line) for line in lines)


def test_stderr_and_its_log_handlers_reach_the_file_while_inside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "logs" / "service.log"
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    root.addHandler(handler)
    try:
        with logging_to(path):
            print("candlewick: serving", file=sys.stderr)
            logging.getLogger("candlewick.test").warning("a warning")
        print("after", file=sys.stderr)
    finally:
        root.removeHandler(handler)
    text = path.read_text(encoding="utf-8")
    assert re.search(STAMP + "candlewick: serving\n", text)
    assert re.search(STAMP + "a warning\n", text)
    assert "after" not in text
    assert handler.stream is sys.stderr  # given back
    err = capsys.readouterr().err
    assert "candlewick: serving" in err and "a warning" in err and "after" in err


def test_a_grown_log_is_rotated_once(tmp_path: Path) -> None:
    path = tmp_path / "service.log"
    path.write_text("x" * 100)
    rotate(path, max_bytes=200)
    assert path.exists()
    rotate(path, max_bytes=50)
    assert not path.exists() and (tmp_path / "service.log.1").read_text() == "x" * 100


def test_tail_gives_the_last_lines(tmp_path: Path) -> None:
    path = tmp_path / "service.log"
    path.write_text("".join(f"line {i}\n" for i in range(10)))
    assert tail(path, 3) == ["line 7", "line 8", "line 9"]
    assert tail(tmp_path / "none.log", 3) == []


def test_follow_gives_new_lines_across_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "service.log"
    path.write_text("old line\n")
    steps = 0

    def stop() -> bool:
        # Called before each look at the file: the writes happen between looks.
        nonlocal steps
        steps += 1
        if steps == 2:  # the file is open, at its end
            with path.open("a") as f:
                f.write("new line\npart")
        elif steps == 4:
            with path.open("a") as f:
                f.write("ial\n")
        elif steps == 6:  # rotated: a new file from its start
            rotate(path, max_bytes=0)
            path.write_text("after rotation\n")
        return steps > 8

    assert list(follow(path, stop, poll_s=0)) == ["new line", "partial", "after rotation"]
