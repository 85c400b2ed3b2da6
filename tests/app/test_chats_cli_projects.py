"""`candlewick chats list` names each chat's project (JSON: null for a loose chat)."""

from __future__ import annotations

import json

from app.services.chat_store import ChatStore, default_store_path
from app.services.paths import AppPaths
from tests.app.test_chats_cli import cli


def test_list_shows_the_project() -> None:
    with ChatStore(default_store_path(AppPaths.default().ensure().data)) as s:
        p = s.create_project("Thesis")
        inside = s.create_in_project(p.id, title="Outline")
        loose = s.create_conversation("Loose")
    listed = json.loads(cli("list", "--json").stdout)
    assert {c["id"]: c["project"] for c in listed} == {inside.id: "Thesis", loose.id: None}
    text = cli("list").stdout.splitlines()
    assert any(line.endswith("Outline  [Thesis]") for line in text)
    assert any(line.endswith("msgs  Loose") for line in text)
