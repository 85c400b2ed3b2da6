"""Projects in the conversations sidebar (offscreen, a real SQLite store, a fixed clock): the
groups above the loose chats, folding, the dialog, the context menus (new chat in project,
move to project, delete with what becomes of the chats), and search inside projects."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMenu, QMessageBox
from pytestqt.qtbot import QtBot

from app.services.chat_settings import ChatSettings, EngineBinding
from app.services.chat_store import ChatStore
from app.ui.conversation_list import ID_ROLE, PROJECT_ROLE, ConversationList
from app.ui.project_dialog import ProjectDialog

T0 = 1_790_000_000.0
pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    clock = [T0]

    def tick() -> float:
        clock[0] += 60
        return clock[0]

    s = ChatStore(tmp_path / "chats.sqlite3", clock=tick)
    yield s
    s.close()


def make_list(qtbot: QtBot, store: ChatStore) -> ConversationList:
    cl = ConversationList(store, clock=lambda: T0 + 3600, collections=lambda: ["papers", "notes"])
    qtbot.addWidget(cl)
    cl.resize(260, 500)
    return cl


def rows(cl: ConversationList) -> list[str]:
    return [cl.list.item(i).text().split("\n")[0] for i in range(cl.list.count())]


def action(menu: QMenu, text: str) -> None:
    for a in menu.actions():
        if a.text() == text:
            a.trigger()
            return
        sub = a.menu()
        if isinstance(sub, QMenu) and sub.title() == text.split(" ▸ ")[0] and " ▸ " in text:
            action(sub, text.split(" ▸ ", 1)[1])
            return
    raise AssertionError(f"no {text!r} in {[a.text() for a in menu.actions()]}")


def test_projects_are_groups_above_the_loose_chats(qtbot: QtBot, store: ChatStore) -> None:
    work = store.create_project("Work")
    store.create_project("Archive")
    a = store.create_in_project(work.id, title="Budget")
    b = store.create_in_project(work.id, title="Roadmap")
    loose = store.create_conversation("Loose chat")
    store.set_pinned(a.id, True)
    cl = make_list(qtbot, store)
    # Folded: the headers (by name, each with its count), then the loose chats.
    assert rows(cl) == ["▸ Archive  (0)", "▸ Work  (2)", "Chats", "Loose chat"]
    assert cl.ids() == [loose.id] and cl.project_ids() == [store.projects()[0].id, work.id]
    header = cl.list.item(1)
    assert header.font().bold() and header.data(ID_ROLE) is None
    qtbot.mouseClick(
        cl.list.viewport(),
        Qt.MouseButton.LeftButton,
        pos=cl.list.visualItemRect(header).center(),
    )
    # Unfolded: its chats under it, pinned first; the loose chats still below.
    assert rows(cl) == [
        "▸ Archive  (0)",
        "▾ Work  (2)",
        "★ Budget",
        "Roadmap",
        "Chats",
        "Loose chat",
    ]
    assert cl.ids() == [a.id, b.id, loose.id]
    cl.toggle_project(work.id)
    assert cl.ids() == [loose.id]
    # Opening a chat of a folded project unfolds it, and it is the current row.
    cl.set_current(b.id)
    assert work.id in cl.expanded and cl.list.currentItem().data(ID_ROLE) == b.id


def test_new_project_from_the_dialog(qtbot: QtBot, store: ChatStore) -> None:
    cl = make_list(qtbot, store)
    dialog = cl.project_dialog(None)
    ok = dialog.buttons.button(dialog.buttons.StandardButton.Ok)
    assert not ok.isEnabled()  # a name first
    dialog.name.setText("Research")
    dialog.system_prompt.setPlainText("Cite your sources.")
    dialog.collections.item(0).setCheckState(Qt.CheckState.Checked)  # papers
    assert ok.isEnabled()
    ok.click()
    (p,) = store.projects()
    assert (p.name, p.system_prompt, p.collections) == (
        "Research",
        "Cite your sources.",
        ("papers",),
    )
    assert rows(cl) == ["▾ Research  (0)"]
    # Editing it shows what it holds (a collection the index lost stays, marked).
    store.update_project(p.id, collections=["papers", "gone"])
    edit = cl.project_dialog(p.id)
    assert edit.name.text() == "Research" and edit.ticked() == ["papers", "gone"]
    assert edit.collections.item(2).text() == "gone (removed)"
    edit.name.setText("Research 2")
    edit.buttons.button(edit.buttons.StandardButton.Ok).click()
    assert store.project(p.id).name == "Research 2"


def test_new_chat_in_project_starts_with_its_settings(qtbot: QtBot, store: ChatStore) -> None:
    p = store.create_project("Research", "Cite your sources.", ["papers"])
    cl = make_list(qtbot, store)
    menu = cl.project_menu(p.id)
    assert [a.text() for a in menu.actions() if a.text()] == [
        "New chat in project",
        "Edit project…",
        "Rename…",
        "Delete project…",
    ]
    with qtbot.waitSignal(cl.conversation_selected) as opened:
        action(menu, "New chat in project")
    cid = opened.args[0] if opened.args else None
    assert isinstance(cid, int)
    conv = store.conversation(cid)
    assert conv.project_id == p.id
    settings = ChatSettings.from_stored(conv.settings)
    assert settings.system_prompt == "Cite your sources." and settings.collections == ("papers",)
    assert cl.ids() == [cid] and cl.list.currentItem().data(ID_ROLE) == cid
    # On top of what the window gives a new chat: the engine in use stays.
    cl.base_settings = lambda: ChatSettings(engine=EngineBinding("work", "gpt"))
    store.add_message(cid, "user", "A question")
    other = cl.new_chat_in(p.id)
    assert other is not None and other != cid
    assert store.conversation(other).settings == {
        "system_prompt": "Cite your sources.",
        "collections": ["papers"],
        "engine": {"connection": "work", "model": "gpt"},
    }


def test_move_to_project_from_a_chats_menu(qtbot: QtBot, store: ChatStore) -> None:
    p = store.create_project("Work")
    c = store.create_conversation("Loose chat", settings={"system_prompt": "Mine."})
    cl = make_list(qtbot, store)
    action(cl.menu_for(c.id), "Move to project ▸ Work")
    assert store.conversation(c.id).project_id == p.id
    assert rows(cl) == ["▾ Work  (1)", "Loose chat"] and cl.ids() == [c.id]  # none loose
    # Its own settings stay: only new chats start from the project's.
    assert store.conversation(c.id).settings == {"system_prompt": "Mine."}
    menu = cl.menu_for(c.id)
    (move,) = [m for m in menu.findChildren(QMenu) if m.title() == "Move to project"]
    (work,) = [a for a in move.actions() if a.text() == "Work"]
    assert work.isChecked()
    action(menu, "Move to project ▸ Out of the project")
    assert store.conversation(c.id).project_id is None
    assert rows(cl) == ["▾ Work  (0)", "Chats", "Loose chat"]
    # A new project from the menu, the chat moved into it on OK.
    action(cl.menu_for(c.id), "Move to project ▸ New project…")
    (dialog,) = cl.findChildren(ProjectDialog)
    dialog.name.setText("Fresh")
    dialog.accept()
    fresh = next(x for x in store.projects() if x.name == "Fresh")
    assert store.conversation(c.id).project_id == fresh.id


def test_deleting_a_project_asks_and_keeps_its_chats(qtbot: QtBot, store: ChatStore) -> None:
    p = store.create_project("Work")
    a = store.create_in_project(p.id, title="Budget")
    b = store.create_in_project(p.id, title="Roadmap")
    cl = make_list(qtbot, store)
    box = cl.ask_delete_project(p.id)
    assert "Its 2 chats move out of it" in box.text() and "none is deleted" in box.text()
    box.button(QMessageBox.StandardButton.Cancel).click()
    assert [x.id for x in store.projects()] == [p.id]
    box = cl.ask_delete_project(p.id)
    (delete,) = [x for x in box.buttons() if x.text() == "Delete project"]
    delete.click()
    assert store.projects() == [] and PROJECT_ROLE not in [
        cl.list.item(i).data(PROJECT_ROLE) for i in range(cl.list.count())
    ]
    assert sorted(cl.ids()) == sorted([a.id, b.id])
    assert all(store.conversation(x).project_id is None for x in (a.id, b.id))


def test_search_finds_chats_inside_projects(qtbot: QtBot, store: ChatStore) -> None:
    p = store.create_project("Work")
    c = store.create_in_project(p.id, title="Budget")
    store.add_message(c.id, "user", "the lighthouse budget for next year")
    cl = make_list(qtbot, store)
    assert cl.ids() == []  # folded
    qtbot.keyClicks(cl.search, "lighthouse")
    assert cl.ids() == [c.id]
    assert cl.list.item(0).text().split("\n")[1].startswith("Work · ")
