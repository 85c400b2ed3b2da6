"""`candlewick models settings MODEL`: show or change the settings saved for one model (the
ones the window's Load, the Local server and `candlewick serve` apply), each value with
where it comes from."""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.common import CliError, library, print_json
from app.services.model_settings import KEYS, ModelSettingsStore, parse_value


def register(msub: Any) -> None:
    st = msub.add_parser(
        "settings",
        help="show or change the load settings and sampling defaults saved for a model",
        description="Saved settings apply wherever the model is loaded: the window, the "
        "Local server, `candlewick serve` (an option typed on its command line wins). "
        f"Keys: {', '.join(KEYS)}.",
    )
    st.add_argument("model", help="'default', a library id or a path to a .gguf file")
    st.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="save a value (repeatable), e.g. n_ctx=8192, n_gpu_layers=all, temperature=0.3",
    )
    st.add_argument(
        "--unset",
        action="append",
        default=[],
        metavar="KEY",
        help="forget one value: back to the default (repeatable)",
    )
    st.add_argument("--clear", action="store_true", help="forget every value saved for it")
    st.add_argument("--json", action="store_true")
    st.set_defaults(handler=run)


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for item in args.set:
        key, sep, text = item.partition("=")
        if not sep:
            raise CliError(f"--set takes KEY=VALUE, not {item!r}")
        try:
            changes[key.strip()] = parse_value(key.strip(), text.strip())
        except ValueError as e:
            raise CliError(str(e)) from None
    for key in args.unset:
        if key not in KEYS:
            raise CliError(f"unknown setting {key!r} (known: {', '.join(KEYS)})")
        changes[key] = None
    return changes


def run(args: argparse.Namespace) -> int:
    path = library().resolve(args.model)
    store = ModelSettingsStore.for_paths()
    changes = _changes(args)
    if args.clear:
        store.clear(path)
    if changes:
        store.update(path, changes)
    rows = store.get(path).describe()
    if args.json:
        print_json(
            {
                "model": str(path),
                "settings": {s.key: {"value": s.value, "source": s.source} for s in rows},
            }
        )
        return 0
    print(f"{path.name} ({path})")
    width = max(len(s.key) for s in rows)
    for s in rows:
        value = "-" if s.value is None else str(s.value)
        print(f"  {s.key:<{width}}  {value:<12}  {s.source}")
    return 0
