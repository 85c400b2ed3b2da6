"""Quants made locally, added to the library.

`quantize_model(library, "default", "Q4_K_M")` makes the quant with engine.model.quantize
and makes sure the library lists it. Where it goes when no output is given: beside its source
when that folder is the user's and can be written to (a file imported by reference, a copy in
the library folder); in the library folder when the source is the bundled model (installed
inside a Python package), a verified download or another tool's file (the Hugging Face cache,
LM Studio's or Ollama's folders are theirs to manage). A quant outside the library folder is
added as a link, like `models import`.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from app.services.library import LibraryEntry, ModelLibrary
from app.services.paths import real_path
from engine.model.quant_types import QuantType, output_name, parse_quant_type
from engine.model.quantize import QuantizeResult, quantize_file
from engine.native.quantize_process import Progress

# Sources whose folder is not the user's to add files to.
_NOT_BESIDE = frozenset({"bundled", "downloaded"})


@dataclass(frozen=True)
class LocalQuant:
    """A quant made and the library's entry for it."""

    result: QuantizeResult
    entry: LibraryEntry


def entry_for(library: ModelLibrary, path: Path) -> LibraryEntry | None:
    key = real_path(path)
    return next((e for e in library.entries() if real_path(e.path) == key), None)


def output_folder(library: ModelLibrary, source: Path, entry: LibraryEntry | None) -> Path:
    """Where a quant of `source` goes by default (see the module's docstring)."""
    beside = entry is None or (entry.source not in _NOT_BESIDE and entry.owner is None)
    folder = source.parent
    if beside and folder.is_dir() and writable(folder):
        return folder
    return library.models_dir


def writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK)


def default_output(
    library: ModelLibrary, source: Path, qtype: QuantType, entry: LibraryEntry | None = None
) -> Path:
    """`<stem without its quantization>-<TYPE>.gguf` in `output_folder`."""
    return output_folder(library, source, entry) / output_name(source, qtype)


def quantize_model(
    library: ModelLibrary,
    ref: str,
    qtype: str | QuantType,
    *,
    output: Path | None = None,
    allow_requantize: bool = False,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    threads: int = 0,
) -> LocalQuant:
    """Make `ref` (a library id, `default` or a path) into `qtype` and add it to `library`.
    `output` may be a file or a folder (the default name goes in it). Errors as
    engine.model.quantize.quantize_file raises them, LibraryError for an unknown `ref`."""
    target_type = qtype if isinstance(qtype, QuantType) else parse_quant_type(qtype)
    source = library.resolve(ref)
    entry = entry_for(library, source)
    if output is None:
        target = default_output(library, source, target_type, entry)
    else:
        target = output.expanduser()
        if target.is_dir():
            target = target / output_name(source, target_type)
    if target.parent == library.models_dir:
        library.models_dir.mkdir(parents=True, exist_ok=True)
    result = quantize_file(
        source,
        target,
        target_type,
        allow_requantize=allow_requantize,
        progress=progress,
        cancel=cancel,
        threads=threads,
    )
    made = entry_for(library, result.output)
    if made is None:  # outside the library folder: known by reference
        made = library.import_file(result.output, mode="link")
    return LocalQuant(result, made)
