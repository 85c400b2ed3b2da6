"""One file from the Hub into the cache, verified before it is used.

Bytes go to the blob's `.incomplete` part file and are hashed while they arrive; a dropped
connection resumes with an HTTP Range request from the last byte on disk, including one left
by an earlier run. The part file is renamed into place only when its hash equals the Hub's:
huggingface_hub does not check that itself, and a file whose bytes differ is deleted.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx2

from app.services.blob_hash import BackgroundHasher, Hasher, resume_hasher
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


class DownloadError(HubError):
    """A download failed; `str()` is a one-line message for the user."""


class ChecksumMismatch(DownloadError):
    pass


@dataclass(frozen=True)
class TransferSettings:
    chunk_size: int = 1 << 20
    max_retries: int = 5  # failed attempts in a row without a byte gained
    retry_delay: float = 0.5  # seconds, times the failures in a row
    read_timeout: float = 20.0
    progress_interval: float = 0.2  # seconds between progress reports


@dataclass(frozen=True)
class RemoteBlob:
    """A file of a repository as the Hub lists it, and where its bytes go."""

    repo_id: str
    filename: str
    revision: str  # the commit (or branch) the URL names
    size: int
    digest: str  # the hex hash the bytes must have
    git_sha1: bool  # `digest` is a git blob SHA-1 (a small non-LFS file), not a SHA-256
    part: Path  # where bytes gather while they arrive
    final: Path  # where the verified bytes live

    @property
    def label(self) -> str:
        return f"{self.repo_id}/{self.filename}"


class TransferObserver(Protocol):
    """What a transfer reports while it runs (on its own thread)."""

    def verifying(self) -> None:
        """The bytes are all there (or a copy was found): hashing them now."""

    def replaced_corrupt_copy(self) -> None:
        """A blob already in the cache failed its hash and was deleted; downloading anew."""

    def reserve_space(self, more_bytes: int) -> None:
        """Raise a `DownloadError` when the disk cannot take `more_bytes` more."""

    def progress(self, done_bytes: int, speed_bps: float) -> None:
        """Bytes on disk so far and the smoothed speed; at most every `progress_interval`."""

    def stream_ended(self, done_bytes: int) -> None:
        """A response ended (every byte, or stopped): the bytes on disk now."""


class VerifiedTransfer:
    """Fetches one blob into its part file and renames it into place once its hash matches.

    `run` works on the caller's thread; `stop`, set from any thread, ends it between chunks
    and keeps the bytes so far for a later resume.
    """

    def __init__(
        self,
        hub: HubClient,
        blob: RemoteBlob,
        observer: TransferObserver,
        stop: threading.Event,
        settings: TransferSettings,
    ) -> None:
        self.hub = hub
        self.blob = blob
        self.observer = observer
        self.stop = stop
        self.settings = settings
        # Every byte written to the part file is in the hasher, even when a stream fails.
        self._have = 0
        self._hasher = self._hasher_after(0)
        self._speed_bps = 0.0

    def _hasher_after(self, have: int) -> Hasher:
        return resume_hasher(self.blob.part, have, git_sha1=self.blob.git_sha1, size=self.blob.size)

    def run(self) -> bool:
        """Download and verify; False when stopped before the last byte."""
        blob = self.blob
        if blob.final.exists():
            # Another tool (or an earlier run) placed this blob. huggingface_hub files bytes
            # under the advertised hash without checking them, so check before trusting it.
            self.observer.verifying()
            found = resume_hasher(
                blob.final, blob.final.stat().st_size, git_sha1=blob.git_sha1, size=blob.size
            )
            if found.hexdigest() == blob.digest:
                return True
            blob.final.unlink()
            self.observer.replaced_corrupt_copy()
        blob.part.parent.mkdir(parents=True, exist_ok=True)
        have = blob.part.stat().st_size if blob.part.exists() else 0
        if have > blob.size:
            blob.part.unlink()
            have = 0
        self.observer.reserve_space(blob.size - have)
        self._have, self._hasher = have, self._hasher_after(have)
        if not self._fetch():
            return False
        self.observer.verifying()
        got = self._hasher.hexdigest()
        if got != blob.digest:
            blob.part.unlink()
            raise ChecksumMismatch(
                f"{blob.filename} from {blob.repo_id} is corrupt: its SHA-256 is {got[:16]}… "
                f"but the Hub lists {blob.digest[:16]}…; the file was deleted and is not in "
                "the library — download it again"
            )
        blob.part.replace(blob.final)
        return True

    def _fetch(self) -> bool:
        """Requests until every byte is on disk, resuming after drops; False when stopped."""
        blob, settings = self.blob, self.settings
        url = self.hub.file_url(blob.repo_id, blob.filename, blob.revision)
        failures = 0
        timeout = httpx2.Timeout(settings.read_timeout, connect=10.0)
        with httpx2.Client(follow_redirects=True, timeout=timeout) as client:
            while self._have < blob.size:
                if self.stop.is_set():
                    return False
                headers = self.hub.headers()
                headers["Accept-Encoding"] = "identity"  # sizes and Range are about raw bytes
                if self._have:
                    headers["Range"] = f"bytes={self._have}-"
                before = self._have
                try:
                    self._stream(
                        client,
                        url,
                        headers,
                        had_token="authorization" in {k.lower() for k in headers},
                    )
                except (httpx2.TransportError, httpx2.StreamError) as e:
                    # Every byte written was hashed, so carry on from what is on disk.
                    failures = 0 if self._have > before else failures + 1
                    if failures > settings.max_retries:
                        raise HubOffline(
                            f"the connection to the Hub keeps failing ({type(e).__name__}); "
                            f"{human_bytes(self._have)} of {blob.filename} kept — resume later"
                        ) from None
                    log.info(
                        "download %s interrupted at %d bytes (%s); resuming",
                        blob.label,
                        self._have,
                        e,
                    )
                    self.stop.wait(settings.retry_delay * failures)
                    continue
                if self.stop.is_set() and self._have < blob.size:
                    return False
        return True

    def _stream(
        self, client: httpx2.Client, url: str, headers: dict[str, str], *, had_token: bool
    ) -> None:
        blob = self.blob
        with client.stream("GET", url, headers=headers) as r:
            if r.status_code in (401, 403):
                raise HubAccessError(
                    gated_message(blob.repo_id, self.hub.endpoint, had_token=had_token)
                )
            if r.status_code == 404:
                raise HubNotFound(f"{blob.filename} is no longer in {blob.repo_id} on the Hub")
            if r.status_code == 416 or (r.status_code == 200 and self._have):
                # 416: our partial file does not fit the Hub's; 200: the server ignored the
                # Range header and sends everything again. Either way, start from zero.
                blob.part.unlink()
                self._have, self._hasher = 0, self._hasher_after(0)
                if r.status_code == 416:
                    return
            elif r.status_code not in (200, 206):
                raise DownloadError(f"the Hub answered HTTP {r.status_code} for {blob.filename}")
            hasher = BackgroundHasher(self._hasher)
            try:
                self._receive(r, hasher)
            finally:
                self._hasher = hasher.finish()  # every byte written is hashed, even on error
        self.observer.stream_ended(self._have)
        if self._have > blob.size:
            blob.part.unlink()
            raise DownloadError(
                f"the Hub sent more bytes than the {human_bytes(blob.size)} it "
                f"lists for {blob.filename}; the partial file was deleted"
            )

    def _receive(self, r: httpx2.Response, hasher: BackgroundHasher) -> None:
        interval = self.settings.progress_interval
        last_note = time.monotonic()
        window_start, window_bytes = last_note, 0
        with open(self.blob.part, "ab") as out:
            for chunk in r.iter_bytes(self.settings.chunk_size):
                out.write(chunk)
                hasher.update(chunk)
                self._have += len(chunk)
                window_bytes += len(chunk)
                now = time.monotonic()
                if now - last_note >= interval:
                    elapsed = now - window_start
                    if elapsed >= 0.5:
                        rate = window_bytes / elapsed
                        self._speed_bps = (
                            rate if not self._speed_bps else (0.5 * self._speed_bps + 0.5 * rate)
                        )
                        window_start, window_bytes = now, 0
                    last_note = now
                    self.observer.progress(self._have, self._speed_bps)
                if self.stop.is_set() or self._have > self.blob.size:
                    break


__all__ = [
    "ChecksumMismatch",
    "DownloadError",
    "RemoteBlob",
    "TransferObserver",
    "TransferSettings",
    "VerifiedTransfer",
]
