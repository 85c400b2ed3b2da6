"""The command line imports only the module of the command it runs (app.cli.COMMANDS): the
others cost about a second of start-up that every `candlewick chats list` would pay."""

from __future__ import annotations

import argparse
import subprocess
import sys

from app.cli import COMMANDS, build_parser, chosen_command


def test_the_named_command_is_found_after_the_top_level_options() -> None:
    assert chosen_command(["chats", "list"]) == "chats"
    assert chosen_command(["--verbose", "-v", "docs", "search", "notes", "run"]) == "docs"
    assert chosen_command(["--help"]) is None
    assert chosen_command([]) is None
    assert chosen_command(["chat", "list"]) is None  # a typo: the whole parser words the error


def test_one_command_is_registered_when_one_is_named() -> None:
    def commands(parser: argparse.ArgumentParser) -> list[str]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return list(sub.choices)

    assert commands(build_parser("chats")) == ["chats"]
    assert sorted(commands(build_parser())) == sorted(COMMANDS)


def test_running_a_command_leaves_the_other_command_modules_unimported() -> None:
    code = (
        "import sys\n"
        "from app.cli import main\n"
        "main(['chats', 'list', '--json'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('app.cli.') and m.endswith('_cmd')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "['app.cli.chats_cmd']"
