"""Conversations in SQLite: crash-safe history with branches, search and settings.

One database file in the user data dir, WAL mode with full sync, so a killed app never leaves
it corrupt and readers never block the writer. Messages form a tree: editing a user message or
regenerating an answer adds a sibling, and each conversation remembers which leaf is active.
An answer being streamed is stored with status 'streaming' and rewritten as it grows
(`StreamWriter` flushes at most once a second); on the next start `recover_interrupted()` marks
such answers 'interrupted' so the UI can offer to continue them.

Tool use (schema 4): an assistant message may carry the model's tool calls, each with the
person's decision; each call's result is a message with role 'tool' below it, chained one
after the other, so the active branch stays a single line. A result row is written 'running'
before the tool starts and rewritten when it ends; `recover_interrupted()` treats a leftover
'running' result like a leftover 'streaming' answer.

Attachments (schema 6): a user message may carry images and audio (`attachments`: hash, name,
kind), kept as content-addressed files in a folder beside the database
(`app.services.attachments`): each file is written before the message that refers to it, and
removed when the last message referring to it is deleted or purged. `recover_interrupted()`
also sweeps files a crash left without a message.

Projects (schema 7): a folder of chats with its own system prompt and document collections,
which a new chat in it starts with (`app.services.projects`); a conversation's `project_id` is
nullable, and deleting a project moves its chats out rather than deleting them.

Documents (schema 5): an answer grounded in a chat's collections keeps the passages it was
given (`grounding`: their numbers, files, pages, spans and text, and the token figures), so
reopening, continuing and exporting it show what it was written from.

The store is Qt-free and is handed to whoever needs it; it is used from one thread per
`ChatStore` instance (open a second instance for another thread). Export and import files
are `app.services.chat_exchange`'s.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.services.attachments import (
    Attachment,
    AttachmentError,
    AttachmentFiles,
    AttachmentKind,
    attachments_of,
)
from engine.rag.grounding import Grounding

SCHEMA_VERSION = 8
DEFAULT_TITLE = "New chat"


# A tool call's decision: awaiting the person, allowed once, allowed for good (the server's
# always-allow list), denied.
TOOL_DECISIONS = ("pending", "allowed", "always", "denied")
# A tool result's status: 'running' only while the tool runs; 'interrupted' when the app died
# meanwhile (its outcome is unknown, so it is told apart from a cancel the person asked for).
TOOL_STATUSES = ("running", "complete", "error", "denied", "cancelled", "interrupted")
# What `recover_interrupted` notes on a result whose tool was running when the app died.
TOOL_INTERRUPTED_NOTE = "The app closed while the tool was running; its result is unknown."


class ChatStoreError(RuntimeError):
    """A store operation failed; `str()` is a one-line message for the user."""


@dataclass
class StoredMessage:
    id: int
    conversation_id: int
    parent_id: int | None
    role: str
    content: str
    created_at: float
    # complete | streaming | interrupted | error; a tool result: one of TOOL_STATUSES
    status: str = "complete"
    model: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    # A reasoning model's thinking block, kept apart from the answer (`content`): shown
    # above it, never sent back to the model with the history.
    thinking: str = ""
    # An assistant message's tool calls: {"id", "name", "arguments" (the JSON text the model
    # wrote, kept verbatim), "server", "decision"}.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    # A tool result ('tool' role): the call it answers and the tool's name.
    tool_call_id: str | None = None
    tool_name: str | None = None
    # An answer grounded in documents: `Grounding.to_dict()` ({} for none).
    grounding: dict[str, Any] = field(default_factory=dict)
    # Images and audio sent with a user message, in the order they were attached.
    attachments: list[Attachment] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        """A tool result cut to the size limit (the text says so too)."""
        return bool(self.stats.get("truncated"))

    @property
    def ended(self) -> str | None:
        """How an answer ended when it did not end by itself: 'stopped' (the user pressed
        Stop), 'length' (max tokens), 'context_full', 'timeout', 'interrupted' (the app
        closed or the connection broke while it streamed), 'error'; None otherwise."""
        if self.role != "assistant":
            return None
        if self.status in ("interrupted", "streaming"):
            return "interrupted"
        if self.status == "error":
            return "error"
        reason = self.stats.get("stop_reason")
        return _ENDINGS.get(reason) if isinstance(reason, str) else None


# The stats' stop reasons that leave an answer short of what the model would have said.
_ENDINGS = {
    "cancelled": "stopped",
    "length": "length",
    "context_full": "context_full",
    "timeout": "timeout",
}


@dataclass
class StoredConversation:
    id: int
    title: str
    created_at: float
    updated_at: float
    pinned: bool = False
    settings: dict[str, Any] = field(default_factory=dict)
    active_leaf_id: int | None = None
    project_id: int | None = None  # the project (folder) it is in; None: a loose chat


@dataclass(frozen=True)
class Project:
    """A folder of chats: its name, and what a new chat in it starts with."""

    id: int
    name: str
    system_prompt: str = ""
    collections: tuple[str, ...] = ()
    created_at: float = 0.0


def _row_project(r: sqlite3.Row) -> Project:
    try:
        names = json.loads(r["collections"] or "[]")
    except ValueError:  # a hand-edited row: the project without its collections
        names = []
    return Project(
        id=r["id"],
        name=r["name"],
        system_prompt=r["system_prompt"] or "",
        collections=tuple(str(n) for n in names if isinstance(n, str) and n)
        if isinstance(names, list)
        else (),
        created_at=r["created_at"],
    )


def _project_name(name: str) -> str:
    name = " ".join(name.split())
    if not name:
        raise ChatStoreError("a project needs a name")
    return name


# Each migration brings the schema from version i to i + 1: a SQL script, then an optional
# Python fix-up of the data, all in one transaction.
_V1_SQL = """
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            created_at REAL NOT NULL
        );
"""

# Version 2: branching, stats/settings, pins, soft delete, presets and full-text search.
_V2_SQL = """
        ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE conversations ADD COLUMN settings TEXT NOT NULL DEFAULT '{}';
        ALTER TABLE conversations ADD COLUMN active_leaf_id INTEGER;
        ALTER TABLE conversations ADD COLUMN deleted_at REAL;
        ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id);
        ALTER TABLE messages ADD COLUMN status TEXT NOT NULL DEFAULT 'complete';
        ALTER TABLE messages ADD COLUMN model TEXT;
        ALTER TABLE messages ADD COLUMN stats TEXT NOT NULL DEFAULT '{}';
        ALTER TABLE messages ADD COLUMN sampling TEXT NOT NULL DEFAULT '{}';
        CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
        CREATE INDEX messages_by_parent ON messages(parent_id);
        CREATE TABLE presets (name TEXT PRIMARY KEY, settings TEXT NOT NULL);
        CREATE VIRTUAL TABLE messages_fts USING fts5(
            content, content='messages', content_rowid='id', tokenize='unicode61'
        );
        CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
            INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
        END;
        CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content)
            VALUES ('delete', old.id, old.content);
        END;
        CREATE TRIGGER messages_au AFTER UPDATE OF content ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content)
            VALUES ('delete', old.id, old.content);
            INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
        END;
        INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
"""


# Version 3: a reasoning model's thinking, stored apart from the answer.
_V3_SQL = """
        ALTER TABLE messages ADD COLUMN thinking TEXT NOT NULL DEFAULT '';
"""


# Version 4: tool calls and their results. A result's status reuses `status`, so crash
# recovery and every reader of statuses see it the one way; `truncated` goes in the stats
# JSON (with the run's duration): nothing queries it, the text already carries the cut note,
# and a column would sit empty on every other message. The results' text is in `content`,
# so full-text search finds it through the existing triggers.
_V4_SQL = """
        ALTER TABLE messages ADD COLUMN tool_calls TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE messages ADD COLUMN tool_call_id TEXT;
        ALTER TABLE messages ADD COLUMN tool_name TEXT;
"""


def _chain_flat_history(db: sqlite3.Connection) -> None:
    # Version 1 stored a flat list per conversation: chain it into a single branch.
    rows = db.execute("SELECT id, conversation_id FROM messages ORDER BY conversation_id, id")
    prev: dict[int, int] = {}
    for mid, cid in rows.fetchall():
        if cid in prev:
            db.execute("UPDATE messages SET parent_id = ? WHERE id = ?", (prev[cid], mid))
        prev[cid] = mid
    for cid, leaf in prev.items():
        db.execute("UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (leaf, cid))


# Version 5: the passages an answer was grounded in, one JSON object (read whole, never
# queried).
_V5_SQL = """
        ALTER TABLE messages ADD COLUMN grounding TEXT NOT NULL DEFAULT '{}';
"""


# Version 6: a message's attachments, a JSON list of {"sha256", "name", "kind"} (the files
# are in the attachments folder, named by hash).
_V6_SQL = """
        ALTER TABLE messages ADD COLUMN attachments TEXT NOT NULL DEFAULT '[]';
"""


# Version 7: projects. A chat's project is a nullable column (an old chat is loose); its
# collections are a JSON list, like a chat's settings keep them. ON DELETE SET NULL is a
# second guard: `delete_project` moves the chats out itself, the soft-deleted ones too.
# Written to be run again on a database that has some of it (SQLite has no ADD COLUMN IF
# NOT EXISTS: `_add_project_column` checks).
_V7_SQL = """
        CREATE TABLE IF NOT EXISTS projects (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '',
            collections TEXT NOT NULL DEFAULT '[]',
            created_at REAL NOT NULL
        );
"""


def _add_project_column(db: sqlite3.Connection) -> None:
    columns = {r[1] for r in db.execute("PRAGMA table_info(conversations)")}
    if "project_id" not in columns:
        db.execute(
            "ALTER TABLE conversations ADD COLUMN project_id INTEGER "
            "REFERENCES projects(id) ON DELETE SET NULL"
        )
    db.execute("CREATE INDEX IF NOT EXISTS conversations_by_project ON conversations(project_id)")


# Version 8: a chat's summary of the turns its context leaves out (policy "summarise"): one
# per conversation, with the ids of the messages it stands for (a JSON list).
_V8_SQL = """
        CREATE TABLE IF NOT EXISTS summaries (
            conversation_id INTEGER PRIMARY KEY
                REFERENCES conversations(id) ON DELETE CASCADE,
            text TEXT NOT NULL,
            covers TEXT NOT NULL DEFAULT '[]',
            updated_at REAL NOT NULL
        );
"""


@dataclass(frozen=True)
class StoredSummary:
    """A conversation's summary of earlier turns: its text and the message ids it covers."""

    text: str
    covers: tuple[int, ...]


MIGRATIONS: list[tuple[str, Callable[[sqlite3.Connection], None] | None]] = [
    (_V1_SQL, None),
    (_V2_SQL, _chain_flat_history),
    (_V3_SQL, None),
    (_V4_SQL, None),
    (_V5_SQL, None),
    (_V6_SQL, None),
    (_V7_SQL, _add_project_column),
    (_V8_SQL, None),
]


def _row_message(r: sqlite3.Row) -> StoredMessage:
    return StoredMessage(
        id=r["id"],
        conversation_id=r["conversation_id"],
        parent_id=r["parent_id"],
        role=r["role"],
        content=r["content"],
        created_at=r["created_at"],
        status=r["status"],
        model=r["model"],
        stats=json.loads(r["stats"] or "{}"),
        sampling=json.loads(r["sampling"] or "{}"),
        thinking=r["thinking"] or "",
        tool_calls=json.loads(r["tool_calls"] or "[]"),
        tool_call_id=r["tool_call_id"],
        tool_name=r["tool_name"],
        grounding=json.loads(r["grounding"] or "{}"),
        attachments=_read_attachments(r["attachments"]),
    )


def _read_attachments(raw: str | None) -> list[Attachment]:
    try:
        return attachments_of(json.loads(raw or "[]"))
    except (ValueError, AttachmentError):  # a hand-edited row: the message without them
        return []


def _attachments_json(attachments: Sequence[Attachment]) -> str:
    return json.dumps([a.to_dict() for a in attachments], ensure_ascii=False)


def stored_grounding(value: Any) -> dict[str, Any]:
    """An answer's grounding in the stored shape ({} for none); ChatStoreError (one line)
    for one that is not a grounding."""
    if not value:
        return {}
    try:
        return Grounding.from_dict(value).to_dict()
    except ValueError as e:
        raise ChatStoreError(f"bad sources: {e}") from None


def stored_tool_calls(calls: Any) -> list[dict[str, Any]]:
    """Calls in the stored shape: id, name and arguments required (arguments as JSON text,
    an object is encoded), server optional, decision 'pending' unless given."""
    if not isinstance(calls, list):
        raise ChatStoreError("tool calls must be a list")
    out: list[dict[str, Any]] = []
    for c in calls:
        if (
            not isinstance(c, dict)
            or not isinstance(c.get("id"), str)
            or not c["id"]
            or not isinstance(c.get("name"), str)
            or not c["name"]
        ):
            raise ChatStoreError("a tool call needs an id and a name")
        args = c.get("arguments", "{}")
        decision = c.get("decision", "pending")
        if decision not in TOOL_DECISIONS:
            raise ChatStoreError(f"unknown tool call decision {decision!r}")
        server = c.get("server")
        out.append(
            {
                "id": c["id"],
                "name": c["name"],
                "arguments": args
                if isinstance(args, str)
                else json.dumps(args, ensure_ascii=False),
                "server": server if isinstance(server, str) else None,
                "decision": decision,
            }
        )
    if len({c["id"] for c in out}) != len(out):
        raise ChatStoreError("two tool calls of one message have the same id")
    return out


def _row_conversation(r: sqlite3.Row) -> StoredConversation:
    return StoredConversation(
        id=r["id"],
        title=r["title"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        pinned=bool(r["pinned"]),
        settings=json.loads(r["settings"] or "{}"),
        active_leaf_id=r["active_leaf_id"],
        project_id=r["project_id"],
    )


def auto_title(text: str, limit: int = 48) -> str:
    """A short title from the first user message: its first line, cut at a word boundary."""
    line = " ".join(text.strip().split())
    if not line:
        return DEFAULT_TITLE
    if len(line) <= limit:
        return line
    cut = line[:limit].rsplit(" ", 1)[0] or line[:limit]
    return cut.rstrip(",.;:") + "…"


class ChatStore:
    def __init__(self, path: Path | str, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        # The attached files, beside the database ("chats-attachments"; None in memory).
        self.files: AttachmentFiles | None = None
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.files = AttachmentFiles(self.path.with_name(f"{self.path.stem}-attachments"))
        try:
            self._db = sqlite3.connect(str(path), timeout=10, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: a committed answer chunk survives even an OS crash, not only an app kill.
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise ChatStoreError(f"the chat history at {self.path} cannot be opened: {e}") from None

    # -- schema ------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise ChatStoreError(
                f"the chat history was written by a newer Candlewick (schema {version}); "
                "update the app to open it"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            sql, fixup = MIGRATIONS[target - 1]
            # executescript() commits first, so the transaction is opened inside the script.
            try:
                self._db.executescript("BEGIN IMMEDIATE;\n" + sql)
                if fixup is not None:
                    fixup(self._db)
                self._db.execute(f"PRAGMA user_version = {target}")
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction. SQLite's operational failures (a full disk, an I/O error, a
        locked file) become a one-line `ChatStoreError`; what was committed before stays."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                # After SQLITE_FULL or an I/O error SQLite may have rolled back already, and a
                # second ROLLBACK would hide the real error behind "no transaction is active".
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as e:
            raise ChatStoreError(self._write_failed(e)) from None

    def _write_failed(self, e: sqlite3.OperationalError) -> str:
        if getattr(e, "sqlite_errorname", "") == "SQLITE_FULL":
            return (
                f"the disk is full: the chat history ({self.path}) was not changed; "
                "free some space and try again"
            )
        return f"the chat history ({self.path}) cannot be written: {e}"

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ChatStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- conversations -----------------------------------------------------------------------

    def create_conversation(
        self, title: str = DEFAULT_TITLE, settings: dict[str, Any] | None = None
    ) -> StoredConversation:
        now = self._clock()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO conversations(title, created_at, updated_at, settings) "
                "VALUES (?, ?, ?, ?)",
                (title, now, now, json.dumps(settings or {})),
            )
        return self.conversation(int(cur.lastrowid or 0))

    def conversation(self, conversation_id: int) -> StoredConversation:
        r = self._db.execute(
            "SELECT * FROM conversations WHERE id = ? AND deleted_at IS NULL", (conversation_id,)
        ).fetchone()
        if r is None:
            raise ChatStoreError(f"no conversation with id {conversation_id}")
        return _row_conversation(r)

    def conversations(self) -> list[StoredConversation]:
        """Pinned first, then by last activity."""
        rows = self._db.execute(
            "SELECT * FROM conversations WHERE deleted_at IS NULL "
            "ORDER BY pinned DESC, updated_at DESC, id DESC"
        ).fetchall()
        return [_row_conversation(r) for r in rows]

    def previews(self, length: int = 80) -> dict[int, str]:
        """The start of each conversation's latest message on its active branch, on one line
        (what tells apart chats with the same title)."""
        rows = self._db.execute(
            "SELECT c.id, m.content FROM conversations c JOIN messages m "
            "ON m.id = c.active_leaf_id WHERE c.deleted_at IS NULL"
        ).fetchall()
        out = {}
        for cid, content in rows:
            line = " ".join(str(content).split())
            out[int(cid)] = line if len(line) <= length else line[: length - 1] + "…"
        return out

    def rename(self, conversation_id: int, title: str) -> None:
        title = " ".join(title.split()) or DEFAULT_TITLE
        self._update_conversation(conversation_id, title=title)

    def set_pinned(self, conversation_id: int, pinned: bool) -> None:
        self._update_conversation(conversation_id, pinned=int(pinned))

    def update_settings(self, conversation_id: int, **changes: Any) -> dict[str, Any]:
        """Merge `changes` into the conversation's settings (other keys stay)."""
        settings = self.conversation(conversation_id).settings
        settings.update(changes)
        self._update_conversation(conversation_id, settings=json.dumps(settings), touch=False)
        return settings

    def summary(self, conversation_id: int) -> StoredSummary | None:
        """The conversation's summary of left-out turns, if it has one."""
        r = self._db.execute(
            "SELECT text, covers FROM summaries WHERE conversation_id = ?", (conversation_id,)
        ).fetchone()
        if r is None:
            return None
        covers = json.loads(r["covers"] or "[]")
        return StoredSummary(r["text"], tuple(int(i) for i in covers if isinstance(i, int)))

    def set_summary(self, conversation_id: int, text: str, covers: Sequence[int]) -> None:
        """Keep `text` as the summary of the messages `covers` (replacing the one before)."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO summaries (conversation_id, text, covers, updated_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT(conversation_id) DO UPDATE SET "
                "text = excluded.text, covers = excluded.covers, updated_at = excluded.updated_at",
                (conversation_id, text, json.dumps(list(covers)), self._clock()),
            )

    def replace_settings(self, conversation_id: int, settings: dict[str, Any]) -> None:
        """The conversation's settings become `settings`: a key left out is removed (a value
        set back to its default, a schema cleared)."""
        self._update_conversation(conversation_id, settings=json.dumps(settings), touch=False)

    def _update_conversation(
        self, conversation_id: int, *, touch: bool = False, **cols: Any
    ) -> None:
        if touch:
            cols["updated_at"] = self._clock()
        sets = ", ".join(f"{k} = ?" for k in cols)
        with self._tx() as db:
            cur = db.execute(
                f"UPDATE conversations SET {sets} WHERE id = ? AND deleted_at IS NULL",
                (*cols.values(), conversation_id),
            )
        if cur.rowcount == 0:
            raise ChatStoreError(f"no conversation with id {conversation_id}")

    def delete(self, conversation_id: int) -> None:
        """Soft delete: `undo_delete` brings it back until `purge_deleted` runs."""
        self._update_conversation(conversation_id, deleted_at=self._clock())

    def undo_delete(self, conversation_id: int) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE conversations SET deleted_at = NULL WHERE id = ?", (conversation_id,)
            )

    def purge_deleted(self, older_than_s: float = 0.0) -> int:
        cutoff = self._clock() - older_than_s
        released: set[str] = set()
        with self._tx() as db:
            ids = [
                r[0]
                for r in db.execute(
                    "SELECT id FROM conversations WHERE deleted_at IS NOT NULL AND deleted_at <= ?",
                    (cutoff,),
                )
            ]
            for cid in ids:
                released |= self._attached(
                    "SELECT attachments FROM messages WHERE conversation_id = ?", (cid,)
                )
                db.execute("UPDATE conversations SET active_leaf_id = NULL WHERE id = ?", (cid,))
                # Children first: parent_id references must never dangle.
                db.execute("UPDATE messages SET parent_id = NULL WHERE conversation_id = ?", (cid,))
                db.execute("DELETE FROM messages WHERE conversation_id = ?", (cid,))
                db.execute("DELETE FROM conversations WHERE id = ?", (cid,))
        self._release(released)
        return len(ids)

    # -- messages ----------------------------------------------------------------------------

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        parent_id: int | bool | None = True,
        status: str = "complete",
        model: str | None = None,
        stats: dict[str, Any] | None = None,
        sampling: dict[str, Any] | None = None,
        thinking: str = "",
        tool_calls: list[dict[str, Any]] | None = None,
        tool_call_id: str | None = None,
        tool_name: str | None = None,
        grounding: dict[str, Any] | None = None,
        attachments: Sequence[Attachment] = (),
    ) -> StoredMessage:
        """Append a message. `attachments`: files already kept (`save_attachment`).
        `parent_id=True` (default) attaches it to the active leaf; an
        explicit parent creates a branch (a sibling of that parent's other children).
        A tool result is better added with `add_tool_result`, which finds its place."""
        calls = stored_tool_calls(tool_calls or [])
        grounded = stored_grounding(grounding)
        self._check_kept(attachments)
        conv = self.conversation(conversation_id)
        parent = conv.active_leaf_id if parent_id is True else parent_id
        if isinstance(parent, bool):
            parent = None
        if parent is not None:
            p = self.message(parent)
            if p.conversation_id != conversation_id:
                raise ChatStoreError("a message's parent must be in the same conversation")
        now = self._clock()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO messages(conversation_id, parent_id, role, content, created_at, "
                "status, model, stats, sampling, thinking, tool_calls, tool_call_id, tool_name, "
                "grounding, attachments) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    parent,
                    role,
                    content,
                    now,
                    status,
                    model,
                    json.dumps(stats or {}),
                    json.dumps(sampling or {}),
                    thinking,
                    json.dumps(calls, ensure_ascii=False),
                    tool_call_id,
                    tool_name,
                    json.dumps(grounded, ensure_ascii=False),
                    _attachments_json(attachments),
                ),
            )
            mid = int(cur.lastrowid or 0)
            db.execute(
                "UPDATE conversations SET active_leaf_id = ?, updated_at = ? WHERE id = ?",
                (mid, now, conversation_id),
            )
            if role == "user" and conv.title == DEFAULT_TITLE and parent is None:
                db.execute(
                    "UPDATE conversations SET title = ? WHERE id = ?",
                    (auto_title(content), conversation_id),
                )
        return self.message(mid)

    def message(self, message_id: int) -> StoredMessage:
        r = self._db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if r is None:
            raise ChatStoreError(f"no message with id {message_id}")
        return _row_message(r)

    def update_message(
        self,
        message_id: int,
        *,
        content: str | None = None,
        status: str | None = None,
        stats: dict[str, Any] | None = None,
        thinking: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        grounding: dict[str, Any] | None = None,
    ) -> None:
        cols: dict[str, Any] = {}
        if grounding is not None:
            cols["grounding"] = json.dumps(stored_grounding(grounding), ensure_ascii=False)
        if tool_calls is not None:
            cols["tool_calls"] = json.dumps(stored_tool_calls(tool_calls), ensure_ascii=False)
        if content is not None:
            cols["content"] = content
        if thinking is not None:
            cols["thinking"] = thinking
        if status is not None:
            cols["status"] = status
        if stats is not None:
            cols["stats"] = json.dumps(stats)
        if not cols:
            return
        sets = ", ".join(f"{k} = ?" for k in cols)
        with self._tx() as db:
            db.execute(f"UPDATE messages SET {sets} WHERE id = ?", (*cols.values(), message_id))
            db.execute(
                "UPDATE conversations SET updated_at = ? WHERE id = "
                "(SELECT conversation_id FROM messages WHERE id = ?)",
                (self._clock(), message_id),
            )

    # -- tool calls and results --------------------------------------------------------------

    def add_tool_result(
        self,
        assistant_id: int,
        call_id: str,
        content: str = "",
        *,
        status: str = "complete",
        truncated: bool = False,
        stats: dict[str, Any] | None = None,
    ) -> StoredMessage:
        """Store the result of the call `call_id` of the assistant message `assistant_id`:
        below the results already stored for its other calls (so they form one line under
        it), as the new active leaf. Write it `status='running'` before the tool starts and
        finish it with `update_tool_result`, so a crash meanwhile leaves a trace that
        `recover_interrupted` marks. `truncated` goes in the stats."""
        if status not in TOOL_STATUSES:
            raise ChatStoreError(f"unknown tool result status {status!r}")
        a = self.message(assistant_id)
        call = next((c for c in a.tool_calls if c["id"] == call_id), None)
        if a.role != "assistant" or call is None:
            raise ChatStoreError(f"message {assistant_id} has no tool call {call_id!r}")
        tail, answered = self._tool_results_below(a)
        if call_id in answered:
            raise ChatStoreError(
                f"tool call {call_id!r} already has a result (message {answered[call_id]})"
            )
        st = dict(stats or {})
        if truncated:
            st["truncated"] = True
        return self.add_message(
            a.conversation_id,
            "tool",
            content,
            parent_id=tail,
            status=status,
            stats=st,
            tool_call_id=call_id,
            tool_name=call["name"],
        )

    def _tool_results_below(self, a: StoredMessage) -> tuple[int, dict[str, int]]:
        """The last of the results chained below the assistant message `a` (or `a` itself),
        and the result message id of each call answered there."""
        ids = {c["id"] for c in a.tool_calls}
        current, answered = a.id, dict[str, int]()
        while True:
            r = self._db.execute(
                "SELECT id, tool_call_id FROM messages WHERE parent_id = ? AND role = 'tool' "
                "ORDER BY id DESC",
                (current,),
            ).fetchall()
            # The newest child answering a call not yet seen (an older sibling is a branch).
            nxt = next((row for row in r if row[1] in ids and row[1] not in answered), None)
            if nxt is None:
                return current, answered
            current = answered[nxt[1]] = int(nxt[0])

    def update_tool_result(
        self,
        message_id: int,
        *,
        content: str | None = None,
        status: str | None = None,
        truncated: bool | None = None,
        stats: dict[str, Any] | None = None,
    ) -> None:
        """Rewrite a tool result as its tool ends; `stats` are merged into the stored ones
        (a running row's keys stay)."""
        m = self.message(message_id)
        if m.role != "tool":
            raise ChatStoreError(f"message {message_id} is not a tool result")
        if status is not None and status not in TOOL_STATUSES:
            raise ChatStoreError(f"unknown tool result status {status!r}")
        st = {**m.stats, **(stats or {})}
        if truncated is not None:
            st.pop("truncated", None)
            if truncated:
                st["truncated"] = True
        self.update_message(
            message_id, content=content, status=status, stats=st if st != m.stats else None
        )

    def set_tool_decision(self, message_id: int, call_id: str, decision: str) -> StoredMessage:
        """Record the person's decision on one tool call of an assistant message."""
        if decision not in TOOL_DECISIONS:
            raise ChatStoreError(f"unknown tool call decision {decision!r}")
        with self._tx() as db:  # read and write in one transaction: no lost update
            r = db.execute("SELECT tool_calls FROM messages WHERE id = ?", (message_id,)).fetchone()
            calls = json.loads(r[0] or "[]") if r is not None else []
            call = next((c for c in calls if c.get("id") == call_id), None)
            if call is None:
                raise ChatStoreError(f"message {message_id} has no tool call {call_id!r}")
            call["decision"] = decision
            db.execute(
                "UPDATE messages SET tool_calls = ? WHERE id = ?",
                (json.dumps(calls, ensure_ascii=False), message_id),
            )
        return self.message(message_id)

    def delete_message(self, message_id: int) -> None:
        """Remove a message and everything below it; the active branch moves to its parent."""
        m = self.message(message_id)
        doomed = [m.id]
        i = 0
        while i < len(doomed):
            doomed += [
                r[0]
                for r in self._db.execute(
                    "SELECT id FROM messages WHERE parent_id = ?", (doomed[i],)
                )
            ]
            i += 1
        released = {a.sha256 for mid in doomed for a in self.message(mid).attachments}
        with self._tx() as db:
            for mid in reversed(doomed):
                db.execute("DELETE FROM messages WHERE id = ?", (mid,))
            conv = self.conversation(m.conversation_id)
            if conv.active_leaf_id in doomed or conv.active_leaf_id is None:
                leaf = self._deepest_latest(m.parent_id) if m.parent_id else None
                db.execute(
                    "UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                    (leaf, m.conversation_id),
                )
        self._release(released)

    def children(
        self, message_id: int | None, conversation_id: int | None = None
    ) -> list[StoredMessage]:
        if message_id is None:
            rows = self._db.execute(
                "SELECT * FROM messages WHERE parent_id IS NULL AND conversation_id = ? "
                "ORDER BY id",
                (conversation_id,),
            ).fetchall()
        else:
            rows = self._db.execute(
                "SELECT * FROM messages WHERE parent_id = ? ORDER BY id", (message_id,)
            ).fetchall()
        return [_row_message(r) for r in rows]

    def siblings(self, message_id: int) -> list[StoredMessage]:
        """The alternatives at this point of the tree (this message included), oldest first."""
        m = self.message(message_id)
        return self.children(m.parent_id, m.conversation_id)

    def active_path(self, conversation_id: int) -> list[StoredMessage]:
        """The messages of the active branch, root first."""
        conv = self.conversation(conversation_id)
        if conv.active_leaf_id is None:
            return []
        rows = self._db.execute(
            """
            WITH RECURSIVE path(id, parent_id, depth) AS (
                SELECT id, parent_id, 0 FROM messages WHERE id = ?
                UNION ALL
                SELECT m.id, m.parent_id, p.depth + 1 FROM messages m
                JOIN path p ON m.id = p.parent_id
            )
            SELECT messages.* FROM path JOIN messages ON messages.id = path.id
            ORDER BY path.depth DESC
            """,
            (conv.active_leaf_id,),
        ).fetchall()
        return [_row_message(r) for r in rows]

    def _deepest_latest(self, message_id: int) -> int:
        current = message_id
        while True:
            r = self._db.execute(
                "SELECT id FROM messages WHERE parent_id = ? ORDER BY id DESC LIMIT 1", (current,)
            ).fetchone()
            if r is None:
                return current
            current = int(r[0])

    def switch_branch(self, message_id: int) -> list[StoredMessage]:
        """Make the branch through `message_id` active (following its newest descendants)."""
        m = self.message(message_id)
        leaf = self._deepest_latest(m.id)
        with self._tx() as db:
            db.execute(
                "UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                (leaf, m.conversation_id),
            )
        return self.active_path(m.conversation_id)

    def branch_position(self, message_id: int) -> tuple[int, int]:
        """(index starting at 1, count) among siblings, for a '< 2/3 >' control."""
        sib = self.siblings(message_id)
        ids = [s.id for s in sib]
        return ids.index(message_id) + 1, len(ids)

    # -- streaming and crash recovery --------------------------------------------------------

    def recover_interrupted(self) -> list[StoredMessage]:
        """Answers that were streaming when the app died become 'interrupted', and so do
        tool results whose tool was running (with a note in their stats' 'error', which
        the UI shows for an interrupted message)."""
        rows = self._db.execute(
            "SELECT * FROM messages WHERE status = 'streaming' "
            "OR (role = 'tool' AND status = 'running') ORDER BY id"
        ).fetchall()
        if rows:
            with self._tx() as db:
                for r in rows:
                    m = _row_message(r)
                    if m.role == "tool":
                        m.stats.setdefault("error", TOOL_INTERRUPTED_NOTE)
                    db.execute(
                        "UPDATE messages SET status = 'interrupted', stats = ? WHERE id = ?",
                        (json.dumps(m.stats), m.id),
                    )
        self.sweep_attachments()
        return [self.message(r["id"]) for r in rows]

    # -- attachments -------------------------------------------------------------------------

    def save_attachment(self, data: bytes, name: str, kind: AttachmentKind) -> Attachment:
        """Keep an attached file (written whole before this returns), for `add_message` to
        refer to. ChatStoreError (one line) when it cannot be written."""
        if self.files is None:
            raise ChatStoreError("a chat history in memory keeps no attachments")
        try:
            sha = self.files.put(data)
        except AttachmentError as e:
            raise ChatStoreError(str(e)) from None
        except OSError as e:
            raise ChatStoreError(f"the attachment {name} cannot be saved: {e.strerror}") from None
        return Attachment(sha, name, kind)

    def attachment_data(self, attachment: Attachment) -> bytes:
        """The bytes of a message's attachment; ChatStoreError (one line) when it is gone."""
        if self.files is None:
            raise ChatStoreError("a chat history in memory keeps no attachments")
        try:
            return self.files.read(attachment.sha256)
        except AttachmentError as e:
            raise ChatStoreError(f"{attachment.name}: {e}") from None

    def _check_kept(self, attachments: Sequence[Attachment]) -> None:
        """A message refers only to files already written (so a crash never leaves a
        message pointing at nothing)."""
        for a in attachments:
            if self.files is None or not self.files.has(a.sha256):
                raise ChatStoreError(f"{a.name} was not saved before its message")

    def _attached(self, sql: str, args: tuple[Any, ...]) -> set[str]:
        return {a.sha256 for (raw,) in self._db.execute(sql, args) for a in _read_attachments(raw)}

    def referenced_attachments(self) -> set[str]:
        """The hashes some message (a deleted conversation's too, until purged) refers to."""
        return self._attached("SELECT attachments FROM messages WHERE attachments != '[]'", ())

    def _release(self, hashes: set[str]) -> None:
        """Remove the files of `hashes` that no message refers to any more."""
        if self.files is not None and hashes:
            self.files.remove(hashes - self.referenced_attachments())

    def sweep_attachments(self, older_than_s: float | None = None) -> int:
        """Remove attached files no message refers to (a crash between writing a file and
        its message), older than the grace period; how many went."""
        if self.files is None:
            return 0
        if older_than_s is None:
            return self.files.sweep(self.referenced_attachments())
        return self.files.sweep(self.referenced_attachments(), older_than_s)

    # -- projects ----------------------------------------------------------------------------

    def create_project(
        self, name: str, system_prompt: str = "", collections: Sequence[str] = ()
    ) -> Project:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO projects(name, system_prompt, collections, created_at) "
                "VALUES (?, ?, ?, ?)",
                (_project_name(name), system_prompt, json.dumps(list(collections)), self._clock()),
            )
        return self.project(int(cur.lastrowid or 0))

    def project(self, project_id: int) -> Project:
        r = self._db.execute("SELECT * FROM projects WHERE id = ?", (project_id,)).fetchone()
        if r is None:
            raise ChatStoreError(f"no project with id {project_id}")
        return _row_project(r)

    def projects(self) -> list[Project]:
        """By name, as a sidebar lists folders."""
        rows = self._db.execute(
            "SELECT * FROM projects ORDER BY name COLLATE NOCASE, id"
        ).fetchall()
        return [_row_project(r) for r in rows]

    def update_project(
        self,
        project_id: int,
        *,
        name: str | None = None,
        system_prompt: str | None = None,
        collections: Sequence[str] | None = None,
    ) -> Project:
        """Change what is given; the chats already in it keep their own settings (only new
        ones start from the project's)."""
        cols: dict[str, Any] = {}
        if name is not None:
            cols["name"] = _project_name(name)
        if system_prompt is not None:
            cols["system_prompt"] = system_prompt
        if collections is not None:
            cols["collections"] = json.dumps(list(collections))
        if cols:
            sets = ", ".join(f"{k} = ?" for k in cols)
            with self._tx() as db:
                cur = db.execute(
                    f"UPDATE projects SET {sets} WHERE id = ?", (*cols.values(), project_id)
                )
            if cur.rowcount == 0:
                raise ChatStoreError(f"no project with id {project_id}")
        return self.project(project_id)

    def delete_project(self, project_id: int) -> int:
        """Delete a project; its chats stay, as loose chats. How many were moved out."""
        with self._tx() as db:
            moved = db.execute(
                "UPDATE conversations SET project_id = NULL WHERE project_id = ?", (project_id,)
            ).rowcount
            db.execute("DELETE FROM projects WHERE id = ?", (project_id,))
        return int(moved)

    def move_to_project(self, conversation_id: int, project_id: int | None) -> None:
        """Put a chat in a project (None: out of any). Its settings are left as they are,
        and its place in the order too (moving is not activity)."""
        if project_id is not None:
            self.project(project_id)  # a one-line error for an unknown project
        self._update_conversation(conversation_id, project_id=project_id)

    def create_in_project(
        self,
        project_id: int | None,
        settings: dict[str, Any] | None = None,
        title: str = DEFAULT_TITLE,
    ) -> StoredConversation:
        """A new, empty conversation in a project (None: a loose one), in one transaction."""
        if project_id is not None:
            self.project(project_id)
        now = self._clock()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO conversations(title, created_at, updated_at, settings, project_id) "
                "VALUES (?, ?, ?, ?, ?)",
                (title, now, now, json.dumps(settings or {}), project_id),
            )
        return self.conversation(int(cur.lastrowid or 0))

    # -- search ------------------------------------------------------------------------------

    def search(
        self, query: str, limit: int = 50
    ) -> list[tuple[StoredConversation, StoredMessage, str]]:
        """Full-text search over all messages: (conversation, message, snippet)."""
        terms = [t for t in query.replace('"', " ").split() if t]
        if not terms:
            return []
        # Each word as a quoted prefix term: user input is never parsed as FTS syntax.
        fts_query = " ".join(f'"{t}"*' for t in terms)
        rows = self._db.execute(
            """
            SELECT m.id AS mid, c.id AS cid,
                   snippet(messages_fts, 0, '[', ']', '…', 12) AS snip
            FROM messages_fts
            JOIN messages m ON m.id = messages_fts.rowid
            JOIN conversations c ON c.id = m.conversation_id
            WHERE messages_fts MATCH ? AND c.deleted_at IS NULL
            ORDER BY rank LIMIT ?
            """,
            (fts_query, limit),
        ).fetchall()
        return [(self.conversation(r["cid"]), self.message(r["mid"]), r["snip"]) for r in rows]

    # -- presets -----------------------------------------------------------------------------

    def save_preset(self, name: str, settings: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO presets(name, settings) VALUES (?, ?)",
                (name, json.dumps(settings)),
            )

    def presets(self) -> dict[str, dict[str, Any]]:
        return {
            r[0]: json.loads(r[1])
            for r in self._db.execute("SELECT name, settings FROM presets ORDER BY name")
        }

    def delete_preset(self, name: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM presets WHERE name = ?", (name,))

    # -- whole conversations (export and import) ---------------------------------------------

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        """Every message of a conversation, every branch, oldest first."""
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        ).fetchall()
        return [_row_message(r) for r in rows]

    def restore(
        self, conversations: Sequence[tuple[StoredConversation, Sequence[StoredMessage]]]
    ) -> list[int]:
        """Store whole conversations read from elsewhere (an import) in one transaction, under
        new ids; returns them. Ids in the records are the records' own: a message's
        `parent_id` names an earlier message of its list (an unknown one: a root), the
        conversation's `active_leaf_id` one of its messages. A timestamp of 0 (unknown) is
        stored as now; tool calls are brought to the stored shape."""
        new_ids: list[int] = []
        self._check_kept([a for _, msgs in conversations for m in msgs for a in m.attachments])
        with self._tx() as db:
            for conv, msgs in conversations:
                now = self._clock()
                cur = db.execute(
                    "INSERT INTO conversations(title, created_at, updated_at, pinned, settings) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (
                        conv.title,
                        conv.created_at or now,
                        conv.updated_at or now,
                        int(conv.pinned),
                        json.dumps(conv.settings),
                    ),
                )
                cid = int(cur.lastrowid or 0)
                stored: dict[int, int] = {}
                for m in msgs:
                    cur = db.execute(
                        "INSERT INTO messages(conversation_id, parent_id, role, content, "
                        "created_at, status, model, stats, sampling, thinking, tool_calls, "
                        "tool_call_id, tool_name, grounding, attachments) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            cid,
                            stored.get(m.parent_id) if m.parent_id is not None else None,
                            m.role,
                            m.content,
                            m.created_at or now,
                            m.status,
                            m.model,
                            json.dumps(m.stats),
                            json.dumps(m.sampling),
                            m.thinking,
                            json.dumps(stored_tool_calls(m.tool_calls), ensure_ascii=False),
                            m.tool_call_id,
                            m.tool_name,
                            json.dumps(stored_grounding(m.grounding), ensure_ascii=False),
                            _attachments_json(m.attachments),
                        ),
                    )
                    stored[m.id] = int(cur.lastrowid or 0)
                leaf = conv.active_leaf_id
                db.execute(
                    "UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                    (stored.get(leaf) if leaf is not None else None, cid),
                )
                new_ids.append(cid)
        return new_ids


class StreamWriter:
    """Persists a streaming answer (its text and its thinking) at most every `interval_s`
    (and always at the end), so an app killed mid-answer loses at most about that much."""

    def __init__(
        self,
        store: ChatStore,
        message_id: int,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.message_id = message_id
        self.interval_s = interval_s
        self._clock = clock
        self._last = clock()
        self._text = ""
        self._saved = ""
        self._thinking = ""
        self._saved_thinking = ""

    def append(self, piece: str) -> None:
        self._text += piece
        if self._clock() - self._last >= self.interval_s:
            self.flush()

    def append_thinking(self, piece: str) -> None:
        self._thinking += piece
        if self._clock() - self._last >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        if self._text != self._saved or self._thinking != self._saved_thinking:
            self.store.update_message(
                self.message_id,
                content=self._text,
                thinking=self._thinking if self._thinking != self._saved_thinking else None,
            )
            self._saved = self._text
            self._saved_thinking = self._thinking
        self._last = self._clock()

    def finish(
        self,
        *,
        status: str = "complete",
        stats: dict[str, Any] | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> None:
        """The answer's last write; `tool_calls`: the calls the model ended with (stored
        'pending' unless they carry a decision), in the same write as its final text."""
        self.store.update_message(
            self.message_id,
            content=self._text,
            status=status,
            stats=stats,
            thinking=self._thinking,
            tool_calls=tool_calls,
        )
        self._saved = self._text
        self._saved_thinking = self._thinking

    @property
    def text(self) -> str:
        return self._text

    @property
    def thinking(self) -> str:
        return self._thinking


def default_store_path(data_dir: Path) -> Path:
    return data_dir / "chats.sqlite3"
