"""`candlewick chats ...`: list, export and import the chat history."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.cli.common import CliError, print_json
from app.services.atomic_write import write_text_atomic
from app.services.chat_exchange import export_all, export_markdown, import_data
from app.services.chat_store import ChatStore, default_store_path
from app.services.paths import AppPaths


def register(sub: Any) -> None:
    p = sub.add_parser("chats", help="the chat history: list, export, import")
    csub = p.add_subparsers(dest="chats_command", metavar="SUBCOMMAND", required=True)
    ls = csub.add_parser("list", help="list conversations")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=list_chats)
    ex = csub.add_parser("export", help="export one conversation or all of them")
    ex.add_argument("id", nargs="?", type=int, help="conversation id (default: all)")
    ex.add_argument("--format", choices=("json", "md"), default="json")
    ex.add_argument("--output", "-o", type=Path, help="write to a file instead of stdout")
    ex.set_defaults(handler=export_chats)
    im = csub.add_parser("import", help="import conversations from a JSON export")
    im.add_argument("file", type=Path)
    im.set_defaults(handler=import_chats)


def open_store() -> ChatStore:
    paths = AppPaths.default().ensure()
    return ChatStore(default_store_path(paths.data))


def list_chats(args: argparse.Namespace) -> int:
    with open_store() as store:
        convs = store.conversations()
        projects = {p.id: p.name for p in store.projects()}
        rows = [
            {
                "id": c.id,
                "title": c.title,
                "pinned": c.pinned,
                "updated_at": c.updated_at,
                "messages": len(store.active_path(c.id)),
                "project": projects.get(c.project_id) if c.project_id is not None else None,
            }
            for c in convs
        ]
    if args.json:
        print_json(rows)
    elif not rows:
        print("No conversations yet.")
    else:
        for r in rows:
            pin = "*" if r["pinned"] else " "
            where = f"  [{r['project']}]" if r["project"] else ""
            print(f"{r['id']:>5} {pin} {r['messages']:>4} msgs  {r['title']}{where}")
    return 0


def export_chats(args: argparse.Namespace) -> int:
    with open_store() as store:
        data = export_all(store, [args.id] if args.id is not None else None)
    if args.format == "json":
        # The documented contract is a list of conversations along their active branch.
        text = json.dumps(data["conversations"], indent=2, ensure_ascii=False) + "\n"
    else:
        text = export_markdown(data["conversations"])
    if args.output:
        write_text_atomic(args.output, text)  # never a half-written export under that name
    else:
        sys.stdout.write(text)
    return 0


def import_chats(args: argparse.Namespace) -> int:
    try:
        data = json.loads(args.file.read_text("utf-8"))
    except FileNotFoundError:
        raise CliError(f"file not found: {args.file}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CliError(f"{args.file} is not valid JSON: {e}") from None
    with open_store() as store:
        ids = import_data(store, data)
    print(f"imported {len(ids)} conversation{'s' if len(ids) != 1 else ''}")
    return 0
