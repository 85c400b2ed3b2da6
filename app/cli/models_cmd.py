"""`candlewick models ...`: the local library."""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.common import library, print_json
from engine.gguf import human_bytes


def register(sub: Any) -> None:
    p = sub.add_parser("models", help="manage local models")
    msub = p.add_subparsers(dest="models_command", metavar="SUBCOMMAND", required=True)
    ls = msub.add_parser("list", help="list local models")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=list_models)


def list_models(args: argparse.Namespace) -> int:
    entries = library().entries()
    if args.json:
        print_json([e.to_dict() for e in entries])
        return 0
    if not entries:
        print("No local models. The bundled default is missing: run the set-up again.")
        return 0
    rows = [("ID", "NAME", "ARCH", "PARAMS", "QUANT", "SIZE", "CONTEXT")]
    for e in entries:
        if e.facts is None:
            rows.append((e.id, e.path.name, "-", "-", "-", "-", f"unusable: {e.error}"))
            continue
        f = e.facts
        rows.append((e.id, f.name, f.architecture, f.params_label, f.quantization,
                     human_bytes(f.file_bytes), str(f.context_length)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    return 0
