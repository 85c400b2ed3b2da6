"""A download's record (its file, hash, progress and status) and the JSON file that keeps the
list of downloads across restarts."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from app.services.atomic_write import write_text_atomic

QUEUED, DOWNLOADING, VERIFYING, PAUSED, FAILED, DONE = (
    "queued",
    "downloading",
    "verifying",
    "paused",
    "failed",
    "done",
)
ACTIVE = (QUEUED, DOWNLOADING, VERIFYING)
SETTLED = (PAUSED, FAILED, DONE)

# What reading a damaged or foreign state file raises.
UNREADABLE = (OSError, ValueError, TypeError, AttributeError)


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
    def blob(self) -> str | None:
        """The blob's name in the cache: its hash."""
        return self.sha256 or self.blob_id

    @property
    def eta_s(self) -> float | None:
        if self.status != DOWNLOADING or not self.size or self.speed_bps <= 0:
            return None
        return max(0.0, (self.size - self.done_bytes) / self.speed_bps)

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.size if self.size else 0.0

    def copy(self) -> DownloadJob:
        return DownloadJob.from_dict(asdict(self))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["id"] = self.id
        d["eta_s"] = self.eta_s
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DownloadJob:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def read_jobs(state_file: Path) -> list[DownloadJob]:
    """The jobs saved in `state_file`; raises one of `UNREADABLE` when it cannot be read."""
    data = json.loads(state_file.read_text("utf-8"))
    return [DownloadJob.from_dict(d) for d in data.get("jobs", [])]


def write_jobs(state_file: Path, jobs: Iterable[DownloadJob]) -> None:
    """Replace `state_file` with `jobs` (speeds and estimates are not saved: they are stale
    on the next start). The caller keeps to one writer at a time."""
    data = {
        "version": 1,
        "jobs": [
            {k: v for k, v in j.to_dict().items() if k not in ("speed_bps", "eta_s", "id")}
            for j in jobs
        ],
    }
    state_file.parent.mkdir(parents=True, exist_ok=True)
    # Whole or not at all: a full disk leaves the previous list and no partial file.
    write_text_atomic(state_file, json.dumps(data, indent=1))


def completed_downloads(state_file: Path) -> list[DownloadJob]:
    """Verified downloads recorded in a manager's state file whose file is still there."""
    try:
        jobs = read_jobs(state_file)
    except UNREADABLE:
        return []
    return [j for j in jobs if j.status == DONE and j.path and Path(j.path).exists()]


__all__ = [
    "ACTIVE",
    "DONE",
    "DOWNLOADING",
    "FAILED",
    "PAUSED",
    "QUEUED",
    "SETTLED",
    "UNREADABLE",
    "VERIFYING",
    "DownloadJob",
    "completed_downloads",
    "read_jobs",
    "write_jobs",
]
