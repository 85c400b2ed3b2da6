"""`candlewick models use-stt` and the speech-to-text rows of `models list`.

whisper.cpp's models are listed beside the GGUF models with their kind, what they are and
the memory whisper.cpp will take; `use-stt` makes one the transcription model (kept in the
profile, used by push-to-talk and hands-free voice).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from app.cli.common import CliError
from app.services.paths import AppPaths
from app.services.speech_models import (
    KIND,
    SpeechLibrary,
    SpeechModel,
    clear_stt_model,
)
from engine.model.gguf import human_bytes
from engine.model.whisper_file import read_whisper


def register(msub: Any) -> None:
    u = msub.add_parser(
        "use-stt",
        help="choose the speech-to-text (whisper.cpp) model voice input uses",
    )
    u.add_argument("model", nargs="?", help="its id from `models list`, or a ggml .bin file")
    u.add_argument("--clear", action="store_true", help="choose no transcription model")
    u.set_defaults(handler=use_stt)


def speech_library() -> SpeechLibrary:
    return SpeechLibrary.default(AppPaths.default())


def speech_rows() -> list[tuple[str, ...]]:
    """`models list`'s rows for speech models, in its columns: ID NAME KIND ARCH PARAMS
    QUANT SIZE SOURCE, and the memory whisper.cpp takes where a chat model's context is."""
    rows: list[tuple[str, ...]] = []
    for e in speech_library().entries():
        source = e.source + (" (chosen)" if e.chosen else "")
        f, m = e.file, e.memory
        if f is None or m is None:
            rows.append(
                (e.id, e.path.name, KIND, "-", "-", "-", "-", source, f"unusable: {e.error}")
            )
            continue
        rows.append(
            (
                e.id,
                e.name,
                KIND,
                "whisper",
                f.model_type,
                f.file_type.upper(),
                human_bytes(f.size),
                source,
                f"memory {human_bytes(m.total)}",
            )
        )
    return rows


def speech_dicts() -> list[dict[str, Any]]:
    return [e.to_dict() for e in speech_library().entries()]


def use_stt(args: argparse.Namespace) -> int:
    lib = speech_library()
    if args.clear:
        clear_stt_model()
        print("No speech-to-text model is chosen now.")
        return 0
    if not args.model:
        current = lib.current()
        if current is None:
            print("No speech-to-text model chosen (candlewick models use-stt NAME|PATH).")
            return 0
        print(_describe(current))
        return 0
    chosen = lib.choose(args.model)
    print(f"Speech to text: {_describe(chosen)}")
    return 0


def _describe(e: SpeechModel) -> str:
    f, m = e.file, e.memory
    if f is None or m is None:
        return f"{e.id} ({e.path}): unusable: {e.error}"
    return f"{e.id} — {f.description}, needs {human_bytes(m.total)} ({e.path})"


def import_speech(path: Path, *, copy: bool) -> str:
    """`models import` of a whisper.cpp file: a copy goes into the library's folder; a file
    left in place is used by choosing it (`use-stt PATH`)."""
    read_whisper(path)  # WhisperFileError: one line
    if not copy:
        raise CliError(
            f"{path.name} is a speech-to-text model: import it with --copy, or use it in place "
            f"with `candlewick models use-stt {path}`"
        )
    folder = AppPaths.default().models / "speech"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    if target.exists():
        raise CliError(f"{target.name} is already in the library")
    part = target.with_name(target.name + ".incomplete")
    try:
        shutil.copyfile(path, part)
        part.replace(target)
    finally:
        part.unlink(missing_ok=True)
    return next(e.id for e in speech_library().entries() if e.path == target)


def is_speech_id(id_: str) -> bool:
    return any(e.id == id_ for e in speech_library().entries())


def delete_speech(id_: str, *, yes: bool) -> int:
    """`models delete` of a speech model: asks first, as for any model."""
    lib = speech_library()
    e = lib.entry(id_)
    if e.warning:
        print(f"Warning: {e.warning}", file=sys.stderr)
    if not yes and not sys.stdin.isatty():
        raise CliError(f"not deleting '{e.id}' ({e.path.name}) without confirmation: add --yes")
    if not yes and input(f"Delete '{e.id}' ({e.path})? [y/N] ").strip().lower() not in ("y", "yes"):
        print("Nothing deleted.", file=sys.stderr)
        return 1
    gone, freed = lib.delete(id_)
    print(f"Deleted '{gone.id}', freed {human_bytes(freed)}")
    return 0
