"""The `candlewick` command line. With no arguments it starts the desktop app.

Each sub-command lives in its own module with a `register(subparsers)` function. Every error a
user can cause ends as one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from app.cli.common import USER_ERRORS, CliError
from engine.native.huge_pages import restart_with_huge_pages

# A command's module imports what its handlers need (the server, the hub, the bench, numpy):
# about a second of start-up for all nine. A command line names one, so only its module is
# imported; help and a mistyped command still see them all. (The bundle lists every app.cli
# module as a hidden import, so importing by name works there too.)
COMMANDS = {
    "run": "run_cmd",
    "models": "models_cmd",
    "estimate": "estimate_cmd",
    "chats": "chats_cmd",
    "docs": "docs_cmd",
    "serve": "serve_cmd",
    "service": "service_cmd",
    "bench": "bench_cmd",
    "connections": "connections_cmd",
}


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command an argument list names, when it names a known one. The top-level options
    take no value, so the first argument that is not an option is the command."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `only` one command registered (see COMMANDS)."""
    parser = argparse.ArgumentParser(
        prog="candlewick",
        description="Run large language models on your own machine.",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="log engine details to stderr")
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="check this install without a display: load the bundled model through the "
        "first-load child process, generate a few tokens, refuse broken model files, open the "
        "chat store, open and close the window; exit 0 if all work",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"app.cli.{module}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the process's own entry point, not a caller's list
        restart_with_huge_pages()
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(chosen_command(args_list))
    args = parser.parse_args(args_list)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # llama.cpp's own chatter stays out of the user's terminal unless asked for.
        logging.getLogger("candlewick.llama").setLevel(logging.CRITICAL)
    if args.self_test:
        from app.selftest import run

        return run()
    if args.command is None:
        from app.cli.gui_cmd import start_gui
        from app.crash import install_for_gui

        install_for_gui()  # a rotating log, and a dialog instead of vanishing on a crash
        return start_gui()
    try:
        return int(args.handler(args) or 0)
    except BrokenPipeError:
        # Output piped into `head` and closed: not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except USER_ERRORS as e:
        print(f"candlewick: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("candlewick: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: say so in one line, details only with --verbose
        logging.getLogger("candlewick").debug("internal error", exc_info=True)
        print(
            f"candlewick: internal error: {type(e).__name__}: {e} (run with --verbose for details)",
            file=sys.stderr,
        )
        return 1


__all__ = ["CliError", "main"]
