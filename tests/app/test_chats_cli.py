"""`candlewick chats list|export|import` against a real store in a private home."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from app.cli import main
from app.services.chat_store import ChatStore, default_store_path
from app.services.paths import AppPaths
from tests.app.cli_errors import one_line_error
from tests.app.cli_inproc import run_cli


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("chats", *args)


def _seed() -> int:
    with ChatStore(default_store_path(AppPaths.default().ensure().data)) as s:
        c = s.create_conversation()
        s.add_message(c.id, "user", "What is a lighthouse?")
        s.add_message(c.id, "assistant", "A tower with a light.", stats={"gen_tps": 90.0})
        return c.id


def test_list_export_import_round_trip(tmp_path: Path) -> None:
    cid = _seed()
    listed = json.loads(cli("list", "--json").stdout)
    assert [(c["id"], c["title"], c["messages"]) for c in listed] == [
        (cid, "What is a lighthouse?", 2)
    ]
    r = cli("export", str(cid), "--format", "json")
    assert r.returncode == 0, r.stderr
    [conv] = json.loads(r.stdout)
    assert conv["id"] == cid and conv["title"] == "What is a lighthouse?"
    assert [(m["role"], m["content"]) for m in conv["messages"]] == [
        ("user", "What is a lighthouse?"),
        ("assistant", "A tower with a light."),
    ]
    out = tmp_path / "all.json"
    assert cli("export", "--output", str(out)).returncode == 0
    assert cli("import", str(out)).stdout.strip() == "imported 1 conversation"
    listed = json.loads(cli("list", "--json").stdout)
    assert len(listed) == 2 and {c["title"] for c in listed} == {"What is a lighthouse?"}


def test_markdown_export() -> None:
    _seed()
    r = cli("export", "--format", "md")
    assert r.returncode == 0
    assert r.stdout.startswith("# What is a lighthouse?")
    assert "**Assistant**:\n\nA tower with a light." in r.stdout


def test_import_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = cli("import", str(bad))
    assert r.returncode == 2 and "not valid JSON" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli("import", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "file not found" in r.stderr
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps([{"title": "x", "messages": [{"role": "bot", "content": 1}]}]))
    r = cli("import", str(wrong))
    assert r.returncode == 2 and "needs a role and text content" in r.stderr
    r = cli("export", "999")
    assert r.returncode == 2 and "no conversation with id 999" in r.stderr


def test_an_export_that_fails_leaves_the_old_file_and_no_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full disk (ENOSPC as the export is flushed): one line, exit 2, yesterday's export
    as it was, and no `.part` file left beside it."""
    _seed()
    out = tmp_path / "exports"
    out.mkdir()
    target = out / "all.json"
    target.write_text("the export from yesterday", encoding="utf-8")

    def disk_full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    assert main(["chats", "export", "--output", str(target)]) == 2
    assert "No space left on device" in one_line_error(capsys.readouterr().err)
    assert target.read_text(encoding="utf-8") == "the export from yesterday"
    assert os.listdir(out) == ["all.json"]
