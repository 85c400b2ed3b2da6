"""What the command line prints on bad input: exactly one line, `candlewick: error: ...`."""

from __future__ import annotations


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("candlewick: error: "), err
    return lines[0]
