"""`candlewick models ...`: the local library and the Hugging Face Hub.

search/files/download talk to the Hub (`HF_ENDPOINT` honoured); downloads land in the Hugging
Face cache (`HF_HOME` / `HF_HUB_CACHE` honoured) and are verified against the Hub's SHA-256.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from app.cli import model_settings_cli, quantize_cmd, speech_models_cmd
from app.cli.common import CliError, library, print_json
from app.services.download_jobs import DONE, FAILED, PAUSED, DownloadJob
from app.services.download_manager import DownloadManager
from app.services.hub import (
    HubClient,
    HubError,
    ModelVariant,
    RepoDetails,
    default_fit,
    header_speed,
)
from app.services.library import LibraryEntry
from app.services.paths import AppPaths
from app.services.projectors import choose_projector
from app.services.secrets import TokenStore
from app.services.speed_records import SpeedService
from engine.model.gguf import human_bytes
from engine.model.whisper_file import is_whisper_file


def register(sub: Any) -> None:
    p = sub.add_parser("models", help="manage local models and find new ones on the Hub")
    msub = p.add_subparsers(dest="models_command", metavar="SUBCOMMAND", required=True)
    ls = msub.add_parser(
        "list", help="list local models (including other tools' models and speech-to-text ones)"
    )
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=list_models)

    s = msub.add_parser("search", help="search the Hugging Face Hub for GGUF models")
    s.add_argument("query")
    s.add_argument("--sort", choices=["downloads", "likes", "updated"], default="downloads")
    s.add_argument("--limit", type=int, default=20)
    s.add_argument("--json", action="store_true")
    s.add_argument(
        "--speech",
        action="store_true",
        help="speech-to-text repositories (whisper.cpp's ggml files) instead of GGUF ones",
    )
    s.set_defaults(handler=_hub_errors(search))

    f = msub.add_parser("files", help="list a repository's GGUF files by quantization")
    f.add_argument("repo", help="owner/name")
    f.add_argument("--json", action="store_true")
    f.add_argument(
        "--no-fit",
        action="store_true",
        help="skip the memory fit check and the speed prediction",
    )
    f.set_defaults(handler=_hub_errors(files))

    d = msub.add_parser("download", help="download and verify a GGUF file (resumes)")
    d.add_argument("repo", help="owner/name")
    d.add_argument("file", help="file name from `models files` (a sharded model: any shard)")
    d.add_argument(
        "--no-projector",
        action="store_true",
        help="leave out the repository's projector (mmproj), which comes with a model by default",
    )
    d.set_defaults(handler=_hub_errors(download))

    rm = msub.add_parser("delete", help="delete a model from disk (asks first)")
    rm.add_argument("id", help="model id from `models list`")
    rm.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    rm.set_defaults(handler=delete)

    im = msub.add_parser(
        "import", help="add a .gguf file (or a whisper.cpp .bin, with --copy) to the library"
    )
    im.add_argument("path", type=Path)
    im.add_argument(
        "--copy",
        action="store_true",
        help="copy the file into Candlewick's folder (default: link to it in place)",
    )
    im.set_defaults(handler=import_model)

    tk = msub.add_parser(
        "token",
        help="save the Hugging Face access token (read from stdin) "
        "in the system keyring, for gated/private repositories",
    )
    tk.add_argument("--clear", action="store_true", help="forget the saved token")
    tk.set_defaults(handler=token)

    quantize_cmd.register(msub)
    model_settings_cli.register(msub)
    speech_models_cmd.register(msub)


def _hub_errors(
    handler: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """Hub errors are user errors: one line, exit 2."""

    @functools.wraps(handler)
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except HubError as e:
            raise CliError(str(e)) from None

    return wrapped


def _hub(*, fit: bool = False) -> HubClient:
    """`fit`: with the memory fit badge and the decode speed predicted on this machine (its
    figures are measured the first time, a few seconds, then kept in the data folder)."""
    speed = header_speed(SpeedService(AppPaths.default().data)) if fit else None
    return HubClient(token=TokenStore().get, fit=default_fit() if fit else None, speed=speed)


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])


def list_models(args: argparse.Namespace) -> int:
    entries = library().entries()
    if args.json:
        print_json(
            [{**e.to_dict(), "kind": _kind(e)} for e in entries] + speech_models_cmd.speech_dicts()
        )
        return 0
    speech = speech_models_cmd.speech_rows()
    if not entries and not speech:
        print("No local models. The bundled default is missing: run the set-up again.")
        return 0
    rows = [("ID", "NAME", "KIND", "ARCH", "PARAMS", "QUANT", "SIZE", "SOURCE", "CONTEXT")]
    for e in entries:
        source = _source_label(e)
        if e.facts is None:
            rows.append(
                (e.id, e.path.name, "-", "-", "-", "-", "-", source, f"unusable: {e.error}")
            )
            continue
        f = e.facts
        rows.append(
            (
                e.id,
                e.name,
                _kind(e),
                f.architecture,
                f.params_label,
                f.quantization,
                human_bytes(f.file_bytes),
                source,
                str(f.context_length),
            )
        )
    _table(rows + speech)
    return 0


def _kind(e: LibraryEntry) -> str:
    """What a GGUF model is for: text (chat), embedding or reranker."""
    f = e.facts
    if f is None:
        return "-"
    return "reranker" if f.is_reranker else "embedding" if f.embedding_only else "text"


def _source_label(e: LibraryEntry) -> str:
    if e.linked:
        return "imported (link)"
    return e.source


def search(args: argparse.Namespace) -> int:
    results = _hub().search(
        args.query, sort=args.sort, limit=max(1, args.limit), speech=args.speech
    )
    if args.json:
        print_json([r.to_dict() for r in results])
        return 0
    if not results:
        what = "speech-to-text" if args.speech else "GGUF"
        print(f"No {what} repositories match '{args.query}'.")
        return 0
    rows = [("REPO", "DOWNLOADS", "LIKES", "UPDATED", "ACCESS")]
    for r in results:
        rows.append(
            (
                r.repo_id,
                str(r.downloads),
                str(r.likes),
                (r.last_modified or "-")[:10],
                "gated" if r.gated else "open",
            )
        )
    _table(rows)
    return 0


def files(args: argparse.Namespace) -> int:
    hub = _hub(fit=not args.no_fit)
    details = hub.repo_details(args.repo)
    for v in details.variants if not args.no_fit else ():
        if v.kind == "speech":  # whisper.cpp's memory, from the file's first bytes
            details.fits[v.name] = hub.speech_fit(details.repo_id, details.commit or "main", v)
    if args.json:
        print_json(details.to_dict())
        return 0
    print(
        f"{details.repo_id}  license: {details.license or 'not stated'}"
        + ("  (gated: needs access)" if details.gated else "")
    )
    if details.summary:
        print(details.summary)
    if not details.variants:
        print("This repository has no GGUF or whisper.cpp model files.")
        return 0
    rows = [("FILE", "QUANT", "SIZE", "SHARDS", "CHAT SPEED", "FIT")]
    for v in details.variants:
        shards = f"{len(v.files)}/{v.shards_expected}" if v.shards_expected > 1 else "-"
        fit = details.fits.get(v.name, "-") if v.kind == "model" else _KIND_NOTE[v.kind]
        fit += f" {details.fits[v.name]}" if v.kind == "speech" and v.name in details.fits else ""
        badge = details.speeds.get(v.name)
        speed = badge.text if badge is not None else "-"
        rows.append(
            (v.name, v.quantization, f"{v.size} ({human_bytes(v.size)})", shards, speed, fit)
        )
    _table(rows)
    return 0


_KIND_NOTE = {"projector": "(vision projector)", "speech": "(speech to text)"}


def download(args: argparse.Namespace) -> int:
    hub = _hub()
    details = hub.repo_details(args.repo, with_fit=False)
    variant = details.variant(args.file)
    if variant is None:
        names = ", ".join(v.name for v in details.variants[:8]) or "none"
        raise CliError(f"{args.file} is not a GGUF file in {args.repo} (its model files: {names})")
    if not variant.complete:
        raise CliError(
            f"{variant.name} is missing shards on the Hub "
            f"({len(variant.files)} of {variant.shards_expected})"
        )
    # A vision or audio model comes with its projector, downloaded and verified with it.
    projector = None if args.no_projector else _projector_of(details, variant)
    unit = [variant, *([projector] if projector is not None else [])]
    manager = DownloadManager(library().downloads_state, hub, max_parallel=1)
    jobs: list[DownloadJob] = []
    try:
        for f in (f for v in unit for f in v.files):
            jobs.append(
                manager.add(
                    details.repo_id, f.filename, sha256=f.sha256, size=f.size, commit=details.commit
                )
            )
        done = _follow(manager, [j.id for j in jobs], sum(v.size for v in unit))
    except KeyboardInterrupt:
        manager.close()
        print(
            "\ncandlewick: download paused; run the same command again to resume", file=sys.stderr
        )
        return 130
    finally:
        manager.close()
    failed = [j for j in done if j.status != DONE]
    if failed:
        j = failed[0]
        raise CliError(j.error or f"download of {j.filename} stopped ({j.status})")
    path = Path(done[0].path or "")
    ids = [e.id for e in library().entries() if e.path == path]
    if variant.kind == "speech":
        ids = [e.id for e in speech_models_cmd.speech_library().entries() if e.path == path]
    with_projector = f" and its projector {projector.name}" if projector is not None else ""
    print(
        f"Downloaded and verified {variant.name} ({human_bytes(variant.size)})"
        f"{with_projector} -> {path}",
        file=sys.stderr,
    )
    if ids:
        print(ids[0])
    return 0


def _projector_of(details: RepoDetails, variant: ModelVariant) -> ModelVariant | None:
    """The repository's projector for `variant` (app.services.projectors' precision rule),
    None for a projector itself or a repository without one."""
    if variant.kind != "model":
        return None
    found = {v.name: v for v in details.variants if v.kind == "projector" and v.complete}
    chosen = choose_projector(Path(variant.name), (Path(n) for n in found))
    return found[chosen.name] if chosen is not None else None


def _follow(manager: DownloadManager, ids: list[str], total: int) -> list[DownloadJob]:
    """Show progress on stderr until every job settles."""
    tty = sys.stderr.isatty()
    last = 0.0
    while True:
        current = [j for j in (manager.get(i) for i in ids) if j is not None]
        pending = next((j.id for j in current if j.status not in (DONE, FAILED, PAUSED)), None)
        if pending is None:
            break
        now = time.monotonic()
        if now - last >= (0.25 if tty else 2.0):
            got = sum(j.done_bytes for j in current)
            speed = sum(j.speed_bps for j in current)
            eta = f"  ETA {int((total - got) / speed)}s" if speed > 0 else ""
            line = (
                f"downloading: {human_bytes(got)} / {human_bytes(total)} "
                f"({100 * got / max(total, 1):.0f}%)  {human_bytes(speed)}/s{eta}"
            )
            print(
                ("\r" + line.ljust(70)) if tty else line,
                end="" if tty else "\n",
                file=sys.stderr,
                flush=True,
            )
            last = now
        manager.wait(pending, timeout=0.25)
    final = [j for j in (manager.get(i) for i in ids) if j is not None]
    got = sum(j.done_bytes for j in final)
    line = (
        f"downloading: {human_bytes(got)} / {human_bytes(total)} ({100 * got / max(total, 1):.0f}%)"
    )
    print(("\r" + line.ljust(70) + "\n") if tty else line, file=sys.stderr, flush=True)
    return final


def delete(args: argparse.Namespace) -> int:
    if speech_models_cmd.is_speech_id(args.id):
        return speech_models_cmd.delete_speech(args.id, yes=args.yes)
    lib = library()
    plan = lib.plan_delete(args.id)
    what = plan.entry.label or plan.entry.path.name
    if not args.yes and not sys.stdin.isatty():
        raise CliError(
            f"not deleting '{plan.entry.id}' ({what}, frees "
            f"{human_bytes(plan.freed_bytes)}) without confirmation: add --yes"
        )
    print(
        f"Delete '{plan.entry.id}' ({what}): frees {human_bytes(plan.freed_bytes)}", file=sys.stderr
    )
    for f in plan.files:
        print(f"  {f}", file=sys.stderr)
    if plan.warning:
        print(f"Warning: {plan.warning}", file=sys.stderr)
    if not args.yes:
        answer = input("Delete? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("Nothing deleted.", file=sys.stderr)
            return 1
    done = lib.delete(args.id, allow_foreign=True)
    print(f"Deleted '{done.entry.id}', freed {human_bytes(done.freed_bytes)}")
    return 0


def import_model(args: argparse.Namespace) -> int:
    if is_whisper_file(args.path):
        id_ = speech_models_cmd.import_speech(args.path, copy=args.copy)
        print(f"Imported {args.path.name} as '{id_}' (speech to text), copied into the library")
        return 0
    entry = library().import_file(args.path, mode="copy" if args.copy else "link")
    how = "copied into the library" if args.copy else "linked (the file stays where it is)"
    print(f"Imported {args.path.name} as '{entry.id}', {how}")
    return 0


def token(args: argparse.Namespace) -> int:
    store = TokenStore()
    if args.clear:
        store.clear()
        print("Hub token forgotten.")
        return 0
    if not store.keyring_available:
        # A session-only token would vanish when this command exits: say so, store nothing.
        raise CliError(
            "no system keyring is available to keep the token; set the HF_TOKEN "
            "environment variable instead"
        )
    if sys.stdin.isatty():
        import getpass

        value = getpass.getpass("Hugging Face token (input hidden): ")
    else:
        value = sys.stdin.readline()
    try:
        result = store.set(value)
    except ValueError as e:
        raise CliError(str(e)) from None
    print(result.message)
    return 0
