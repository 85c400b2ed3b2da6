"""Downloads from the Hub into the standard Hugging Face cache, verified before they are used.

Layout (shared with huggingface_hub and every tool built on it):
    <HF hub cache>/models--owner--name/blobs/<sha256>[.incomplete]
    <HF hub cache>/models--owner--name/snapshots/<commit>/<file> -> ../../blobs/<sha256>
    <HF hub cache>/models--owner--name/refs/<branch>           (the commit)

Bytes go to `blobs/<sha256>.incomplete` (huggingface_hub's own name for a partial blob, so
either tool can finish the other's download) and are hashed while they arrive; a dropped
connection resumes with an HTTP Range request from the last byte on disk, including after the
app was closed. The file is renamed into place only when its SHA-256 equals the Hub's LFS hash:
huggingface_hub does not check that itself, and a file whose bytes differ is deleted and never
listed. Jobs and their state live in a small JSON file so the downloads list survives restarts.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import httpx2

from app.services.hub import (
    HubAccessError,
    HubClient,
    HubError,
    HubNotFound,
    HubOffline,
    gated_message,
)
from engine.model.gguf import human_bytes

log = logging.getLogger("candlewick.downloads")

QUEUED, DOWNLOADING, VERIFYING, PAUSED, FAILED, DONE = (
    "queued", "downloading", "verifying", "paused", "failed", "done")
ACTIVE = (QUEUED, DOWNLOADING, VERIFYING)
SETTLED = (PAUSED, FAILED, DONE)
# Kept free beyond the file itself so a download never fills the disk to the last byte.
DISK_MARGIN = 64 * 1024 * 1024

FreeSpace = Callable[[Path], int]


class DownloadError(HubError):
    """A download failed; `str()` is a one-line message for the user."""


class ChecksumMismatch(DownloadError):
    pass


class DiskFull(DownloadError):
    pass


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, read from the environment now (HF_HUB_CACHE, HF_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def repo_folder(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def free_disk_space(path: Path) -> int:
    """Free bytes on the file system that holds `path` (or its nearest existing parent)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


@dataclass
class DownloadJob:
    repo_id: str
    filename: str
    revision: str = "main"
    commit: str | None = None
    sha256: str | None = None  # the Hub's LFS hash
    blob_id: str | None = None  # git sha1, for small non-LFS files
    size: int | None = None
    status: str = QUEUED
    error: str | None = None
    done_bytes: int = 0
    path: str | None = None  # the verified file in the snapshot folder
    speed_bps: float = 0.0
    note: str | None = None

    @property
    def id(self) -> str:
        return f"{self.repo_id}/{self.filename}"

    @property
    def eta_s(self) -> float | None:
        if self.status != DOWNLOADING or not self.size or self.speed_bps <= 0:
            return None
        return max(0.0, (self.size - self.done_bytes) / self.speed_bps)

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.size if self.size else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["id"] = self.id
        d["eta_s"] = self.eta_s
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DownloadJob:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def completed_downloads(state_file: Path) -> list[DownloadJob]:
    """Verified downloads recorded in a manager's state file whose file is still there."""
    try:
        data = json.loads(state_file.read_text("utf-8"))
        jobs = [DownloadJob.from_dict(d) for d in data.get("jobs", [])]
    except (OSError, ValueError, TypeError, AttributeError):
        return []
    return [j for j in jobs if j.status == DONE and j.path and Path(j.path).exists()]


class _Stop(threading.Event):
    reason = "pause"  # pause | cancel | shutdown


class DownloadManager:
    """A queue of downloads run on worker threads (`max_parallel` at a time).

    `on_change(job)` is called from worker threads (status changes, and progress at most every
    `progress_interval` seconds): GUI code must hop to its own thread before touching widgets.
    """

    def __init__(self, state_file: Path, hub: HubClient, *, cache_dir: Path | None = None,
                 free_space: FreeSpace = free_disk_space, max_parallel: int = 2,
                 on_change: Callable[[DownloadJob], None] | None = None,
                 chunk_size: int = 1 << 20, max_retries: int = 5, retry_delay: float = 0.5,
                 read_timeout: float = 20.0, progress_interval: float = 0.2) -> None:
        self.state_file = state_file
        self.hub = hub
        self._cache_dir = cache_dir
        self.free_space = free_space
        self.max_parallel = max_parallel
        self.on_change = on_change
        self.chunk_size = chunk_size
        self.max_retries = max_retries
        self.retry_delay = retry_delay
        self.read_timeout = read_timeout
        self.progress_interval = progress_interval
        self._lock = threading.RLock()
        self._settled = threading.Condition(self._lock)
        self._jobs: dict[str, DownloadJob] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._stops: dict[str, _Stop] = {}
        self._closed = False
        self._load()

    @property
    def cache_dir(self) -> Path:
        return self._cache_dir or hf_hub_cache()

    # --- persistence --------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            data = json.loads(self.state_file.read_text("utf-8"))
            jobs = [DownloadJob.from_dict(d) for d in data.get("jobs", [])]
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, AttributeError) as e:
            log.warning("download list %s unreadable, starting empty: %s", self.state_file, e)
            return
        for j in jobs:
            if j.status in ACTIVE:
                # The app was closed mid-download: the bytes on disk are kept and the job
                # waits for the user (or `resume_all`) to carry on from there.
                j.status, j.note = PAUSED, "interrupted when the app closed"
            j.speed_bps = 0.0
            j.done_bytes = self._partial_bytes(j) if j.status != DONE else (j.size or 0)
            self._jobs[j.id] = j

    def _save(self) -> None:
        with self._lock:  # one writer at a time: workers save concurrently
            data = {"version": 1, "jobs": [
                {k: v for k, v in j.to_dict().items() if k not in ("speed_bps", "eta_s", "id")}
                for j in self._jobs.values()]}
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_file.with_name(self.state_file.name + ".tmp")
            tmp.write_text(json.dumps(data, indent=1), "utf-8")
            os.replace(tmp, self.state_file)

    # --- paths --------------------------------------------------------------------------------

    def _blob_name(self, job: DownloadJob) -> str | None:
        return job.sha256 or job.blob_id

    def incomplete_path(self, job: DownloadJob) -> Path | None:
        name = self._blob_name(job)
        if name is None:
            return None
        return repo_folder(self.cache_dir, job.repo_id) / "blobs" / f"{name}.incomplete"

    def _partial_bytes(self, job: DownloadJob) -> int:
        p = self.incomplete_path(job)
        try:
            return p.stat().st_size if p else 0
        except OSError:
            return 0

    # --- public API ---------------------------------------------------------------------------

    def jobs(self) -> list[DownloadJob]:
        with self._lock:
            return [DownloadJob.from_dict(asdict(j)) for j in self._jobs.values()]

    def get(self, job_id: str) -> DownloadJob | None:
        with self._lock:
            j = self._jobs.get(job_id)
            return DownloadJob.from_dict(asdict(j)) if j else None

    def add(self, repo_id: str, filename: str, *, revision: str = "main",
            sha256: str | None = None, size: int | None = None, commit: str | None = None
            ) -> DownloadJob:
        """Queue a file (a no-op for one already queued or running; a paused or failed one
        resumes from its partial bytes)."""
        if self._closed:
            raise DownloadError("the download manager is closed")
        with self._lock:
            job = self._jobs.get(f"{repo_id}/{filename}")
            if job is None or (job.status == DONE and not (job.path and Path(job.path).exists())):
                job = DownloadJob(repo_id, filename, revision, commit, sha256, None, size)
                self._jobs[job.id] = job
            elif job.status in (PAUSED, FAILED):
                job.status, job.error, job.note = QUEUED, None, None
        self._save()
        self._notify(job)
        self._pump()
        return self.get(job.id) or job

    def pause(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return
            stop = self._stops.get(job_id)
            if stop is not None:
                stop.reason = "pause"
                stop.set()  # the worker marks the job paused when it stops
                return
            if job.status == QUEUED:
                job.status = PAUSED
        self._save()
        self._notify(job)

    def resume(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.status not in (PAUSED, FAILED):
                return
            job.status, job.error, job.note = QUEUED, None, None
        self._save()
        self._notify(job)
        self._pump()

    def resume_all(self) -> None:
        for j in self.jobs():
            if j.status == PAUSED:
                self.resume(j.id)

    def cancel(self, job_id: str) -> None:
        """Stop a download and delete its partial bytes; the job leaves the list."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return
            stop = self._stops.get(job_id)
            if stop is not None:
                stop.reason = "cancel"
                stop.set()
                return
            self._discard(job)
        self._save()

    def remove(self, job_id: str) -> None:
        """Forget a finished or failed job (the downloaded file stays)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.id in self._threads:
                return
            if job.status != DONE:
                self._discard(job)
                return
            del self._jobs[job_id]
            self._settled.notify_all()
        self._save()

    def forget_path(self, path: Path) -> None:
        """The library deleted a downloaded file: drop its job."""
        with self._lock:
            for j in list(self._jobs.values()):
                if j.path and Path(j.path) == path:
                    del self._jobs[j.id]
        self._save()

    def wait(self, job_id: str, timeout: float | None = None) -> DownloadJob | None:
        """Block until the job is paused, failed, done or gone; returns its final state."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._settled:
            while True:
                job = self._jobs.get(job_id)
                if job is None or (job.status in SETTLED and job_id not in self._threads):
                    return DownloadJob.from_dict(asdict(job)) if job else None
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return DownloadJob.from_dict(asdict(job))
                self._settled.wait(left)

    def close(self) -> None:
        """Stop every worker (their jobs stay paused, bytes kept) and save the list."""
        with self._lock:
            self._closed = True
            for stop in self._stops.values():
                stop.reason = "shutdown"
                stop.set()
            threads = list(self._threads.values())
        for t in threads:
            t.join()
        self._save()

    # --- workers ------------------------------------------------------------------------------

    def _discard(self, job: DownloadJob) -> None:
        """Remove a job and its partial file (lock held)."""
        p = self.incomplete_path(job)
        if p is not None:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            _remove_empty_dirs(p.parent, stop_at=self.cache_dir)
        self._jobs.pop(job.id, None)
        self._settled.notify_all()

    def _notify(self, job: DownloadJob) -> None:
        if self.on_change is not None:
            snapshot = self.get(job.id) or DownloadJob.from_dict(asdict(job))
            try:
                self.on_change(snapshot)
            except Exception:
                log.exception("download listener failed")

    def _pump(self) -> None:
        with self._lock:
            if self._closed:
                return
            running = len(self._threads)
            for job in self._jobs.values():
                if running >= self.max_parallel:
                    break
                if job.status == QUEUED and job.id not in self._threads:
                    stop = _Stop()
                    t = threading.Thread(target=self._run, args=(job, stop),
                                         name=f"download:{job.filename}", daemon=True)
                    self._stops[job.id] = stop
                    self._threads[job.id] = t
                    job.status = DOWNLOADING
                    running += 1
                    t.start()

    def _run(self, job: DownloadJob, stop: _Stop) -> None:
        try:
            self.hub.check_online()
            self._prepare(job)
            self._notify(job)
            if self._transfer(job, stop):
                self._install(job)
        except HubError as e:
            self._fail(job, str(e))
        except OSError as e:
            if e.errno == errno.ENOSPC:
                self._fail(job, f"the disk is full while downloading {job.filename}: free some "
                                "space, then resume (the bytes so far are kept)")
            else:
                self._fail(job, f"cannot write {job.filename}: {e.strerror or e}")
        except Exception as e:  # a bug must not kill the queue silently
            log.exception("download of %s failed", job.id)
            self._fail(job, f"internal error: {type(e).__name__}: {e}")
        finally:
            with self._lock:
                self._threads.pop(job.id, None)
                self._stops.pop(job.id, None)
                if stop.is_set() and job.id in self._jobs:
                    if stop.reason == "cancel":
                        self._discard(job)
                    elif job.status in ACTIVE:
                        job.status = PAUSED
                        job.speed_bps = 0.0
                        if stop.reason == "shutdown":
                            job.note = "interrupted when the app closed"
                self._settled.notify_all()
            self._save()
            self._notify(job)
            self._pump()

    def _fail(self, job: DownloadJob, message: str) -> None:
        with self._lock:
            job.status, job.error, job.speed_bps = FAILED, message, 0.0
        log.info("download %s failed: %s", job.id, message)  # the job carries it to the user

    def _prepare(self, job: DownloadJob) -> None:
        """Fill in the hash, size and commit from the Hub's file list when not known yet."""
        if job.sha256 and job.size is not None and job.commit:
            return
        details = self.hub.repo_details(job.repo_id, revision=job.commit or job.revision,
                                        with_fit=False)
        for v in details.variants:
            for f in v.files:
                if f.filename == job.filename:
                    with self._lock:
                        job.sha256, job.size, job.commit = f.sha256, f.size, details.commit
                        job.blob_id = f.blob_id
                    return
        raise HubNotFound(f"{job.filename} is not a GGUF file in {job.repo_id} "
                          "(see `candlewick models files` for the list)")

    def _check_space(self, job: DownloadJob, have: int) -> None:
        need = (job.size or 0) - have
        target = repo_folder(self.cache_dir, job.repo_id)
        with self._lock:  # downloads already running will take their share of the space too
            reserved = sum(max(0, (j.size or 0) - j.done_bytes) for j in self._jobs.values()
                           if j.id in self._threads and j.id != job.id)
        free = max(0, self.free_space(target) - reserved)
        if need + DISK_MARGIN > free:
            raise DiskFull(
                f"not enough disk space for {job.filename}: it needs {human_bytes(need)} more, "
                f"{human_bytes(free)} free in {self.cache_dir} — free some space or set HF_HOME "
                "to a bigger disk")

    def _transfer(self, job: DownloadJob, stop: _Stop) -> bool:
        """Download to the .incomplete file and check its hash. Returns False when stopped."""
        part = self.incomplete_path(job)
        if part is None or job.size is None:
            raise DownloadError(f"the Hub gives no hash for {job.filename}: it cannot be verified")
        final = part.with_suffix("")
        if final.exists():
            # Another tool (or an earlier run) placed this blob. huggingface_hub files bytes
            # under the advertised hash without checking them, so check before trusting it.
            with self._lock:
                job.status = VERIFYING
            self._notify(job)
            if _hash_prefix(final, final.stat().st_size, git_sha1=job.sha256 is None,
                            size=job.size).hexdigest() == (job.sha256 or job.blob_id):
                return True
            final.unlink()
            with self._lock:
                job.status = DOWNLOADING
                job.note = "replaced a corrupt copy found in the Hugging Face cache"
        part.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.exists() else 0
        if have > job.size:
            part.unlink()
            have = 0
        self._check_space(job, have)
        hasher = _hash_prefix(part, have, git_sha1=job.sha256 is None, size=job.size)
        url = self.hub.file_url(job.repo_id, job.filename, job.commit or job.revision)
        failures = 0
        timeout = httpx2.Timeout(self.read_timeout, connect=10.0)
        with httpx2.Client(follow_redirects=True, timeout=timeout) as client:
            while have < job.size:
                if stop.is_set():
                    return False
                headers = self.hub.headers()
                headers["Accept-Encoding"] = "identity"  # sizes and Range are about raw bytes
                if have:
                    headers["Range"] = f"bytes={have}-"
                before = have
                progress = _Progress(have, hasher)
                try:
                    self._stream(client, url, headers, part, progress, job, stop,
                                 had_token="authorization" in {k.lower() for k in headers})
                except (httpx2.TransportError, httpx2.StreamError) as e:
                    # Every byte written was hashed, so carry on from what is on disk.
                    have, hasher = progress.have, progress.hasher
                    failures = 0 if have > before else failures + 1
                    if failures > self.max_retries:
                        raise HubOffline(
                            f"the connection to the Hub keeps failing ({type(e).__name__}); "
                            f"{human_bytes(have)} of {job.filename} kept — resume later"
                        ) from None
                    log.info("download %s interrupted at %d bytes (%s); resuming", job.id,
                             have, e)
                    stop.wait(self.retry_delay * failures)
                    continue
                have, hasher = progress.have, progress.hasher
                if stop.is_set() and have < job.size:
                    return False
        with self._lock:
            job.status, job.speed_bps = VERIFYING, 0.0
        self._notify(job)
        got = hasher.hexdigest()
        expected = job.sha256 or job.blob_id
        if got != expected:
            part.unlink()
            raise ChecksumMismatch(
                f"{job.filename} from {job.repo_id} is corrupt: its SHA-256 is {got[:16]}… but "
                f"the Hub lists {str(expected)[:16]}…; the file was deleted and is not in the "
                "library — download it again")
        part.replace(final)
        return True

    def _stream(self, client: httpx2.Client, url: str, headers: dict[str, str], part: Path,
                progress: _Progress, job: DownloadJob, stop: _Stop, *, had_token: bool) -> None:
        assert job.size is not None
        git_sha1 = job.sha256 is None
        with client.stream("GET", url, headers=headers) as r:
            if r.status_code in (401, 403):
                raise HubAccessError(gated_message(job.repo_id, self.hub.endpoint,
                                                   had_token=had_token))
            if r.status_code == 404:
                raise HubNotFound(f"{job.filename} is no longer in {job.repo_id} on the Hub")
            if r.status_code == 416 or (r.status_code == 200 and progress.have):
                # 416: our partial file does not fit the Hub's; 200: the server ignored the
                # Range header and sends everything again. Either way, start from zero.
                part.unlink()
                progress.have = 0
                progress.hasher = _hash_prefix(part, 0, git_sha1=git_sha1, size=job.size)
                if r.status_code == 416:
                    return
            elif r.status_code not in (200, 206):
                raise DownloadError(f"the Hub answered HTTP {r.status_code} for {job.filename}")
            hasher = _BackgroundHasher(progress.hasher)
            try:
                self._receive(r, part, progress, hasher, job, stop)
            finally:
                progress.hasher = hasher.finish()  # every byte written is hashed, even on error
        with self._lock:
            job.done_bytes = progress.have
        if progress.have > job.size:
            part.unlink()
            raise DownloadError(f"the Hub sent more bytes than the {human_bytes(job.size)} it "
                                f"lists for {job.filename}; the partial file was deleted")

    def _receive(self, r: httpx2.Response, part: Path, progress: _Progress,
                 hasher: _BackgroundHasher, job: DownloadJob, stop: _Stop) -> None:
        assert job.size is not None
        last_note = time.monotonic()
        window_start, window_bytes = last_note, 0
        with open(part, "ab") as out:
            for chunk in r.iter_bytes(self.chunk_size):
                out.write(chunk)
                hasher.update(chunk)
                progress.have += len(chunk)
                have = progress.have
                window_bytes += len(chunk)
                now = time.monotonic()
                if now - last_note >= self.progress_interval:
                    with self._lock:
                        job.done_bytes = have
                        elapsed = now - window_start
                        if elapsed >= 0.5:
                            rate = window_bytes / elapsed
                            job.speed_bps = rate if not job.speed_bps else (
                                0.5 * job.speed_bps + 0.5 * rate)
                            window_start, window_bytes = now, 0
                    last_note = now
                    self._notify(job)
                if stop.is_set():
                    break
                if have > job.size:
                    break

    def _install(self, job: DownloadJob) -> None:
        """Link the verified blob into its snapshot folder, like huggingface_hub does."""
        name = self._blob_name(job)
        assert name is not None
        folder = repo_folder(self.cache_dir, job.repo_id)
        blob = folder / "blobs" / name
        commit = job.commit or job.revision
        link = folder / "snapshots" / commit / job.filename
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            with contextlib.suppress(FileNotFoundError):
                link.unlink()  # a dangling link
            try:
                link.symlink_to(os.path.relpath(blob, link.parent))
            except OSError:
                # No symlinks (Windows without developer mode): huggingface_hub copies too.
                shutil.copyfile(blob, link)
        if job.commit and job.revision != job.commit:
            refs = folder / "refs" / job.revision
            refs.parent.mkdir(parents=True, exist_ok=True)
            refs.write_text(job.commit)
        with self._lock:
            job.status, job.path, job.done_bytes, job.error = DONE, str(link), job.size or 0, None
            job.speed_bps = 0.0


class _BackgroundHasher:
    """Hashes chunks on its own thread while the next ones arrive: hashlib releases the GIL on
    big buffers, so verifying costs almost no download time (bounded queue: little memory)."""

    def __init__(self, hasher: Any) -> None:
        self._hasher = hasher
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=16)
        self._thread = threading.Thread(target=self._run, name="download-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            self._hasher.update(chunk)

    def update(self, chunk: bytes) -> None:
        self._queue.put(chunk)

    def finish(self) -> Any:
        self._queue.put(None)
        self._thread.join()
        return self._hasher


@dataclass
class _Progress:
    have: int
    hasher: Any


def _hash_prefix(part: Path, have: int, *, git_sha1: bool, size: int) -> Any:
    """A hasher fed with the bytes already on disk (a resumed download is hashed once)."""
    h = hashlib.sha1(b"blob %d\0" % size) if git_sha1 else hashlib.sha256()
    if have:
        with open(part, "rb") as f:
            left = have
            while left > 0:
                block = f.read(min(left, 1 << 20))
                if not block:
                    break
                h.update(block)
                left -= len(block)
    return h


def _remove_empty_dirs(folder: Path, *, stop_at: Path) -> None:
    """Remove `folder` and its parents while they are empty, never `stop_at` or above it."""
    p = folder
    try:
        stop = stop_at.resolve()
    except OSError:
        return
    while p.resolve() != stop and stop in p.resolve().parents:
        try:
            p.rmdir()
        except OSError:
            return
        p = p.parent


__all__ = [
    "ChecksumMismatch", "DiskFull", "DownloadError", "DownloadJob", "DownloadManager",
    "completed_downloads", "free_disk_space", "hf_hub_cache", "repo_folder",
]
