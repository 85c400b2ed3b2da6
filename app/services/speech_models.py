"""Speech-to-text models in the library, and the one the user chose, kept across restarts.

whisper.cpp's models are ggml `.bin` files, not GGUF: the chat's library (`ModelLibrary`)
lists GGUF models and leaves them out, and this module lists them instead: verified Hub
downloads (the download manager's records), copies in the library folder, whisper files in
the Hugging Face cache, and the chosen file wherever it is. Each is read by
`engine.model.whisper_file` (what it is) and sized by `engine.memory.whisper`.

One of them is the app's transcription model: push-to-talk and hands-free voice use it
(`candlewick serve` names its own with `--stt-model`). The choice is kept as its path
in `speech.json` in the config folder (written whole or not at all); a file chosen once and
since deleted or moved is no choice at all (None), never an error at the moment the user
speaks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.services.atomic_write import write_text_atomic
from app.services.download_jobs import completed_downloads
from app.services.hf_cache import remove_empty_dirs
from app.services.paths import AppPaths, real_path
from engine.memory.whisper import WhisperMemory, whisper_memory
from engine.model.whisper_file import (
    WhisperFile,
    WhisperFileError,
    is_whisper_file,
    read_whisper,
)

FILE_NAME = "speech.json"
STT_KEY = "stt_model"


def _settings_file(paths: AppPaths | None) -> Path:
    return (paths or AppPaths.default()).config / FILE_NAME


def _read(paths: AppPaths | None) -> dict[str, object]:
    try:
        data = json.loads(_settings_file(paths).read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def current_stt_model(paths: AppPaths | None = None) -> Path | None:
    """The chosen transcription model's file, or None when none is chosen or the chosen
    file is gone."""
    value = _read(paths).get(STT_KEY)
    if not isinstance(value, str) or not value:
        return None
    path = Path(value)
    return path if path.is_file() else None


def choose_stt_model(path: str | Path, paths: AppPaths | None = None) -> WhisperFile:
    """Make `path` the transcription model. The file is read first: a GGUF chat model, a
    truncated download or any other file is refused (WhisperFileError, one line) and the
    previous choice stays."""
    model = read_whisper(Path(path).expanduser().absolute())
    _write(paths, str(model.path))
    return model


def clear_stt_model(paths: AppPaths | None = None) -> None:
    """No transcription model chosen (the file itself stays)."""
    _write(paths, None)


def _write(paths: AppPaths | None, value: str | None) -> None:
    data = _read(paths)
    if value is None:
        data.pop(STT_KEY, None)
    else:
        data[STT_KEY] = value
    target = _settings_file(paths)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(target, json.dumps(data, indent=1))


# --- the library's speech models -------------------------------------------------------------

KIND = "speech-to-text"
_read_cache: dict[tuple[str, int, int], WhisperFile | str] = {}


def _whisper(path: Path) -> tuple[WhisperFile | None, str | None]:
    """The file read once per size and modification time (a big vocabulary takes ~0.1 s)."""
    try:
        st = path.stat()
    except OSError as e:
        return None, f"cannot read {path}: {e.strerror}"
    key = (str(path), st.st_size, st.st_mtime_ns)
    found = _read_cache.get(key)
    if found is None:
        try:
            found = read_whisper(path)
        except WhisperFileError as e:
            found = str(e)
        _read_cache[key] = found
    return (None, found) if isinstance(found, str) else (found, None)


@dataclass
class SpeechModel:
    id: str
    path: Path
    source: str  # downloaded | imported | hf-cache | chosen (a file chosen where it is)
    label: str | None  # where it came from: repo/file
    file: WhisperFile | None
    error: str | None
    chosen: bool = False

    kind = KIND

    @property
    def name(self) -> str:
        """ "ggml-base.en-q5_1": whisper.cpp's own file names say the size and the type."""
        return self.path.stem if self.path.suffix == ".bin" else self.path.name

    @property
    def warning(self) -> str | None:
        """What deleting it does beyond Candlewick (a file found in the Hugging Face cache is
        other tools' too)."""
        if self.source == "hf-cache":
            return (
                "this file is in the Hugging Face cache, not Candlewick's: deleting it "
                "removes it for every tool that uses it"
            )
        return None

    @property
    def memory(self) -> WhisperMemory | None:
        return whisper_memory(self.file) if self.file is not None else None

    def to_dict(self) -> dict[str, Any]:
        f, m = self.file, self.memory
        return {
            "id": self.id,
            "kind": KIND,
            "name": self.name,
            "path": str(self.path),
            "file": self.path.name,
            "source": self.source,
            "label": self.label,
            "chosen": self.chosen,
            "error": self.error,
            "size_bytes": f.size if f else None,
            "description": f.description if f else None,
            "model_type": f.model_type if f else None,
            "quantization": f.file_type if f else None,
            "multilingual": f.multilingual if f else None,
            "memory_bytes": m.total if m else None,
        }


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-") or "speech"


def _hf_cache_whisper(cache: Path) -> list[tuple[Path, str]]:
    """whisper.cpp files in the Hugging Face cache (`ggml-*.bin` in a snapshot): path, repo/file."""
    out: list[tuple[Path, str]] = []
    if not cache.is_dir():
        return out
    for repo_dir in sorted(cache.glob("models--*")):
        repo_id = repo_dir.name[len("models--") :].replace("--", "/")
        for f in sorted(repo_dir.glob("snapshots/*/**/ggml-*.bin")):
            if f.is_file() and is_whisper_file(f):
                snapshot = f.relative_to(repo_dir / "snapshots")
                out.append((f, f"{repo_id}/{Path(*snapshot.parts[1:]).as_posix()}"))
    return out


class SpeechLibrary:
    """The speech-to-text models on this machine and the chosen one. `models_dir` is the
    library's folder (its download records and copies); `hf_cache` a Hugging Face cache to
    look in, None for none."""

    def __init__(
        self, models_dir: Path, *, paths: AppPaths | None = None, hf_cache: Path | None = None
    ) -> None:
        self.models_dir = models_dir
        self.paths = paths
        self.hf_cache = hf_cache

    @classmethod
    def default(cls, paths: AppPaths | None = None) -> SpeechLibrary:
        from app.services.hf_cache import hf_hub_cache

        paths = paths or AppPaths.default()
        return cls(paths.models, paths=paths, hf_cache=hf_hub_cache())

    def entries(self) -> list[SpeechModel]:
        out: list[SpeechModel] = []
        ids: set[str] = set()
        seen: set[Path] = set()
        chosen = current_stt_model(self.paths)
        chosen_real = real_path(chosen) if chosen is not None else None

        def add(path: Path, source: str, label: str | None) -> None:
            real = real_path(path)
            if real in seen:
                return
            seen.add(real)
            id_ = _slug(path.stem)
            while id_ in ids:
                id_ += "-2"
            ids.add(id_)
            info, error = _whisper(path)
            out.append(SpeechModel(id_, path, source, label, info, error, real == chosen_real))

        for job in completed_downloads(self.models_dir / "downloads.json"):
            p = Path(job.path or "")
            if is_whisper_file(p):
                add(p, "downloaded", f"{job.repo_id}/{job.filename}")
        if self.models_dir.is_dir():
            for p in sorted(self.models_dir.rglob("*.bin")):
                if p.is_file() and is_whisper_file(p):
                    add(p, "imported", None)
        if self.hf_cache is not None:
            for p, label in _hf_cache_whisper(self.hf_cache):
                add(p, "hf-cache", label)
        if chosen is not None:
            add(chosen, "chosen", None)
        return out

    def entry(self, ref: str | Path) -> SpeechModel:
        """A model by its id, or a whisper.cpp file by its path (one line when neither)."""
        for e in self.entries():
            if e.id == str(ref):
                return e
        p = Path(ref).expanduser()
        if p.is_file():
            info = read_whisper(p)  # WhisperFileError: a chat model, a broken file
            real = real_path(p)
            for e in self.entries():
                if real_path(e.path) == real:
                    return e
            return SpeechModel(_slug(p.stem), p, "file", None, info, None)
        raise WhisperFileError(
            f"no speech-to-text model called '{ref}' (see `candlewick models list`)"
        )

    def choose(self, ref: str | Path) -> SpeechModel:
        """Make a model (id or path) the transcription model, kept across restarts."""
        e = self.entry(ref)
        if e.file is None:
            raise WhisperFileError(e.error or f"{e.path.name} is not usable")
        choose_stt_model(e.path, self.paths)
        e.chosen = True
        return e

    def current(self) -> SpeechModel | None:
        return next((e for e in self.entries() if e.chosen), None)

    def delete(self, id_: str) -> tuple[SpeechModel, int]:
        """Delete a model's file: a download's snapshot link and its blob (unless another
        snapshot links it), or a copy in the library's folder. A file the library does not
        own (chosen where it is) is refused. Choosing it is undone. Returns the model and
        the bytes freed."""
        e = next((x for x in self.entries() if x.id == id_), None)
        if e is None:
            raise WhisperFileError(f"no speech-to-text model called '{id_}'")
        if e.source not in ("downloaded", "hf-cache", "imported"):
            raise WhisperFileError(
                f"'{e.id}' is not the library's file ({e.path}): it is only chosen where it is; "
                "choose another model or none instead"
            )
        freed = 0
        if e.path.is_symlink():
            blob = e.path.resolve()
            snapshots = _snapshots_of(e.path)
            others = [
                p
                for p in snapshots.rglob("*")
                if p != e.path and p.is_symlink() and real_path(p) == blob
            ]
            e.path.unlink()
            if not others and blob.is_file():
                freed = blob.stat().st_size
                blob.unlink()
            remove_empty_dirs(e.path.parent, stop_at=snapshots)
        else:
            freed = e.path.stat().st_size
            e.path.unlink()
        if e.chosen:
            clear_stt_model(self.paths)
        return e, freed


def _snapshots_of(path: Path) -> Path:
    """The `snapshots` folder above a Hugging Face cache file (its link's own folder when
    it is in none)."""
    for parent in path.parents:
        if parent.name == "snapshots":
            return parent
    return path.parent
