"""Chat export and import files: what `candlewick chats export|import` and the window's
Export and Import write and read.

JSON is lossless (every branch, settings, stats, tool calls and results, the passages a
grounded answer was given, attached images and audio: each file once, in base64, under
`attachments` by its SHA-256) and is what `import_data` reads back, along with a plain list of
conversations that have `messages`; Markdown is for reading (each chat's active branch; a
grounded answer lists its Sources). The storage is `ChatStore`'s: this module only turns its
conversations into files and files into conversations.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.services.atomic_write import write_text_atomic
from app.services.attachments import Attachment, AttachmentError, attachments_of, sha256_of
from app.services.chat_store import (
    DEFAULT_TITLE,
    TOOL_STATUSES,
    ChatStore,
    ChatStoreError,
    StoredConversation,
    StoredMessage,
    stored_grounding,
    stored_tool_calls,
)
from engine.rag.grounding import Grounding

EXPORT_FORMAT = "candlewick-chats"
EXPORT_VERSION = 1


# -- export ----------------------------------------------------------------------------------


def message_record(m: StoredMessage) -> dict[str, Any]:
    """A message as the JSON export writes it."""
    return {
        "id": m.id,
        "parent_id": m.parent_id,
        "role": m.role,
        "content": m.content,
        "created_at": m.created_at,
        "status": m.status,
        "model": m.model,
        "stats": m.stats,
        "sampling": m.sampling,
        "thinking": m.thinking,
        "tool_calls": m.tool_calls,
        "tool_call_id": m.tool_call_id,
        "tool_name": m.tool_name,
        "grounding": m.grounding,
        "attachments": [a.to_dict() for a in m.attachments],
        # Derived from status and stats (an import ignores it): a reader of the JSON sees
        # a stopped or cut-off answer without knowing the stats' vocabulary.
        "ended": m.ended,
    }


def export_conversation(store: ChatStore, conversation_id: int) -> dict[str, Any]:
    conv = store.conversation(conversation_id)
    return {
        "id": conv.id,
        "title": conv.title,
        "created_at": conv.created_at,
        "updated_at": conv.updated_at,
        "pinned": conv.pinned,
        "settings": conv.settings,
        "messages": [message_record(m) for m in store.active_path(conversation_id)],
        "active_leaf_id": conv.active_leaf_id,
        # Every branch, so an import restores the whole tree, not just the active path.
        "tree": [message_record(m) for m in store.messages(conversation_id)],
    }


def export_all(store: ChatStore, ids: Sequence[int] | None = None) -> dict[str, Any]:
    """The conversations `ids` (all when None) as the JSON export's object."""
    convs = [store.conversation(i) for i in ids] if ids is not None else store.conversations()
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "conversations": [export_conversation(store, c.id) for c in convs],
        "attachments": _files(store, convs),
    }


def _files(store: ChatStore, convs: Sequence[StoredConversation]) -> dict[str, str]:
    """The attached files of `convs`' messages, base64 by hash (a file gone from the disk
    is left out: its message is imported without it)."""
    out: dict[str, str] = {}
    for c in convs:
        for m in store.messages(c.id):
            for a in m.attachments:
                if a.sha256 in out:
                    continue
                try:
                    out[a.sha256] = base64.b64encode(store.attachment_data(a)).decode("ascii")
                except ChatStoreError:
                    continue
    return out


# -- Markdown --------------------------------------------------------------------------------------


# What the Markdown export says after "**Assistant**" for an answer cut short.
_ENDING_NOTES = {
    "stopped": "stopped by the user",
    "length": "cut off at the length limit",
    "context_full": "cut off: the context was full",
    "timeout": "cut off: it timed out",
    "interrupted": "interrupted",
    "error": "failed",
}


# What the Markdown export says of a tool call's decision and of a result's status.
_DECISION_NOTES = {
    "pending": "awaiting approval",
    "allowed": "allowed",
    "always": "always allowed",
    "denied": "denied by the user",
}
_RESULT_NOTES = {
    "running": "running",
    "error": "error",
    "denied": "denied by the user",
    "cancelled": "cancelled",
    "interrupted": "interrupted",
}


def _fenced(text: str, lang: str = "") -> str:
    # Longer than any backtick run inside, so the text cannot close the fence early.
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    body = text.rstrip("\n")
    return f"{fence}{lang}\n{body}\n{fence}\n"


def _tool_call_markdown(call: dict[str, Any]) -> str:
    where = f" on `{call['server']}`" if call.get("server") else ""
    decision = _DECISION_NOTES.get(call.get("decision") or "pending", str(call.get("decision")))
    args = str(call.get("arguments") or "")
    try:
        body = _fenced(json.dumps(json.loads(args or "{}"), indent=2, ensure_ascii=False), "json")
    except ValueError:  # the model wrote broken JSON: shown as it came
        body = _fenced(args)
    return f"**Tool call** `{call.get('name')}`{where} ({decision}):\n\n{body}"


def _tool_result_markdown(m: dict[str, Any]) -> str:
    st = m.get("stats") or {}
    notes = [_RESULT_NOTES[m["status"]]] if m.get("status") in _RESULT_NOTES else []
    if st.get("truncated"):
        notes.append("truncated")
    note = f" ({', '.join(notes)})" if notes else ""
    head = f"**Tool result** `{m.get('tool_name') or '?'}`{note}:\n\n"
    if m.get("content"):
        return head + _fenced(str(m["content"]))
    error = " ".join(str(st.get("error") or "").split())
    return head + (f"*{error}*\n" if error else "*(no output)*\n")


def _sources_markdown(grounding: dict[str, Any]) -> str:
    """A grounded answer's passages: "[1] guide.pdf, p. 4 (path)" and the passage quoted."""
    try:
        g = Grounding.from_dict(grounding)
    except ValueError:  # an export edited by hand: its sources are left out
        return ""
    if not g.sources:
        return ""
    out = ["**Sources**:\n"]
    for src in g.sources:
        out.append(f"- {src.label} (`{src.path}`, characters {src.start} to {src.end})\n")
        quoted = "\n".join(f"  > {line}".rstrip() for line in src.text.strip().splitlines())
        out.append(f"{quoted}\n")
    return "\n".join(out)


def export_markdown(conversations: Sequence[dict[str, Any]]) -> str:
    """Readable Markdown of exported conversations (their active branches)."""
    out: list[str] = []
    names = {"user": "You", "assistant": "Assistant", "system": "System", "tool": "Tool"}
    for c in conversations:
        out.append(f"# {c['title']}\n")
        settings = c.get("settings") or {}
        system = str(settings.get("system_prompt") or "").strip()
        if system:
            # Every line quoted: a prompt of several paragraphs stays one block.
            out.append(
                "\n".join(f"> {line}".rstrip() for line in f"System prompt: {system}".splitlines())
                + "\n"
            )
        for m in c["messages"]:
            if m["role"] == "tool":
                out.append(_tool_result_markdown(m))
                continue
            who = names.get(m["role"], m["role"])
            ended = m.get("ended")
            if ended is None and m.get("status") == "interrupted":  # an older export's
                ended = "interrupted"
            note = f" ({_ENDING_NOTES.get(ended, ended)})" if ended else ""
            out.append(f"**{who}**{note}:\n")
            if m.get("thinking"):
                out.append(
                    f"<details><summary>Thinking</summary>\n\n{m['thinking']}\n\n</details>\n"
                )
            calls = m.get("tool_calls") or []
            if m["content"] or not calls:
                out.append(f"{m['content']}\n")
            out.extend(_tool_call_markdown(call) for call in calls)
            for a in m.get("attachments") or []:
                out.append(f"*Attached {a.get('kind', 'file')}: {a.get('name', '')}*\n")
            if m.get("grounding"):
                sources = _sources_markdown(m["grounding"])
                if sources:
                    out.append(sources)
            st = m.get("stats") or {}
            line = [str(m["model"])] if m["role"] == "assistant" and m.get("model") else []
            if m["role"] == "assistant" and st.get("gen_tps"):
                line.append(
                    f"{st.get('gen_tokens', 0)} tokens, {st['gen_tps']:.1f} tok/s, "
                    f"first token after {st.get('ttft_s', 0):.2f} s"
                )
            if ended == "error" and st.get("error"):
                line.append(" ".join(str(st["error"]).split()))
            if line:
                out.append(f"*{' · '.join(line)}*\n")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def export_text(data: dict[str, Any], fmt: str) -> str:
    """An `export_all` result as a file's text: 'md' (readable, the current branches) or
    'json' (lossless, every branch; what `import_data` reads back)."""
    if fmt == "md":
        return export_markdown(data["conversations"])
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"


def write_export(
    store: ChatStore, path: Path | str, fmt: str, ids: Sequence[int] | None = None
) -> int:
    """Export the conversations `ids` (all when None) to `path` as `fmt` ('md' or 'json'),
    atomically: a failed write leaves no half-written file under that name (and an older
    file there as it was). Returns how many chats were written; `OSError` as it came."""
    data = export_all(store, ids)
    write_text_atomic(path, export_text(data, fmt))
    return len(data["conversations"])


# -- import ----------------------------------------------------------------------------------


def import_data(store: ChatStore, data: Any) -> list[int]:
    """Import an export (ours, or a plain list of conversations with `messages`) into
    `store`, all or nothing. Ids are assigned anew; returns the new conversation ids.
    `ChatStoreError` (one line naming the conversation and message) for a file that is not
    one."""
    convs = data.get("conversations") if isinstance(data, dict) else data
    if isinstance(data, dict) and "conversations" not in data and "messages" in data:
        convs = [data]
    if not isinstance(convs, list):
        raise ChatStoreError("not a Candlewick chat export (no list of conversations)")
    records: list[tuple[StoredConversation, list[StoredMessage]]] = []
    for i, c in enumerate(convs):
        if not isinstance(c, dict):
            raise ChatStoreError(f"conversation #{i + 1} in the file is not an object")
        records.append(_read_conversation(c, i))
    files = data.get("attachments") if isinstance(data, dict) else None
    _keep_files(store, records, files if isinstance(files, dict) else {})
    return store.restore(records)


def _keep_files(
    store: ChatStore,
    records: list[tuple[StoredConversation, list[StoredMessage]]],
    files: dict[str, Any],
) -> None:
    """Write the attached files the messages refer to before the messages are stored (a
    crash in between leaves files that the next start sweeps, never a message without its
    file). A reference whose file is neither here already nor in the export (or whose bytes
    there are not what its hash says) is dropped from its message."""
    kept: dict[str, bool] = {}
    for _, msgs in records:
        for m in msgs:
            for a in m.attachments:
                if a.sha256 not in kept:
                    kept[a.sha256] = _keep_file(store, a, files.get(a.sha256))
            m.attachments = [a for a in m.attachments if kept[a.sha256]]


def _keep_file(store: ChatStore, a: Attachment, encoded: Any) -> bool:
    if store.files is not None and store.files.has(a.sha256):
        return True  # the same bytes are here already (the hash names them)
    if not isinstance(encoded, str):
        return False
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return False
    if sha256_of(data) != a.sha256:
        return False
    store.save_attachment(data, a.name, a.kind)
    return True


def _timestamp(value: Any) -> float:
    return float(value or 0)  # 0: unknown, the store writes the time of the import


def _read_conversation(
    c: dict[str, Any], index: int
) -> tuple[StoredConversation, list[StoredMessage]]:
    """One exported conversation as records for `ChatStore.restore`: a message's id is its
    place in the list and its parent the place of the message it answers."""
    tree = c.get("tree") if isinstance(c.get("tree"), list) else None
    msgs = tree if tree is not None else c.get("messages", [])
    if not isinstance(msgs, list):
        raise ChatStoreError(f"conversation #{index + 1}: 'messages' is not a list")
    place: dict[Any, int] = {}  # a file's message id -> its place in `out`
    out: list[StoredMessage] = []
    for j, m in enumerate(msgs):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("content"), str)
            or m.get("role") not in ("system", "user", "assistant", "tool")
        ):
            raise ChatStoreError(
                f"conversation #{index + 1}, message #{j + 1}: needs a role and text content"
            )
        if tree is not None:
            parent = place.get(m.get("parent_id")) if m.get("parent_id") is not None else None
        else:  # the active branch alone: each message answers the one before
            parent = j - 1 if j else None
        try:
            calls = stored_tool_calls(m.get("tool_calls") or [])
            grounding = stored_grounding(m.get("grounding"))
            attached = attachments_of(m.get("attachments"))
        except AttachmentError as e:
            raise ChatStoreError(f"conversation #{index + 1}, message #{j + 1}: {e}") from None
        except ChatStoreError as e:
            raise ChatStoreError(f"conversation #{index + 1}, message #{j + 1}: {e}") from None
        thinking, call_id, tool_name = m.get("thinking"), m.get("tool_call_id"), m.get("tool_name")
        out.append(
            StoredMessage(
                id=j,
                conversation_id=0,
                parent_id=parent,
                role=m["role"],
                content=m["content"],
                created_at=_timestamp(m.get("created_at")),
                status=_imported_status(m),
                model=m.get("model"),
                stats=m.get("stats") or {},
                sampling=m.get("sampling") or {},
                thinking=thinking if isinstance(thinking, str) else "",
                tool_calls=calls,
                tool_call_id=call_id if isinstance(call_id, str) else None,
                tool_name=tool_name if isinstance(tool_name, str) else None,
                grounding=grounding,
                attachments=attached,
            )
        )
        place[m.get("id", j)] = j
    last = len(out) - 1 if out else None
    leaf = place.get(c.get("active_leaf_id")) if tree is not None else last
    conv = StoredConversation(
        id=index,
        title=str(c.get("title") or DEFAULT_TITLE),
        created_at=_timestamp(c.get("created_at")),
        updated_at=_timestamp(c.get("updated_at")),
        pinned=bool(c.get("pinned")),
        settings=c.get("settings") or {},
        active_leaf_id=leaf if leaf is not None else last,
    )
    return conv, out


def _imported_status(m: dict[str, Any]) -> str:
    status = m.get("status")
    if m.get("role") == "tool":
        # An export taken while a tool ran: nothing will finish that run any more.
        return (
            "interrupted"
            if status == "running"
            else (status if status in TOOL_STATUSES else "complete")
        )
    return status if status in ("complete", "interrupted", "error") else "complete"
