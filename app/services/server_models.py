"""The server's model store (engine.server.model_store.ModelStore) over the app's library,
Hub client and download manager: what Ollama's `/api/pull`, `/api/delete`, `/api/copy` and
`/api/create` do in Candlewick.

A pull downloads through the download manager it is given (the desktop's Downloads page
shows the same jobs): resumable, each file checked against the Hub's SHA-256. Deleting a
model removes its file only where Candlewick owns it (a verified download, a copy in the
library folder); a linked import or another tool's file leaves the library and stays on disk.
A library model other names were made from (copies, created models) is not deleted under
them: they go first. Qt-free; every call blocks (the server runs them on worker threads).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from app.services.download_jobs import DONE, FAILED, PAUSED, DownloadJob
from app.services.download_manager import DownloadManager
from app.services.hub import HubAccessError, HubError, HubFile, HubNotFound
from app.services.hub_names import choose_variant, parse_hub_name, projector_of, quantizations
from app.services.library import LibraryEntry, LibraryError, ModelLibrary
from app.services.named_models import FILE_NAME, NamedModels
from app.services.verified_transfer import DownloadError
from engine.host.host_entry import matches
from engine.server.model_store import (
    BeforeRemove,
    NamedModel,
    PullFile,
    PullPlan,
    PullProgress,
    StoreError,
    full_name,
)

POLL_S = 0.2  # how often a pull's progress is read from the download manager


@dataclasses.dataclass(frozen=True)
class _Fetch:
    """What a pull plan's token holds: the repository, its commit and the files."""

    repo_id: str
    commit: str | None
    files: tuple[HubFile, ...]


def _digest(f: HubFile) -> str:
    return f"sha256:{f.sha256}" if f.sha256 else f"sha1:{f.blob_id or ''}"


def _same(a: Path, b: Path) -> bool:
    try:
        return a == b or a.resolve() == b.resolve()
    except OSError:
        return False


def _hub_error(e: HubError, name: str) -> StoreError:
    if isinstance(e, HubNotFound):
        return StoreError(404, f"pull model manifest: {name} not found on the Hub: {e}")
    if isinstance(e, HubAccessError):
        return StoreError(403, str(e))
    return StoreError(503, str(e))


class LibraryModelStore:
    def __init__(
        self,
        library: ModelLibrary,
        downloads: DownloadManager | Callable[[], DownloadManager],
        names: NamedModels | None = None,
        *,
        poll_s: float = POLL_S,
    ) -> None:
        """`downloads`: the download manager, or how to make one when it is first needed
        (`candlewick serve`: the list on disk is not read, nor written back at exit, by a
        server that never pulled; `close` closes a manager made so)."""
        self.library = library
        self._downloads = downloads if isinstance(downloads, DownloadManager) else None
        self._make = None if isinstance(downloads, DownloadManager) else downloads
        self.names = names or NamedModels(library.models_dir / FILE_NAME)
        self.poll_s = poll_s
        self._lock = threading.Lock()  # one change of names and files at a time
        self._making = threading.Lock()  # the download manager made once

    @property
    def downloads(self) -> DownloadManager:
        with self._making:
            if self._downloads is None:
                assert self._make is not None
                self._downloads = self._make()
            return self._downloads

    def close(self) -> None:
        """Close the download manager this store made (its running pulls stay paused)."""
        with self._making:
            made = self._downloads if self._make is not None else None
        if made is not None:
            made.close()

    # -- names -----------------------------------------------------------------------------

    def named(self, name: str) -> NamedModel | None:
        return self.names.get(name)

    def named_models(self) -> list[NamedModel]:
        return self.names.all()

    def _entry(self, name: str) -> LibraryEntry | None:
        return next(
            (
                e
                for e in self.library.entries()
                if e.error is None and matches(name, e.id, (e.slug,), e.path)
            ),
            None,
        )

    def _source(self, name: str, field: str) -> tuple[NamedModel | None, Path]:
        named = self.named(name)
        if named is not None:
            return named, named.path
        entry = self._entry(name)
        if entry is None:
            raise StoreError(404, f"model '{name}' not found", param=field)
        return None, entry.path

    def _free(self, name: str, field: str) -> str:
        """The full name a copy or a created model takes: not a library model's."""
        bare = name[: -len(":latest")] if name.endswith(":latest") else name
        if self._entry(bare) is not None:
            raise StoreError(400, f"'{name}' is already a library model's name", param=field)
        return full_name(name)

    def copy(self, source: str, destination: str) -> NamedModel:
        with self._lock:
            dest = self._free(destination, "destination")
            named, path = self._source(source, "source")
            if named is not None:  # a created model's copy keeps its recipe
                kind = "copy" if named.kind == "pull" else named.kind
                made = dataclasses.replace(named, name=dest, kind=kind, created_at=time.time())
            else:
                made = NamedModel(dest, path, source, "copy", created_at=time.time())
            self.names.put(made)
            return made

    def create(
        self,
        name: str,
        base: str,
        *,
        system: str | None,
        parameters: Mapping[str, Any],
        messages: Sequence[Mapping[str, str]],
        license: Sequence[str],
    ) -> NamedModel:
        with self._lock:
            dest = self._free(name, "model")
            named, path = self._source(base, "from")
            # Over a created model, as Ollama's layers: what is given replaces, the rest stays.
            made = NamedModel(
                dest,
                path,
                base,
                "create",
                system=system if system is not None else (named.system if named else None),
                parameters={**(named.parameters if named else {}), **parameters},
                messages=tuple(messages) or (tuple(named.messages) if named else ()),
                license=tuple(license) or (tuple(named.license) if named else ()),
                created_at=time.time(),
            )
            self.names.put(made)
            return made

    # -- delete ----------------------------------------------------------------------------

    def delete(self, name: str, before_remove: BeforeRemove) -> None:
        with self._lock:
            named = self.named(name)
            if named is not None:
                others = [
                    m
                    for m in self.names.all()
                    if m.name != named.name and _same(m.path, named.path)
                ]
                entry = self._entry_of(named.path)
                if named.kind == "pull" and not others and entry is not None:
                    self._remove_entry(entry, before_remove)  # the pulled file goes with it
                self.names.remove([named.name])
                return
            entry = self._entry(name)
            if entry is None:
                raise StoreError(404, f"model '{name}' not found")
            users = [m for m in self.names.all() if _same(m.path, entry.path)]
            made = [m.name for m in users if m.kind != "pull"]
            if made:
                raise StoreError(
                    400, f"'{entry.id}' is the base of {', '.join(made)}: delete those first"
                )
            self._remove_entry(entry, before_remove)
            self.names.remove([m.name for m in users])

    def _entry_of(self, path: Path) -> LibraryEntry | None:
        return next((e for e in self.library.entries() if _same(e.path, path)), None)

    def _remove_entry(self, entry: LibraryEntry, before_remove: BeforeRemove) -> None:
        """Delete Candlewick's own file; take another tool's (or a linked one) out of the
        library only."""
        if entry.source == "bundled":
            raise StoreError(400, "the bundled default model ships with Candlewick: it stays")
        before_remove(entry.path)
        try:
            if entry.linked or entry.owner is not None:
                self.library.forget(entry.id)
            else:
                self.library.delete(entry.id)
                self.downloads.forget_path(entry.path)
        except (LibraryError, OSError) as e:
            raise StoreError(400, f"cannot delete '{entry.id}': {e}") from None

    # -- pull ------------------------------------------------------------------------------

    def plan_pull(self, name: str) -> PullPlan:
        hub_name = parse_hub_name(name)
        if hub_name is None:
            raise StoreError(
                400,
                f"'{name}' is not a Hugging Face name: Candlewick pulls from the Hugging Face "
                "Hub (hf.co/owner/repo:QUANT)",
                param="model",
            )
        try:
            details = self.downloads.hub.repo_details(hub_name.repo_id, with_fit=False)
        except HubError as e:
            raise _hub_error(e, name) from None
        variant = choose_variant(details, hub_name.tag)
        if variant is None:
            have = ", ".join(quantizations(details)) or "none"
            raise StoreError(
                404,
                f"pull model manifest: {name} not found: {hub_name.repo_id} has no "
                f"{hub_name.tag} GGUF model (its quantizations: {have})",
            )
        projector = projector_of(details, variant)
        files = (*variant.files, *(projector.files if projector is not None else ()))
        return PullPlan(
            hub_name.name,
            tuple(PullFile(_digest(f), f.size) for f in files),
            _Fetch(details.repo_id, details.commit, files),
        )

    def pull(
        self, plan: PullPlan, progress: Callable[[PullProgress], None], stop: threading.Event
    ) -> NamedModel:
        fetch = plan.token
        assert isinstance(fetch, _Fetch)
        try:
            jobs = [
                self.downloads.add(
                    fetch.repo_id, f.filename, sha256=f.sha256, size=f.size, commit=fetch.commit
                )
                for f in fetch.files
            ]
        except DownloadError as e:
            raise StoreError(503, str(e)) from None
        done = self._follow([j.id for j in jobs], plan, progress, stop)
        failed = next((j for j in done if j.status != DONE), None)
        if failed is not None:
            why = failed.error or f"the download of {failed.filename} stopped ({failed.status})"
            raise StoreError(500, why)
        made = NamedModel(
            plan.name,
            Path(done[0].path or ""),
            f"{fetch.repo_id}/{fetch.files[0].filename}",
            "pull",
            created_at=time.time(),
        )
        with self._lock:
            self.names.put(made)
        return made

    def _follow(
        self,
        ids: list[str],
        plan: PullPlan,
        progress: Callable[[PullProgress], None],
        stop: threading.Event,
    ) -> list[DownloadJob]:
        """Report each job's bytes until every one settles; `stop`: pause them all."""
        told: dict[str, int] = {}
        paused = False
        while True:
            jobs = [j for j in (self.downloads.get(i) for i in ids) if j is not None]
            if len(jobs) < len(ids):
                raise StoreError(500, "a download of this pull was cancelled")
            for job, f in zip(jobs, plan.files, strict=True):
                if told.get(job.id) != job.done_bytes:
                    told[job.id] = job.done_bytes
                    progress(PullProgress(f.digest, f.size, job.done_bytes))
            pending = next((j for j in jobs if j.status not in (DONE, FAILED, PAUSED)), None)
            if pending is None:
                return jobs
            if stop.is_set() and not paused:  # then wait for them to settle paused
                for j in jobs:
                    self.downloads.pause(j.id)
                paused = True
            self.downloads.wait(pending.id, timeout=self.poll_s)


__all__ = ["LibraryModelStore"]
