"""Tool use in the chat store (schema 4, migrated from 3): an answer's tool calls with the
person's decisions, their results chained below it, crash recovery of a running tool, the
branch as the model's OpenAI-shaped history, and the Markdown/JSON export and import."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.services.chat_exchange import export_all, export_markdown, import_data
from app.services.chat_history import history_messages
from app.services.chat_store import (
    SCHEMA_VERSION,
    TOOL_INTERRUPTED_NOTE,
    ChatStore,
    ChatStoreError,
    StreamWriter,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    s = ChatStore(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def call(cid: str, name: str, args: str, server: str | None = "files") -> dict[str, Any]:
    return {"id": cid, "name": name, "arguments": args, "server": server}


CALLS = [
    call("c1", "read_file", '{"path": "notes.txt"}'),
    call("c2", "list_dir", '{"path": "/nope"}'),
    call("c3", "delete_file", '{"path": "notes.txt"}'),
    call("c4", "search", '{"q": "lighthouse"}', server="web"),
    call("c5", "fetch", '{"url": "https://example.org"}', server="web"),
]


def tool_turn(store: ChatStore) -> tuple[int, int, int]:
    """A question, an answer with five calls and their results: complete, error, denied,
    cancelled, truncated. Returns (conversation, user message, assistant message)."""
    c = store.create_conversation()
    u = store.add_message(c.id, "user", "Summarise my notes")
    a = store.add_message(c.id, "assistant", "Let me look.", model="m", tool_calls=CALLS)
    for cid, decision in (
        ("c1", "allowed"),
        ("c2", "always"),
        ("c3", "denied"),
        ("c4", "allowed"),
        ("c5", "allowed"),
    ):
        store.set_tool_decision(a.id, cid, decision)
    store.add_tool_result(a.id, "c1", "Buy a lamp.", stats={"duration_s": 0.25})
    store.add_tool_result(a.id, "c2", "no such folder: /nope", status="error")
    store.add_tool_result(a.id, "c3", status="denied")
    store.add_tool_result(a.id, "c4", status="cancelled")
    store.add_tool_result(
        a.id, "c5", "<html>…\n[result truncated: 1 MiB, showing the first 64 KiB]", truncated=True
    )
    return c.id, u.id, a.id


def test_schema_4_migrates_a_version_3_database_keeping_its_data(tmp_path: Path) -> None:
    path = tmp_path / "v3.sqlite3"
    with ChatStore(path) as s:  # build the current schema, then take it back to version 3
        c = s.create_conversation("Old chat", settings={"system_prompt": "S"})
        u = s.add_message(c.id, "user", "old lighthouse question")
        s.add_message(c.id, "assistant", "first", stats={"gen_tokens": 1})
        second = s.add_message(c.id, "assistant", "second", parent_id=u.id, thinking="hm")
    db = sqlite3.connect(path)
    db.executescript(
        "ALTER TABLE messages DROP COLUMN attachments; "  # schema 6's
        "ALTER TABLE messages DROP COLUMN grounding; "  # schema 5's
        "ALTER TABLE messages DROP COLUMN tool_calls; "
        "ALTER TABLE messages DROP COLUMN tool_call_id; "
        "ALTER TABLE messages DROP COLUMN tool_name; PRAGMA user_version = 3;"
    )
    db.close()
    with ChatStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION >= 4
        conv = s.conversation(c.id)
        assert (conv.title, conv.settings, conv.active_leaf_id) == (
            "Old chat",
            {"system_prompt": "S"},
            second.id,
        )
        path_msgs = s.active_path(c.id)
        assert [
            (m.content, m.thinking, m.tool_calls, m.tool_call_id, m.tool_name) for m in path_msgs
        ] == [("old lighthouse question", "", [], None, None), ("second", "hm", [], None, None)]
        assert [m.content for m in s.siblings(second.id)] == ["first", "second"]
        assert s.children(u.id)[0].stats == {"gen_tokens": 1}
        assert [m.id for _, m, _ in s.search("lighthouse")] == [u.id]
        # Tool use works from then on.
        a = s.add_message(c.id, "assistant", "", tool_calls=[call("x", "t", "{}")])
        assert s.add_tool_result(a.id, "x", "ok").tool_call_id == "x"


def test_a_failed_migration_leaves_the_database_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "v3.sqlite3"
    with ChatStore(path) as s:
        s.add_message(s.create_conversation().id, "user", "kept")
    db = sqlite3.connect(path)
    # Version 3 with a stray tool_name column: the third ALTER of version 4 fails.
    db.executescript(
        "ALTER TABLE messages DROP COLUMN tool_calls; "
        "ALTER TABLE messages DROP COLUMN tool_call_id; PRAGMA user_version = 3;"
    )
    db.close()
    with pytest.raises(ChatStoreError, match="cannot be opened"):
        ChatStore(path)
    db = sqlite3.connect(path)
    cols = {r[1] for r in db.execute("PRAGMA table_info(messages)")}
    assert db.execute("PRAGMA user_version").fetchone()[0] == 3
    assert "tool_calls" not in cols and "tool_call_id" not in cols  # rolled back together
    assert db.execute("SELECT content FROM messages").fetchall() == [("kept",)]
    db.close()


def test_tool_calls_decisions_and_results_form_one_line_below_the_answer(store: ChatStore) -> None:
    cid, uid, aid = tool_turn(store)
    a = store.message(aid)
    assert a.tool_calls[0] == {
        "id": "c1",
        "name": "read_file",
        "arguments": '{"path": "notes.txt"}',
        "server": "files",
        "decision": "allowed",
    }
    assert [c["decision"] for c in a.tool_calls] == [
        "allowed",
        "always",
        "denied",
        "allowed",
        "allowed",
    ]
    path = store.active_path(cid)
    assert [m.role for m in path] == ["user", "assistant"] + ["tool"] * 5
    results = path[2:]
    # Each result under the one before: one line, no branches; the last is the active leaf.
    assert [m.parent_id for m in results] == [aid] + [m.id for m in results[:-1]]
    assert store.conversation(cid).active_leaf_id == results[-1].id
    assert all(store.branch_position(m.id) == (1, 1) for m in results)
    assert [(m.tool_call_id, m.tool_name, m.status, m.truncated) for m in results] == [
        ("c1", "read_file", "complete", False),
        ("c2", "list_dir", "error", False),
        ("c3", "delete_file", "denied", False),
        ("c4", "search", "cancelled", False),
        ("c5", "fetch", "complete", True),
    ]
    assert results[0].stats == {"duration_s": 0.25}
    # The model goes on below the last result.
    final = store.add_message(cid, "assistant", "Your notes say: buy a lamp.")
    assert final.parent_id == results[-1].id
    # Regenerating the tool-calling answer is a sibling with its own (empty) line...
    again = store.add_message(
        cid, "assistant", "Again.", parent_id=uid, tool_calls=[call("c1", "read_file", "{}")]
    )
    assert [m.id for m in store.active_path(cid)] == [uid, again.id]
    assert store.branch_position(again.id) == (2, 2)
    r = store.add_tool_result(again.id, "c1", "fresh")
    assert r.parent_id == again.id  # the same call id under the other answer is its own
    # ...and switching back follows the first answer's results to its final answer.
    assert store.switch_branch(aid)[-1].id == final.id


def test_tool_call_mistakes_are_refused(store: ChatStore) -> None:
    cid, uid, aid = tool_turn(store)
    with pytest.raises(ChatStoreError, match="already has a result"):
        store.add_tool_result(aid, "c1", "twice")
    with pytest.raises(ChatStoreError, match="no tool call 'zz'"):
        store.add_tool_result(aid, "zz", "x")
    with pytest.raises(ChatStoreError, match="no tool call"):
        store.add_tool_result(uid, "c1", "x")  # not an assistant message
    with pytest.raises(ChatStoreError, match="no tool call 'zz'"):
        store.set_tool_decision(aid, "zz", "allowed")
    with pytest.raises(ChatStoreError, match="unknown tool call decision"):
        store.set_tool_decision(aid, "c1", "maybe")
    with pytest.raises(ChatStoreError, match="unknown tool result status"):
        store.add_tool_result(aid, "c1", status="exploded")
    with pytest.raises(ChatStoreError, match="same id"):
        store.add_message(cid, "assistant", "", tool_calls=[call("d", "t", "{}")] * 2)
    with pytest.raises(ChatStoreError, match="needs an id and a name"):
        store.add_message(cid, "assistant", "", tool_calls=[{"name": "t"}])
    # An object for arguments is stored as the JSON text a model would have written.
    m = store.add_message(
        cid, "assistant", "", tool_calls=[{"id": "o", "name": "t", "arguments": {"a": 1}}]
    )
    assert m.tool_calls == [
        {"id": "o", "name": "t", "arguments": '{"a": 1}', "server": None, "decision": "pending"}
    ]


def test_a_tool_running_when_the_app_died_is_recovered_as_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    with ChatStore(path) as s:
        c = s.create_conversation()
        s.add_message(c.id, "user", "q")
        a = s.add_message(
            c.id,
            "assistant",
            "Checking.",
            tool_calls=[call("c1", "read_file", "{}"), call("c2", "slow", "{}")],
        )
        s.set_tool_decision(a.id, "c1", "allowed")
        done = s.add_tool_result(a.id, "c1", status="running", stats={"server": "files"})
        s.update_tool_result(
            done.id, content="text", status="complete", truncated=False, stats={"duration_s": 0.1}
        )
        running = s.add_tool_result(a.id, "c2", status="running")
        other = s.create_conversation()
        s.add_message(other.id, "user", "q2")
        streaming = s.add_message(other.id, "assistant", "half", status="streaming")
    # The app died with c2 running and an answer streaming elsewhere: the next start.
    with ChatStore(path) as s:
        recovered = s.recover_interrupted()
        assert [m.id for m in recovered] == [running.id, streaming.id]
        tool = s.message(running.id)
        assert (tool.status, tool.stats) == ("interrupted", {"error": TOOL_INTERRUPTED_NOTE})
        answer = s.message(streaming.id)
        assert (answer.status, answer.content, answer.stats) == ("interrupted", "half", {})
        finished = s.message(done.id)
        assert (finished.status, finished.content, finished.stats) == (
            "complete",
            "text",
            {"server": "files", "duration_s": 0.1},
        )
        assert s.recover_interrupted() == []
        assert history_messages(s.active_path(c.id))[-1] == {
            "role": "tool",
            "tool_call_id": "c2",
            "name": "slow",
            "content": "The tool call was interrupted before it finished; its result is unknown.",
        }


def test_update_tool_result_merges_stats_and_sets_truncated(store: ChatStore) -> None:
    c = store.create_conversation()
    a = store.add_message(c.id, "assistant", "", tool_calls=[call("c1", "t", "{}")])
    r = store.add_tool_result(a.id, "c1", status="running", stats={"server": "files"})
    store.update_tool_result(r.id, content="big…", status="complete", truncated=True)
    got = store.message(r.id)
    assert (got.content, got.status, got.truncated, got.stats) == (
        "big…",
        "complete",
        True,
        {"server": "files", "truncated": True},
    )
    store.update_tool_result(r.id, truncated=False)
    assert store.message(r.id).stats == {"server": "files"}
    with pytest.raises(ChatStoreError, match="not a tool result"):
        store.update_tool_result(a.id, content="x")


def test_stream_writer_finishes_an_answer_with_its_tool_calls(store: ChatStore) -> None:
    c = store.create_conversation()
    store.add_message(c.id, "user", "q")
    m = store.add_message(c.id, "assistant", "", status="streaming")
    w = StreamWriter(store, m.id, clock=lambda: 0.0)
    w.append("Let me check.")
    w.finish(stats={"stop_reason": "tool_calls"}, tool_calls=[call("c1", "read_file", "{}")])
    done = store.message(m.id)
    assert (done.content, done.status, [t["id"] for t in done.tool_calls]) == (
        "Let me check.",
        "complete",
        ["c1"],
    )
    assert done.tool_calls[0]["decision"] == "pending" and done.ended is None


def test_history_messages_in_openai_shape(store: ChatStore) -> None:
    cid, _, _ = tool_turn(store)
    store.add_message(cid, "assistant", "Your notes say: buy a lamp.", thinking="not sent")
    assert history_messages(store.active_path(cid), system_prompt="Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Summarise my notes"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in CALLS
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": "Buy a lamp."},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "name": "list_dir",
            "content": "Error: no such folder: /nope",
        },
        {
            "role": "tool",
            "tool_call_id": "c3",
            "name": "delete_file",
            "content": "The user denied this tool call.",
        },
        {
            "role": "tool",
            "tool_call_id": "c4",
            "name": "search",
            "content": "The tool call was cancelled.",
        },
        {
            "role": "tool",
            "tool_call_id": "c5",
            "name": "fetch",
            "content": "<html>…\n[result truncated: 1 MiB, showing the first 64 KiB]",
        },
        {"role": "assistant", "content": "Your notes say: buy a lamp."},
    ]


def test_history_answers_every_call_and_drops_what_a_server_would_refuse(store: ChatStore) -> None:
    c = store.create_conversation()
    store.add_message(c.id, "user", "q")
    a = store.add_message(
        c.id,
        "assistant",
        "",
        tool_calls=[call("c1", "one", "{}"), call("c2", "two", "{}"), call("c3", "three", "{}")],
    )
    store.set_tool_decision(a.id, "c2", "denied")
    # Results stored out of call order, one call (denied) without a result, one never decided.
    store.add_tool_result(a.id, "c3", "three done")
    store.add_tool_result(a.id, "c1", "", status="error", stats={"error": "timed out"})
    store.add_message(c.id, "assistant", "", status="error", stats={"error": "boom"})
    store.add_message(c.id, "user", "again?")
    out = history_messages(store.active_path(c.id))
    assert [(m["role"], m.get("tool_call_id"), m["content"]) for m in out] == [
        ("user", None, "q"),
        ("assistant", None, ""),  # a turn with calls only: empty text, as the engine takes it
        ("tool", "c1", "Error: timed out"),
        ("tool", "c2", "The user denied this tool call."),
        ("tool", "c3", "three done"),
        ("user", None, "again?"),  # the failed answer is left out
    ]
    # A result whose turn is not sent (its answer failed) is dropped with it.
    bad = store.add_message(
        c.id, "assistant", "x", status="error", tool_calls=[call("z", "t", "{}")]
    )
    store.add_tool_result(bad.id, "z", "orphan")
    assert history_messages(store.active_path(c.id)) == out


def test_json_export_carries_every_tool_field_and_imports_back(
    store: ChatStore, tmp_path: Path
) -> None:
    cid, _, aid = tool_turn(store)
    store.add_message(cid, "assistant", "Done.")
    data = export_all(store, [cid])
    (conv,) = data["conversations"]
    a = next(m for m in conv["messages"] if m["id"] == aid)
    assert a["tool_calls"] == store.message(aid).tool_calls
    assert (a["tool_call_id"], a["tool_name"]) == (None, None)
    results = [m for m in conv["messages"] if m["role"] == "tool"]
    assert [
        (m["tool_call_id"], m["tool_name"], m["status"], m["stats"].get("truncated"))
        for m in results
    ] == [
        ("c1", "read_file", "complete", None),
        ("c2", "list_dir", "error", None),
        ("c3", "delete_file", "denied", None),
        ("c4", "search", "cancelled", None),
        ("c5", "fetch", "complete", True),
    ]
    with ChatStore(tmp_path / "other.sqlite3") as other:
        (new_id,) = import_data(other, json.loads(json.dumps(data)))
        again = export_all(other)["conversations"][0]

        def strip(ms: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{k: v for k, v in m.items() if k not in ("id", "parent_id")} for m in ms]

        assert strip(again["messages"]) == strip(conv["messages"])
        assert strip(again["tree"]) == strip(conv["tree"])
        assert history_messages(other.active_path(new_id)) == history_messages(
            store.active_path(cid)
        )
        # An export taken while a tool ran imports as interrupted: nothing will finish it.
        running = json.loads(json.dumps(conv))
        running["tree"][-2]["status"] = "running"
        (rid,) = import_data(other, running)
        assert other.active_path(rid)[-2].status == "interrupted"
        # Bad calls are refused, nothing half-imported.
        broken = json.loads(json.dumps(conv))
        broken["tree"][1]["tool_calls"] = [{"id": "c1"}]
        with pytest.raises(ChatStoreError, match="message #2: a tool call needs"):
            import_data(other, broken)
        assert len(other.conversations()) == 2


def test_markdown_export_shows_calls_and_results_as_blocks(store: ChatStore) -> None:
    cid, _, _ = tool_turn(store)
    c = store.create_conversation()
    odd = store.add_message(
        c.id, "assistant", "", tool_calls=[call("b", "run", '{"code": "```"', server=None)]
    )
    store.add_tool_result(odd.id, "b", "has ``` inside", status="error")
    md = export_markdown(export_all(store, [cid, c.id])["conversations"])
    assert (
        "**Assistant**:\n\nLet me look.\n\n"
        "**Tool call** `read_file` on `files` (allowed):\n\n"
        '```json\n{\n  "path": "notes.txt"\n}\n```\n'
    ) in md
    assert "**Tool call** `list_dir` on `files` (always allowed):" in md
    assert "**Tool call** `delete_file` on `files` (denied by the user):" in md
    assert "**Tool result** `read_file`:\n\n```\nBuy a lamp.\n```\n" in md
    assert "**Tool result** `list_dir` (error):\n\n```\nno such folder: /nope\n```\n" in md
    assert "**Tool result** `delete_file` (denied by the user):\n\n*(no output)*\n" in md
    assert "**Tool result** `search` (cancelled):" in md
    assert "**Tool result** `fetch` (truncated):\n\n```\n<html>…\n[result truncated" in md
    # Broken JSON is shown as written; a fence is longer than any backtick run inside.
    assert (
        "**Assistant**:\n\n**Tool call** `run` (awaiting approval):\n\n"
        '````\n{"code": "```"\n````\n' in md
    )
    assert "**Tool result** `run` (error):\n\n````\nhas ``` inside\n````\n" in md


def test_tool_results_are_searched(store: ChatStore) -> None:
    cid, _, _ = tool_turn(store)
    hits = store.search("lamp")
    assert [(c.id, m.role, m.tool_name) for c, m, _ in hits] == [(cid, "tool", "read_file")]
