"""A new chat in a project, through the chat session (no Qt): it opens with the project's
system prompt and collections, the prompt it sends starts with that system prompt, and its
question is searched in those collections."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from app.services.chat_settings import ChatSettings
from app.services.projects import new_chat_in_project
from engine.rag.search import Hit
from tests.app.services.test_chat_session import Jobs, make_rig


def test_a_new_chat_in_a_project_sends_its_system_prompt_and_searches_its_collections(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path)
    s, store = rig.session, rig.store
    assert store is not None
    searched: list[tuple[list[str], str]] = []

    class Docs:
        def search(
            self, collections: Sequence[str], query: str, k: int, *, reranker: Path | None = None
        ) -> list[Hit]:
            searched.append((list(collections), query))
            return [Hit(1, Path("oil.md"), None, "Lamps", 0, 10, "Whale oil burned.", 1.0)]

    jobs = Jobs()
    s.use_documents(Docs(), jobs)
    project = store.create_project("Lighthouses", "Answer as a keeper would.", ["keeping"])
    conv = new_chat_in_project(store, project.id)
    s.open_conversation(conv.id)
    assert s.settings == ChatSettings(
        system_prompt="Answer as a keeper would.", collections=("keeping",)
    )
    assert s.send("What did the lamps burn?")
    jobs.finish()
    assert searched == [(["keeping"], "What did the lamps burn?")]
    system = rig.engine.turns[0].messages[0]
    assert system["role"] == "system"
    assert system["content"].startswith("Answer as a keeper would.\n\n")
    rig.answer("Oil [1].")
    # The exchange is stored in the project's conversation, its settings as they began.
    assert s.conversation_id == conv.id
    stored = store.conversation(conv.id)
    assert stored.project_id == project.id
    assert stored.settings == {
        "system_prompt": "Answer as a keeper would.",
        "collections": ["keeping"],
    }
    assert [m.content for m in store.active_path(conv.id)] == [
        "What did the lamps burn?",
        "Oil [1].",
    ]
