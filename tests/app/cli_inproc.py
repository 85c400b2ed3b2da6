"""`candlewick ARGS` run in this process, answered as `subprocess.run` would answer it.

A fresh interpreter costs about a second of imports per call; the fast tier made ~120 of them.
`app.cli.main` is what `python -m app.cli` runs, so the command, its parsing and its one-line
errors are the same; what only a separate process shows (a real exit, a signal, the bundle's
entry point, import laziness) stays tested with subprocesses elsewhere.
"""

from __future__ import annotations

import contextlib
import io
import logging
import subprocess
import sys

from app.cli import main


class _Stdin(io.StringIO):
    """Text standard input that also has `.buffer`, as a terminal's or a pipe's has."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.buffer = io.BytesIO(text.encode())


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`candlewick *args` with `stdin` as its input: exit code, standard output and error."""
    out, err = io.StringIO(), io.StringIO()
    # `main` configures logging to stderr only when nothing did before (pytest did): the
    # warnings a user sees in the terminal are sent to this call's stderr the same way.
    verbose = "--verbose" in args or "-v" in args
    log_to_err = logging.StreamHandler(err)
    log_to_err.setLevel(logging.DEBUG if verbose else logging.WARNING)
    log_to_err.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    saved_stdin = sys.stdin
    sys.stdin = _Stdin(stdin or "")
    root.addHandler(log_to_err)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's usage errors, and --help
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        root.removeHandler(log_to_err)
        sys.stdin = saved_stdin
    return subprocess.CompletedProcess(["candlewick", *args], code, out.getvalue(), err.getvalue())
