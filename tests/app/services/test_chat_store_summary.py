"""The chat store keeps a conversation's summary of left-out turns (schema 8), and a schema 7
database opens with its chats as they were."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from app.services.chat_store import MIGRATIONS, SCHEMA_VERSION, ChatStore, StoredSummary


def test_opens_a_schema_7_database_and_keeps_a_summary(tmp_path: Path) -> None:
    path = tmp_path / "v7.sqlite3"
    db = sqlite3.connect(path)
    for sql, fixup in MIGRATIONS[:7]:
        db.executescript(sql)
        if fixup is not None:
            fixup(db)
    db.executescript(
        """
        INSERT INTO conversations(id, title, created_at, updated_at, settings)
        VALUES (1, 'Old chat', 1.0, 2.0, '{}');
        INSERT INTO messages(id, conversation_id, role, content, created_at)
        VALUES (1, 1, 'user', 'hello lighthouse', 1.0);
        PRAGMA user_version = 7;
        """
    )
    db.close()
    with ChatStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION >= 8
        assert s.conversation(1).title == "Old chat"
        assert s.summary(1) is None
        s.set_summary(1, "They spoke of a lighthouse.", [1])
        s.set_summary(1, "They spoke of a lighthouse keeper.", [1, 2])  # replaced, not added
    with ChatStore(path) as s:
        assert s.summary(1) == StoredSummary("They spoke of a lighthouse keeper.", (1, 2))
