"""`candlewick connections list|add|remove|test|models`: remote engines (OpenAI or Ollama API).

API keys go to the system keyring; on a machine without one, save the connection with
`--api-key-env VAR` and keep the key in that environment variable instead.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from app.cli.common import CliError, print_json
from app.services.connections import Connection, ConnectionsError, ConnectionStore
from engine.remote.engines import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_TIMEOUT_S
from engine.remote.streaming import APIS


def register(sub: Any) -> None:
    p = sub.add_parser("connections", help="remote engines: servers with an OpenAI or Ollama API")
    cmds = p.add_subparsers(dest="connections_command", metavar="ACTION", required=True)

    ls = cmds.add_parser("list", help="the saved connections")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=list_cmd)

    add = cmds.add_parser("add", help="save a connection (replace one with --replace)")
    add.add_argument("name")
    add.add_argument("url", help="the server root, e.g. http://gpu-box:8000 (a /v1 suffix is fine)")
    add.add_argument(
        "--api",
        choices=APIS,
        default="openai",
        help="API dialect (vLLM, llama-server, LM Studio: openai)",
    )
    add.add_argument("--model", default="", help="default model id (default: the server's first)")
    key = add.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key",
        default=None,
        help="API key, kept in the system keyring (it also stays in your shell "
        "history: prefer --api-key-stdin)",
    )
    key.add_argument(
        "--api-key-stdin",
        action="store_true",
        help="read the API key from the first line of standard input",
    )
    key.add_argument(
        "--api-key-env",
        metavar="VAR",
        default=None,
        help="read the API key from this environment variable at each use "
        "(for machines without a keyring)",
    )
    add.add_argument(
        "--no-verify-tls",
        action="store_true",
        help="accept any HTTPS certificate (self-signed test servers only)",
    )
    add.add_argument("--ca-file", default=None, help="PEM file of a private certificate authority")
    add.add_argument(
        "--connect-timeout",
        type=float,
        default=DEFAULT_CONNECT_TIMEOUT_S,
        metavar="S",
        help="seconds to wait for the connection",
    )
    add.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="seconds the server may stay silent while answering",
    )
    add.add_argument("--replace", action="store_true", help="overwrite a connection of that name")
    add.set_defaults(handler=add_cmd)

    rm = cmds.add_parser("remove", help="forget a connection and its key")
    rm.add_argument("name")
    rm.set_defaults(handler=remove_cmd)

    test = cmds.add_parser("test", help="connect, check the key, list the models")
    test.add_argument("name")
    test.add_argument("--json", action="store_true")
    test.set_defaults(handler=test_cmd)

    models = cmds.add_parser("models", help="the models a connection's server offers")
    models.add_argument("name")
    models.add_argument("--json", action="store_true")
    models.set_defaults(handler=models_cmd)


def _store() -> ConnectionStore:
    return ConnectionStore()


def _describe_key(store: ConnectionStore, c: Connection) -> str:
    if c.key_env:
        return f"${c.key_env}" + ("" if store.has_key(c.name) else " (not set)")
    return "keyring" if store.has_key(c.name) else "none"


def list_cmd(args: argparse.Namespace) -> int:
    store = _store()
    try:
        items = store.connections()
        rows = [(c, _describe_key(store, c)) for c in items]
    except ConnectionsError as e:
        raise CliError(str(e)) from None
    if args.json:
        print_json([{**c.to_json(), "api_key": key} for c, key in rows])
        return 0
    if not rows:
        print("no connections yet: add one with `candlewick connections add NAME URL`")
        return 0
    for c, key in rows:
        tls = "" if c.verify_tls else ", TLS not verified"
        model = c.model or "(server's first model)"
        print(f"{c.name}\t{c.api}\t{c.base_url}\t{model}\tkey: {key}{tls}")
    return 0


def add_cmd(args: argparse.Namespace) -> int:
    store = _store()
    api_key: str | None = args.api_key
    if args.api_key_stdin:
        api_key = sys.stdin.readline().strip() or None
        if api_key is None:
            raise CliError("no API key on standard input")
    if api_key and not store.secrets.keyring_available:
        raise CliError(
            "no system keyring is available to keep the API key; save the "
            "connection with --api-key-env VAR and put the key in that variable"
        )
    conn = Connection(
        name=args.name,
        base_url=args.url,
        api=args.api,
        model=args.model,
        verify_tls=not args.no_verify_tls,
        ca_file=args.ca_file,
        connect_timeout_s=args.connect_timeout,
        timeout_s=args.timeout,
        key_env=args.api_key_env,
    )
    try:
        saved = store.add(conn, api_key, replace=args.replace)
    except ConnectionsError as e:
        raise CliError(str(e)) from None
    note = f"; {saved.message}" if saved else ""
    if args.api_key_env:
        note = f"; API key read from ${args.api_key_env}"
    print(f"saved connection {conn.name!r}{note}")
    return 0


def remove_cmd(args: argparse.Namespace) -> int:
    try:
        _store().remove(args.name)
    except ConnectionsError as e:
        raise CliError(str(e)) from None
    print(f"removed connection {args.name!r}")
    return 0


def test_cmd(args: argparse.Namespace) -> int:
    try:
        result = _store().check(args.name)
    except ConnectionsError as e:
        raise CliError(str(e)) from None
    if args.json:
        print_json(
            {
                "ok": result.ok,
                "message": result.message,
                "models": list(result.models),
                "latency_s": result.latency_s,
                "error_kind": result.error.kind if result.error else None,
            }
        )
        return 0 if result.ok else 1
    if not result.ok:
        raise CliError(result.message)
    print(f"{args.name}: ok, {result.message}")
    return 0


def models_cmd(args: argparse.Namespace) -> int:
    try:
        models = _store().engine(args.name).list_models()
    except ConnectionsError as e:
        raise CliError(str(e)) from None
    if args.json:
        print_json(models)
    else:
        for m in models:
            print(m)
    return 0
