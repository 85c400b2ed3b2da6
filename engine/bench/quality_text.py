"""The texts a quant is scored on: the built-in corpus shipped in resources/quality/ (original
prose and the project's own code, see its README), or a text file. A saved chat or a
documents collection is read by the app (app/cli/quality_sources.py) into the same
`QualityText`."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError

CORPUS_DIR = Path(__file__).resolve().parents[2] / "resources" / "quality"
CORPUS_FILES = ("prose.txt", "code.txt")
BUILTIN_SOURCE = "built-in corpus"


@dataclass(frozen=True)
class QualityText:
    """The text to score and where it came from."""

    source: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def builtin_text() -> QualityText:
    """The shipped corpus: its files in order, joined by a blank line."""
    try:
        parts = [(CORPUS_DIR / name).read_text(encoding="utf-8") for name in CORPUS_FILES]
    except OSError as e:
        raise EngineError(
            f"the built-in corpus is missing ({e.strerror or e}); reinstall"
        ) from None
    return QualityText(BUILTIN_SOURCE, "\n\n".join(p.strip("\n") for p in parts) + "\n")


def file_text(path: Path) -> QualityText:
    """A UTF-8 text file, as llama-perplexity's `-f` reads it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise EngineError(f"no such file: {path}") from None
    except OSError as e:
        raise EngineError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise EngineError(f"{path.name} is not UTF-8 text") from None
    if not text.strip():
        raise EngineError(f"{path.name} is empty")
    # llama.cpp's `-f` drops one final newline; so do we, for the same tokens.
    return QualityText(str(path), text.removesuffix("\n"))


__all__ = ["BUILTIN_SOURCE", "CORPUS_DIR", "QualityText", "builtin_text", "file_text"]
