"""The downloads list: a queue of Hub files fetched on worker threads into the Hugging Face cache.

Each job goes queued -> downloading -> verifying -> done, or stops paused (its bytes kept) or
failed (its error one line for the user). The list is saved after every change, so it survives
restarts: a job the app was closed on comes back paused, ready to resume from its bytes on
disk. The bytes themselves travel through `verified_transfer`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from app.services.disk_space import DISK_MARGIN, FreeSpace, free_disk_space
from app.services.download_jobs import (
    ACTIVE,
    DONE,
    DOWNLOADING,
    FAILED,
    PAUSED,
    QUEUED,
    SETTLED,
    UNREADABLE,
    VERIFYING,
    DownloadJob,
    read_jobs,
    write_jobs,
)
from app.services.hf_cache import (
    blob_path,
    hf_hub_cache,
    incomplete_blob_path,
    link_into_snapshot,
    remove_empty_dirs,
    repo_folder,
    write_ref,
)
from app.services.hub import HubClient, HubError, HubNotFound
from app.services.verified_transfer import (
    DownloadError,
    RemoteBlob,
    TransferSettings,
    VerifiedTransfer,
)
from engine.model.gguf import human_bytes

log = logging.getLogger("candlewick.downloads")

INTERRUPTED_NOTE = "interrupted when the app closed"


class DiskFull(DownloadError):
    pass


class _Stop(threading.Event):
    reason = "pause"  # pause | cancel | shutdown


class DownloadManager:
    """A queue of downloads run on worker threads (`max_parallel` at a time).

    `on_change(job)` is called from worker threads (status changes, and progress at most every
    `progress_interval` seconds): GUI code must hop to its own thread before touching widgets.
    `subscribe` adds more such listeners (the Downloads page, while a server pulls too).
    """

    def __init__(
        self,
        state_file: Path,
        hub: HubClient,
        *,
        cache_dir: Path | None = None,
        free_space: FreeSpace = free_disk_space,
        max_parallel: int = 2,
        on_change: Callable[[DownloadJob], None] | None = None,
        chunk_size: int = 1 << 20,
        max_retries: int = 5,
        retry_delay: float = 0.5,
        read_timeout: float = 20.0,
        progress_interval: float = 0.2,
    ) -> None:
        self.state_file = state_file
        self.hub = hub
        self._cache_dir = cache_dir
        self.free_space = free_space
        self.max_parallel = max_parallel
        self.on_change = on_change
        self.transfer_settings = TransferSettings(
            chunk_size=chunk_size,
            max_retries=max_retries,
            retry_delay=retry_delay,
            read_timeout=read_timeout,
            progress_interval=progress_interval,
        )
        self._lock = threading.RLock()
        self._settled = threading.Condition(self._lock)
        self._jobs: dict[str, DownloadJob] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._stops: dict[str, _Stop] = {}
        self._closed = False
        self._listeners: list[Callable[[DownloadJob], None]] = []
        self._load()

    @property
    def cache_dir(self) -> Path:
        return self._cache_dir or hf_hub_cache()

    # --- persistence --------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            jobs = read_jobs(self.state_file)
        except FileNotFoundError:
            return
        except UNREADABLE as e:
            log.warning("download list %s unreadable, starting empty: %s", self.state_file, e)
            return
        for j in jobs:
            if j.status in ACTIVE:
                # The app was closed mid-download: the bytes on disk are kept and the job
                # waits for the user (or `resume_all`) to carry on from there.
                j.status, j.note = PAUSED, INTERRUPTED_NOTE
            j.speed_bps = 0.0
            j.done_bytes = self._partial_bytes(j) if j.status != DONE else (j.size or 0)
            self._jobs[j.id] = j

    def _save(self) -> None:
        with self._lock:  # one writer at a time: workers save concurrently
            try:
                write_jobs(self.state_file, self._jobs.values())
            except OSError as e:
                # A full disk must not stop the queue or hide a job's failure: the list on
                # disk stays the last one saved, and the next change saves it again.
                log.warning("cannot save the download list %s: %s", self.state_file, e)

    # --- paths --------------------------------------------------------------------------------

    def incomplete_path(self, job: DownloadJob) -> Path | None:
        if job.blob is None:
            return None
        return incomplete_blob_path(self.cache_dir, job.repo_id, job.blob)

    def _partial_bytes(self, job: DownloadJob) -> int:
        p = self.incomplete_path(job)
        try:
            return p.stat().st_size if p else 0
        except OSError:
            return 0

    # --- public API ---------------------------------------------------------------------------

    def jobs(self) -> list[DownloadJob]:
        with self._lock:
            return [j.copy() for j in self._jobs.values()]

    def get(self, job_id: str) -> DownloadJob | None:
        with self._lock:
            j = self._jobs.get(job_id)
            return j.copy() if j else None

    def add(
        self,
        repo_id: str,
        filename: str,
        *,
        revision: str = "main",
        sha256: str | None = None,
        size: int | None = None,
        commit: str | None = None,
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

    def _stop_running(self, job_id: str, reason: str) -> bool:
        """Tell the transfer of a running job to stop for `reason` ("pause", "cancel"); its
        worker settles the job when it does. False: the job is not running. Under the lock."""
        stop = self._stops.get(job_id)
        if stop is None:
            return False
        stop.reason = reason
        stop.set()
        return True

    def pause(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or self._stop_running(job_id, "pause"):
                return  # the worker marks a running job paused when it stops
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
            if job is None or self._stop_running(job_id, "cancel"):
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
                    return job.copy() if job else None
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return job.copy()
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
            remove_empty_dirs(p.parent, stop_at=self.cache_dir)
        self._jobs.pop(job.id, None)
        self._settled.notify_all()

    def subscribe(self, fn: Callable[[DownloadJob], None]) -> Callable[[], None]:
        """Call `fn(job)` on every change too, as `on_change`; returns the call that stops."""
        with self._lock:
            self._listeners.append(fn)

        def stop() -> None:
            with self._lock:
                if fn in self._listeners:
                    self._listeners.remove(fn)

        return stop

    def _notify(self, job: DownloadJob) -> None:
        with self._lock:
            listeners = [f for f in (self.on_change, *self._listeners) if f is not None]
        if listeners:
            snapshot = self.get(job.id) or job.copy()
        for fn in listeners:
            try:
                fn(snapshot)
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
                    t = threading.Thread(
                        target=self._run,
                        args=(job, stop),
                        name=f"download:{job.filename}",
                        daemon=True,
                    )
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
            transfer = VerifiedTransfer(
                self.hub,
                self._remote_blob(job),
                _JobReport(self, job),
                stop,
                self.transfer_settings,
            )
            if transfer.run():
                self._install(job)
        except HubError as e:
            self._fail(job, str(e))
        except OSError as e:
            if e.errno == errno.ENOSPC:
                self._fail(
                    job,
                    f"the disk is full while downloading {job.filename}: free some "
                    "space, then resume (the bytes so far are kept)",
                )
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
                            job.note = INTERRUPTED_NOTE
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
        details = self.hub.repo_details(
            job.repo_id, revision=job.commit or job.revision, with_fit=False
        )
        for v in details.variants:
            for f in v.files:
                if f.filename == job.filename:
                    with self._lock:
                        job.sha256, job.size, job.commit = f.sha256, f.size, details.commit
                        job.blob_id = f.blob_id
                    return
        raise HubNotFound(
            f"{job.filename} is not a GGUF file in {job.repo_id} "
            "(see `candlewick models files` for the list)"
        )

    def _remote_blob(self, job: DownloadJob) -> RemoteBlob:
        blob = job.blob
        if blob is None or job.size is None:
            raise DownloadError(f"the Hub gives no hash for {job.filename}: it cannot be verified")
        cache = self.cache_dir
        return RemoteBlob(
            repo_id=job.repo_id,
            filename=job.filename,
            revision=job.commit or job.revision,
            size=job.size,
            digest=blob,
            git_sha1=job.sha256 is None,
            part=incomplete_blob_path(cache, job.repo_id, blob),
            final=blob_path(cache, job.repo_id, blob),
        )

    def _check_space(self, job: DownloadJob, need: int) -> None:
        target = repo_folder(self.cache_dir, job.repo_id)
        with self._lock:  # downloads already running will take their share of the space too
            reserved = sum(
                max(0, (j.size or 0) - j.done_bytes)
                for j in self._jobs.values()
                if j.id in self._threads and j.id != job.id
            )
        free = max(0, self.free_space(target) - reserved)
        if need + DISK_MARGIN > free:
            raise DiskFull(
                f"not enough disk space for {job.filename}: it needs {human_bytes(need)} more, "
                f"{human_bytes(free)} free in {self.cache_dir} — free some space or set HF_HOME "
                "to a bigger disk"
            )

    def _install(self, job: DownloadJob) -> None:
        """Link the verified blob into its snapshot folder, like huggingface_hub does."""
        blob = job.blob
        assert blob is not None
        link = link_into_snapshot(
            self.cache_dir, job.repo_id, blob, job.commit or job.revision, job.filename
        )
        if job.commit and job.revision != job.commit:
            write_ref(self.cache_dir, job.repo_id, job.revision, job.commit)
        with self._lock:
            job.status, job.path, job.done_bytes, job.error = DONE, str(link), job.size or 0, None
            job.speed_bps = 0.0


class _JobReport:
    """A transfer's reports written into its job, under the manager's lock, and announced."""

    def __init__(self, manager: DownloadManager, job: DownloadJob) -> None:
        self._manager = manager
        self._job = job

    def verifying(self) -> None:
        with self._manager._lock:
            self._job.status, self._job.speed_bps = VERIFYING, 0.0
        self._manager._notify(self._job)

    def replaced_corrupt_copy(self) -> None:
        with self._manager._lock:
            self._job.status = DOWNLOADING
            self._job.note = "replaced a corrupt copy found in the Hugging Face cache"

    def reserve_space(self, more_bytes: int) -> None:
        self._manager._check_space(self._job, more_bytes)

    def progress(self, done_bytes: int, speed_bps: float) -> None:
        with self._manager._lock:
            self._job.done_bytes, self._job.speed_bps = done_bytes, speed_bps
        self._manager._notify(self._job)

    def stream_ended(self, done_bytes: int) -> None:
        with self._manager._lock:
            self._job.done_bytes = done_bytes


__all__ = ["DiskFull", "DownloadManager"]
