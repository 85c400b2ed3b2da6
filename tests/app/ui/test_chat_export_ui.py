"""Exporting one chat: from the Chats list's context menu and from the chat's Export button,
the file holds that chat alone, its system prompt and the mark of an answer the user stopped;
a write that fails is one line for the user and leaves no half-written file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QFileDialog, QMenu
from pytestqt.qtbot import QtBot

from app.services.chat_store import ChatStore
from app.ui.chat_model import ChatModel
from app.ui.chat_view import ChatView
from app.ui.conversation import Conversation, Message
from app.ui.conversation_list import ConversationList, export_file_name

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    s = ChatStore(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def stopped_chat(store: ChatStore) -> int:
    c = store.create_conversation(
        "Lighthouse story", settings={"system_prompt": "You write short stories."}
    )
    store.add_message(c.id, "user", "Write a 200-word story about a lighthouse.")
    store.add_message(
        c.id,
        "assistant",
        "The keeper climbed the stairs and",
        stats={"gen_tokens": 7, "gen_tps": 20.0, "stop_reason": "cancelled"},
    )
    other = store.create_conversation("Bread")
    store.add_message(other.id, "user", "Best bread recipe?")
    return c.id


def save_to(monkeypatch: pytest.MonkeyPatch, path: Path) -> list[str]:
    """The file dialog answers `path`; returns the names it suggested."""
    asked: list[str] = []

    def answer(_parent: Any, _caption: str, suggested: str, _filter: str) -> tuple[str, str]:
        asked.append(suggested)
        return str(path), ""

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(answer))
    return asked


def trigger(menu: QMenu, text: str) -> None:
    (action,) = [a for a in menu.actions() if a.text() == text]
    action.trigger()


def record(signal: Any) -> list[str]:
    got: list[str] = []
    signal.connect(got.append)
    return got


def test_export_one_chat_from_the_context_menu(
    qtbot: QtBot, store: ChatStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cid = stopped_chat(store)
    cl = ConversationList(store)
    qtbot.addWidget(cl)
    notices, errors = record(cl.notice), record(cl.error)

    asked = save_to(monkeypatch, tmp_path / "story.md")
    trigger(cl.menu_for(cid), "Export as Markdown…")
    md = (tmp_path / "story.md").read_text(encoding="utf-8")
    assert asked == ["Lighthouse story.md"]
    assert md.startswith("# Lighthouse story\n") and "Bread" not in md
    assert "> System prompt: You write short stories." in md
    assert "**Assistant** (stopped by the user):\n\nThe keeper climbed the stairs and" in md

    save_to(monkeypatch, tmp_path / "story.json")
    trigger(cl.menu_for(cid), "Export as JSON…")
    data = json.loads((tmp_path / "story.json").read_text(encoding="utf-8"))
    (conv,) = data["conversations"]
    assert conv["id"] == cid and conv["settings"]["system_prompt"] == "You write short stories."
    assert [m["ended"] for m in conv["messages"]] == [None, "stopped"]
    assert errors == [] and len(notices) == 2
    assert notices[1] == f"Exported “Lighthouse story” to {tmp_path / 'story.json'}"


def test_a_cancelled_dialog_writes_nothing(
    qtbot: QtBot, store: ChatStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cid = stopped_chat(store)
    cl = ConversationList(store)
    qtbot.addWidget(cl)
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *_args: ("", "")))
    notices, errors = record(cl.notice), record(cl.error)
    before = sorted(os.listdir(tmp_path))
    assert cl.export(cid, "md") is None
    assert notices == errors == [] and sorted(os.listdir(tmp_path)) == before


def test_a_failed_export_is_one_line_and_leaves_no_partial_file(
    qtbot: QtBot, store: ChatStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cid = stopped_chat(store)
    cl = ConversationList(store)
    qtbot.addWidget(cl)
    errors = record(cl.error)

    missing = tmp_path / "no such folder" / "story.md"
    save_to(monkeypatch, missing)
    trigger(cl.menu_for(cid), "Export as Markdown…")
    assert errors == [f"Could not export to {missing}: No such file or directory"]
    assert not missing.parent.exists()

    # The disk fills up while the file is written: yesterday's export stays as it was, and
    # no temporary file is left beside it.
    out = tmp_path / "exports"
    out.mkdir()
    (out / "story.md").write_text("yesterday's export", encoding="utf-8")

    def disk_full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)  # the flush to the disk, before the rename
    save_to(monkeypatch, out / "story.md")
    trigger(cl.menu_for(cid), "Export as Markdown…")
    assert errors[1:] == [f"Could not export to {out / 'story.md'}: No space left on device"]
    assert all("\n" not in e for e in errors)
    assert os.listdir(out) == ["story.md"]
    assert (out / "story.md").read_text(encoding="utf-8") == "yesterday's export"


def test_the_chat_views_export_button_exports_the_chat_on_screen(
    qtbot: QtBot, store: ChatStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cid = stopped_chat(store)
    cl = ConversationList(store)
    model = ChatModel()
    view = ChatView(model)
    for w in (cl, view):
        qtbot.addWidget(w)
    view.show()
    # A new chat, not yet stored, has nothing to export.
    assert not view.export_button.isVisible() and not view.header.isVisible()
    model.set_conversation(Conversation([Message("user", "Write a 200-word story")], store_id=cid))
    assert view.export_button.isVisible()
    requests: list[tuple[int, str]] = []
    view.export_requested.connect(lambda c, fmt: requests.append((c, fmt)))
    view.export_requested.connect(cl.export)  # as the window connects them

    save_to(monkeypatch, tmp_path / "on-screen.json")
    trigger(view.export_menu, "Export as JSON…")
    assert requests == [(cid, "json")]
    data = json.loads((tmp_path / "on-screen.json").read_text(encoding="utf-8"))
    assert [c["title"] for c in data["conversations"]] == ["Lighthouse story"]


def test_export_file_names_come_from_the_title() -> None:
    assert export_file_name("Write a 200-word story…", "md") == "Write a 200-word story.md"
    assert export_file_name('a/b: "c"?', "json") == "a b c.json"
    assert export_file_name("...", "md") == "chat.md"
